"""Parse and check magic lines: every bad line becomes one short ``UsageError`` line."""

from __future__ import annotations

import argparse
import difflib
import keyword
import shlex
from collections.abc import Collection, Iterable
from typing import Any

from IPython.core.error import UsageError

MAX_MESSAGE = 200  # characters of user input echoed back in an error
MAX_LIMIT_MB = 10**7  # 10 TB: beyond any GPU, below TensorFlow's integer limits


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + "..."


def parse_line(magic: Any, line: str) -> argparse.Namespace:
    """Parse ``line`` with ``magic``'s ``@argument`` parser, shell-style (``--gpus ""`` is empty).

    IPython's own ``parse_argstring`` keeps quote characters (``'""'``) and raises a bare
    ``ValueError`` on an unbalanced quote; this raises ``UsageError`` for every bad line.
    """
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot read the magic line: {exc}") from None
    try:
        namespace: argparse.Namespace = magic.parser.parse_args(argv)
    except UsageError as exc:
        raise UsageError(_short(str(exc))) from None
    return namespace


def megabytes(text: str) -> int:
    """Return a ``--limit`` value: a whole number of megabytes from 1 to 10,000,000."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT_MB:
        msg = f"expected a whole number of megabytes from 1 to {MAX_LIMIT_MB}, got {text!r}"
        raise argparse.ArgumentTypeError(_short(msg))
    return value


def keep_names(raw: Iterable[str], known: Collection[str], assigned: Collection[str]) -> list[str]:
    """Split ``--keep a,b c`` into names; refuse non-names and names that exist nowhere.

    A name is accepted if the namespace has it (``known``) or the cell assigns it; anything
    else is a typo, refused with the closest namespace name, so no model is dropped by mistake.
    """
    names = [name for item in raw for name in item.split(",") if name]
    for name in names:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise UsageError(_short(f"--keep: {name!r} is not a Python name"))
        if name not in known and name not in assigned:
            raise UsageError(_short(f"--keep: no variable {name!r}{_did_you_mean(name, known)}"))
    return names


def _did_you_mean(name: str, known: Collection[str]) -> str:
    close = difflib.get_close_matches(name, [k for k in known if not k.startswith("_")], n=1)
    return f"; did you mean {close[0]!r}?" if close else " in the namespace"
