"""One state per shell: everything ``%load_ext kerasmagic`` added to a shell, in one object.

The extension (``_extension.py``) creates it, loads the parts into it in their declared order
and removes it on unload; every part finds what it needs here (the sidebar, the monitor it
shows) instead of in a registry of its own. Importing this module imports no part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ShellState:
    """What the extension holds for one shell: its magics, its loaded parts (in load order:
    the cells compiled for ``%%fresh_model`` are the ``cells`` part's) and the last cleanup's
    report."""

    shell: Any
    magics: Any
    parts: dict[str, Any] = field(default_factory=dict)
    last_report: Any = None  # the last cleanup's ``cleanup.CleanupReport`` (a layer above)

    def part(self, name: str) -> Any | None:
        """Return what the part called ``name`` keeps for this shell, or None if not loaded."""
        return self.parts.get(name)


STATES: dict[int, ShellState] = {}  # id(shell) -> its state: the one registry by shell


def state_of(shell: Any) -> ShellState | None:
    """Return the state of ``shell`` while the extension is loaded there, else None."""
    state = STATES.get(id(shell))
    return state if state is not None and state.shell is shell else None


def current() -> ShellState | None:
    """Return the state of the running IPython shell, if the extension is loaded there."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = None if ipython is None else ipython.get_ipython()
    return None if shell is None else state_of(shell)
