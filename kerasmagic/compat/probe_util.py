"""What the probes of ``compat/registry.py`` share: reading a module, an attribute, the names a
function's code sets, a signature, each as "None, or what differs"."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any


def module(name: str) -> Any:
    return sys.modules[name]


def sets(function: Any, *names: str) -> str | None:
    """Return None if ``function``'s code (unwrapped) names every one of ``names``."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    found = set(code.co_names) if code is not None else set()
    missing = [n for n in names if n not in found]
    return None if not missing else f"no longer sets {', '.join(missing)}"


def has(obj: Any, path: str, *names: str, call: bool = False) -> str | None:
    """Return None if ``obj`` has every attribute in ``names`` (callable, with ``call``)."""
    for name in names:
        value = getattr(obj, name, None)
        if value is None or (call and not callable(value)):
            return f"moved {path}.{name}"
    return None


def params(function: Any, path: str, *names: str) -> str | None:
    try:
        found = set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return f"changed {path}'s signature"
    missing = [n for n in names if n not in found]
    return None if not missing else f"changed {path}'s arguments (no {', '.join(missing)})"


def first(*checks: Callable[[], str | None]) -> str | None:
    """Return the first check's finding that is not None (each runs only if the ones before
    passed, so a later one may rely on what an earlier one found)."""
    for check in checks:
        found = check()
        if found is not None:
            return found
    return None
