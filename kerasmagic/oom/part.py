"""After a cell that ran out of device memory: say why, and what frees it (a loaded part).

The block comes after the traceback (IPython shows that first) and never replaces it. The part
loads before the live monitor, so its hook runs first; the monitor's record of the same cell
takes the facts from ``Explainer.facts`` (the sidebar and the cell's badge show them).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kerasmagic.oom.detect import OomError, find_oom
from kerasmagic.oom.facts import Figures, OomFacts
from kerasmagic.shellstate import ShellState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OomReport:
    """An out-of-memory error explained: the printed block and the record's facts."""

    text: str
    facts: OomFacts


def report(shell: Any, error: BaseException | None) -> OomReport | None:
    """Return the explanation of ``error`` if it is an out-of-memory error, else None."""
    oom = find_oom(error)
    if oom is None:
        return None
    from kerasmagic.oom.explain import explain

    outcome = getattr(error, "outcome", None)
    if outcome is not None and getattr(outcome, "error_type", None) is not None:
        said = getattr(outcome, "oom", None)  # the child's figures, read as it failed
        figures = Figures.from_dict(said) if isinstance(said, dict) else Figures(oom.device)
        text, facts = explain(oom, figures, (), isolated_pid=outcome.pid)
        return OomReport(text, facts)
    from kerasmagic.cleanup.holders import live_models
    from kerasmagic.oom.facts import read_figures
    from kerasmagic.snapshot import take_snapshot

    ns = shell.user_ns
    snap = take_snapshot(ns, functions=False)
    rss, total = snap.ram.rss_bytes, snap.ram.total_bytes
    figures = read_figures(oom, snap.backends, snap.gpu.devices, total, rss)
    text, facts = explain(oom, figures, live_models(ns))
    return OomReport(text, facts)


class Explainer:
    """Explains each cell's out-of-memory error once, for the printed block and the record.

    It keeps the report of the latest cell only, with a weak reference to IPython's result
    object (never the error itself: its frames hold what ran out of memory).
    """

    def __init__(self, shell: Any) -> None:
        self._shell = shell
        self._last: tuple[Callable[[], Any], OomReport | None] = (lambda: None, None)

    def explain(self, result: Any) -> OomReport | None:
        """Return the report of the cell whose ``result`` this is (None: no OOM)."""
        if result is None:
            return None
        if self._last[0]() is result:
            return self._last[1]
        found = None
        error = getattr(result, "error_in_exec", None)
        if error is not None:
            try:
                found = report(self._shell, error)
            except Exception:  # the user's traceback is already shown; ours must never add one
                log.warning("kerasmagic: could not explain the out-of-memory error", exc_info=True)
        try:
            self._last = (weakref.ref(result), found)
        except TypeError:  # a result that takes no weak reference: explained again if asked
            self._last = (lambda: None, found)
        return found

    def facts(self, result: Any) -> OomFacts | None:
        """Return the record's facts of the cell whose ``result`` this is (None: no OOM)."""
        found = self.explain(result)
        return None if found is None else found.facts

    def after(self, result: Any) -> None:
        """Print the block after an out-of-memory error (``post_run_cell``)."""
        found = self.explain(result)
        if found is not None:
            print(found.text)


def load(state: ShellState) -> Explainer:
    """Register the post-cell hook that explains an out-of-memory error."""
    explainer = Explainer(state.shell)
    state.shell.events.register("post_run_cell", explainer.after)
    return explainer


def unload(state: ShellState, explainer: Explainer) -> None:
    """Remove the hook."""
    state.shell.events.unregister("post_run_cell", explainer.after)


__all__ = ["Explainer", "OomError", "OomFacts", "OomReport", "find_oom", "load", "report", "unload"]
