"""Live memory monitor: per-cell records, a background peak sampler, the leak detector.

``%load_ext kerasmagic`` gives each shell one ``LiveMonitor`` (``monitor.py``) fed by IPython's
cell events; ``sampler.py`` samples while cells run, ``leak.py`` judges re-runs (``advice.py``
words the remedy) and ``record.py`` is the per-cell record everyone reads.
"""

from __future__ import annotations

import logging
from typing import Any

from kerasmagic.live.leak import LeakVerdict
from kerasmagic.live.monitor import LiveMonitor
from kerasmagic.live.record import CellRecord, source_hash
from kerasmagic.snapshot import MemorySnapshot

log = logging.getLogger(__name__)

_monitors: dict[int, LiveMonitor] = {}


def get_monitor(shell: Any) -> LiveMonitor | None:
    """Return the live monitor of ``shell``, or None if the extension is not loaded there."""
    return _monitors.get(id(shell))


def history() -> list[CellRecord]:
    """Return the current shell's per-cell memory history (empty if the extension is off)."""
    from IPython.core.getipython import get_ipython

    monitor = get_monitor(get_ipython())
    return monitor.history() if monitor is not None else []


def load(shell: Any, magics: Any) -> None:
    """Create the shell's monitor, register its hooks and start its sampler."""
    if id(shell) in _monitors:
        return
    monitor = LiveMonitor(shell, parent=magics)
    _monitors[id(shell)] = monitor
    shell.events.register("pre_run_cell", monitor.pre_run_cell)
    shell.events.register("post_run_cell", monitor.post_run_cell)
    monitor.start()


def unload(shell: Any) -> None:
    """Unregister the hooks and stop the sampler thread."""
    monitor = _monitors.pop(id(shell), None)
    if monitor is None:
        return
    for event, fn in (
        ("pre_run_cell", monitor.pre_run_cell),
        ("post_run_cell", monitor.post_run_cell),
    ):
        try:
            shell.events.unregister(event, fn)
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
