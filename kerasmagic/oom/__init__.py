"""After a cell that ran out of device memory: say why, and what frees it (a loaded part).

The block comes after the traceback (IPython shows that first) and never replaces it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kerasmagic.oom.detect import OomError, find_oom
from kerasmagic.shellstate import ShellState

log = logging.getLogger(__name__)


def report(shell: Any, error: BaseException | None) -> str | None:
    """Return the explanation of ``error`` if it is an out-of-memory error, else None."""
    oom = find_oom(error)
    if oom is None:
        return None
    from kerasmagic.cleanup.holders import live_models
    from kerasmagic.oom.explain import explain
    from kerasmagic.snapshot import take_snapshot

    ns = shell.user_ns
    return explain(oom, take_snapshot(ns, functions=False), live_models(ns))


def load(state: ShellState) -> Callable[[Any], None]:
    """Register the post-cell hook that explains an out-of-memory error."""
    shell = state.shell

    def after(result: Any) -> None:
        error = getattr(result, "error_in_exec", None)
        if error is None:
            return
        try:
            text = report(shell, error)
        except Exception:  # the user's traceback is already shown; ours must never add one
            log.warning("kerasmagic: could not explain the out-of-memory error", exc_info=True)
            return
        if text is not None:
            print(text)

    shell.events.register("post_run_cell", after)
    return after


def unload(state: ShellState, after: Callable[[Any], None]) -> None:
    """Remove the hook."""
    state.shell.events.unregister("post_run_cell", after)


__all__ = ["OomError", "find_oom", "load", "report", "unload"]
