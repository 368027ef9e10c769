"""The namespace's names: the user's own, and IPython's (``Out``, ``_7``, ``_i3``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_NOT_USER = re.compile(r"^(_|__|___|_\d+|_i+|_i\d+|_ih|_oh|_dh|In|Out|exit|quit|get_ipython)$")
_INPUT = re.compile(r"^_i+$|^_i\d+$")  # IPython's copies of cell sources: never model state
IPYTHON_PLAIN = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
SKIP = frozenset({"_oh", "_ih", "In", "_dh", "__builtins__", "__builtin__"})  # aliases, no state


def is_user_name(name: Any) -> bool:
    """Return False for IPython's own names (``Out``, ``_7``, ``_i3``), dunders and non-strings."""
    if type(name) is not str:
        return False
    return not (_NOT_USER.match(name) or (name.startswith("__") and name.endswith("__")))


def scan_order(namespace: Mapping[str, Any]) -> list[str]:
    """Return the names worth scanning, the user's own first (so paths read ``model``)."""
    user: list[str] = []
    ipython: list[str] = []
    for name in list(namespace):
        if type(name) is not str:
            continue  # globals()[1] = ...: not a name a cell can use
        if name[:1] != "_" and name not in SKIP and name not in IPYTHON_PLAIN:
            user.append(name)  # fast path: most user names start with a letter
        elif name[:2] == "_i" and (name[2:].isdigit() or _INPUT.match(name)):
            continue  # _i/_ii/_i12: IPython's copies of the input, one more per cell
        elif name not in SKIP:
            (user if is_user_name(name) else ipython).append(name)
    return user + ipython
