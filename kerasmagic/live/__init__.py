"""Live memory monitor: per-cell records, a background peak sampler, the leak detector.

``%load_ext kerasmagic`` gives each shell one ``LiveMonitor`` (``monitor.py``, with its
``Sampler`` thread) fed by IPython's cell events; ``leak.py`` holds the per-cell ``CellRecord``
everyone reads and judges re-runs (``LeakDetector``), wording the remedy.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from kerasmagic.live.leak import CellRecord, LeakVerdict, source_hash
from kerasmagic.live.monitor import LiveMonitor, Records
from kerasmagic.shellstate import ShellState, state_of
from kerasmagic.snapshot import MemorySnapshot

log = logging.getLogger(__name__)
# Each shell's records at its last unload: a reload in the same kernel goes on from them (the
# sidebar's chart, the widget, the leak detector), as the kernel's own cells do.
_kept: weakref.WeakKeyDictionary[Any, Records] = weakref.WeakKeyDictionary()


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
    kept = _kept.pop(shell, None) if _weakable(shell) else None
    count = getattr(shell, "execution_count", None)
    if kept and kept[0] and isinstance(count, int) and kept[0][-1].execution_count < count:
        monitor.resume(kept)  # the same run of cells: a count that went back is another
    shell.events.register("pre_run_cell", monitor.pre_run_cell)
    shell.events.register("post_run_cell", monitor.post_run_cell)
    monitor.start()
    return monitor


def unload(state: ShellState, monitor: LiveMonitor) -> None:
    """Unregister the hooks, stop the sampler thread and keep the records for a reload."""
    if _weakable(state.shell):
        _kept[state.shell] = monitor.records()
    for event, fn in (
        ("pre_run_cell", monitor.pre_run_cell),
        ("post_run_cell", monitor.post_run_cell),
    ):
        try:
            state.shell.events.unregister(event, fn)
        except ValueError:
            log.debug("kerasmagic: %s hook already removed", event)
    monitor.stop()


def _weakable(shell: Any) -> bool:
    try:
        weakref.ref(shell)
    except TypeError:  # a shell of no class of its own: each load starts afresh
        return False
    return True


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
