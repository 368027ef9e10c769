"""After a cell that ran out of device memory: say why, and what frees it (a loaded part).

The block comes after the traceback (IPython shows that first) and never replaces it.
"""

from __future__ import annotations

import logging
from typing import Any

from kerasmagic.oom.detect import OomError, find_oom

log = logging.getLogger(__name__)
_hooks: dict[int, Any] = {}


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


def load(shell: Any, magics: Any) -> None:
    """Register the post-cell hook that explains an out-of-memory error."""
    if id(shell) in _hooks:
        return

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

    _hooks[id(shell)] = after
    shell.events.register("post_run_cell", after)


def unload(shell: Any) -> None:
    """Remove the hook."""
    after = _hooks.pop(id(shell), None)
    if after is not None:
        shell.events.unregister("post_run_cell", after)


__all__ = ["OomError", "find_oom", "load", "report", "unload"]
