"""The fault-and-fuzz suite's counts, added to by every fault test and printed once at the end.

What was tried (bad inputs, interrupts, cells among hostile objects,
load/unload cycles, isolation faults)
and what went wrong (raw tracebacks, swallowed interrupts, user values lost, processes left
behind). Each test asserts its own share of the second kind is 0; ``conftest`` prints the whole
table after the run (``pytest_terminal_summary``), so one line says what the suite covered.
"""

from __future__ import annotations

TRIED = (
    "bad inputs",
    "interrupts sent",
    "cells among hostile objects",
    "load/unload cycles",
    "isolation faults",
)
FAILED = ("raw tracebacks", "swallowed interrupts", "user values lost", "processes left behind")
COUNTS: dict[str, int] = dict.fromkeys(TRIED + FAILED, 0)


def add(name: str, count: int = 1) -> None:
    """Add ``count`` to one of the suite's figures (a typo fails the test)."""
    if name not in COUNTS:
        raise KeyError(f"not a fault-suite figure: {name!r}")
    COUNTS[name] += count


def summary() -> str | None:
    """Return the suite's line, or None if no fault test ran."""
    if not any(COUNTS[name] for name in TRIED):
        return None
    tried = ", ".join(f"{name} {COUNTS[name]}" for name in TRIED)
    failed = ", ".join(f"{name} {COUNTS[name]}" for name in FAILED)
    return f"tried: {tried}\nfound: {failed}"
