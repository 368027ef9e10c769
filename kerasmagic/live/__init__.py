"""Live memory monitor: per-cell records, a background peak sampler, the leak detector.

``%load_ext kerasmagic`` gives each shell one ``LiveMonitor`` (``monitor.py``, with its
``Sampler`` thread) fed by IPython's cell events; ``leak.py`` holds the per-cell ``CellRecord``
everyone reads and judges re-runs (``LeakDetector``), wording the remedy.
"""

from __future__ import annotations

import logging
from typing import Any

from kerasmagic.live.leak import CellRecord, LeakVerdict, source_hash
from kerasmagic.live.monitor import LiveMonitor
from kerasmagic.shellstate import ShellState, state_of
from kerasmagic.snapshot import MemorySnapshot

log = logging.getLogger(__name__)


def get_monitor(shell: Any) -> LiveMonitor | None:
    """Return the live monitor of ``shell``, or None if the extension is not loaded there."""
    state = state_of(shell)
    monitor = None if state is None else state.part("live")
    return monitor if isinstance(monitor, LiveMonitor) else None


def history() -> list[CellRecord]:
    """Return the current shell's per-cell memory history (empty if the extension is off)."""
    from IPython.core.getipython import get_ipython

    monitor = get_monitor(get_ipython())
    return monitor.history() if monitor is not None else []


def load(state: ShellState) -> LiveMonitor:
    """Create the shell's monitor, register its hooks and start its sampler."""
    shell = state.shell
    explainer = state.part("oom")  # loaded before: its facts go into each cell's record
    oom = getattr(explainer, "facts", None)
    monitor = LiveMonitor(shell, oom=oom, parent=state.magics)
    shell.events.register("pre_run_cell", monitor.pre_run_cell)
    shell.events.register("post_run_cell", monitor.post_run_cell)
    monitor.start()
    return monitor


def unload(state: ShellState, monitor: LiveMonitor) -> None:
    """Unregister the hooks and stop the sampler thread."""
    for event, fn in (
        ("pre_run_cell", monitor.pre_run_cell),
        ("post_run_cell", monitor.post_run_cell),
    ):
        try:
            state.shell.events.unregister(event, fn)
        except ValueError:
            log.debug("kerasmagic: %s hook already removed", event)
    monitor.stop()


__all__ = [
    "CellRecord",
    "LeakVerdict",
    "LiveMonitor",
    "MemorySnapshot",
    "get_monitor",
    "history",
    "load",
    "source_hash",
    "unload",
]
