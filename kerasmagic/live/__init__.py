"""Live memory monitor: per-cell records, a background peak sampler, the leak detector.

``%load_ext kerasmagic`` gives each shell one ``LiveMonitor`` (``monitor.py``, with its
``Sampler`` thread) fed by IPython's cell events; ``leak.py`` holds the ``CellRecord`` and judges
re-runs (``LeakDetector``).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any

from kerasmagic.live.leak import CellRecord, LeakVerdict
from kerasmagic.live.monitor import LiveMonitor, Records
from kerasmagic.shellstate import ShellState, state_of

log = logging.getLogger(__name__)
# Each shell's records at its last unload: a reload in the same kernel goes on from them (the
# sidebar's chart, the widget, the leak detector), as the kernel's own cells do.
_kept: weakref.WeakKeyDictionary[Any, Records] = weakref.WeakKeyDictionary()
HOOKS = ("pre_run_cell", "post_run_cell")
__all__ = ["CellRecord", "LeakVerdict", "LiveMonitor", "get_monitor", "history", "load", "unload"]


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
    """Create the shell's monitor (its ``oom`` part, loaded before, gives each record its
    out-of-memory facts), go on from its records at the last unload, start it."""
    shell, kept = state.shell, None
    monitor = LiveMonitor(shell, oom=getattr(state.part("oom"), "facts", None), parent=state.magics)
    with contextlib.suppress(TypeError):  # a shell of no class of its own: each load starts afresh
        kept = _kept.pop(shell, None)
    count = getattr(shell, "execution_count", None)
    if kept and kept[0] and isinstance(count, int) and kept[0][-1].execution_count < count:
        monitor.resume(kept)  # the same run of cells: a count that went back is another
    for event in HOOKS:
        shell.events.register(event, getattr(monitor, event))
    monitor.sampler.start()
    return monitor


def unload(state: ShellState, monitor: LiveMonitor) -> None:
    """Unregister the hooks, stop the sampler thread and keep the records for a reload."""
    with contextlib.suppress(TypeError):  # not weakly referenceable: nothing kept
        _kept[state.shell] = monitor.records()
    for event in HOOKS:
        try:
            state.shell.events.unregister(event, getattr(monitor, event))
        except ValueError:
            log.debug("kerasmagic: %s hook already removed", event)
    monitor.stop()
