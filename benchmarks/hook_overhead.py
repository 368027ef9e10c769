"""Per-cell cost of the live monitor, and its sampler's CPU use, in one process.

Runs N trivial cells in an in-process IPython shell whose namespace holds ~1M live objects
(and, with ``--keras``, Keras models): without the extension, with only the live monitor, with
every part, and with every part while the live widget is shown and a sidebar comm is open
(each comm message serialised to JSON, as a kernel does before sending it); reports the median
time per cell of each, the differences, and the sampler thread's CPU share while idle and while
a cell runs.
Writes JSON to ``benchmarks/results/hook_overhead.json``.

IPython's history thread writes each cell's input to SQLite holding the lock that the next
cell's ``HistoryManager.store_inputs`` takes, and it runs as soon as the main thread lets the
GIL go: any ``post_run_cell`` hook that reads a file (``/proc/self/statm``) or waits on a thread
lets it start a commit that the next cell, run at once, waits for (a hook doing only
``time.sleep(0)`` adds ~5 ms a cell this way; without hooks the thread only runs every
switch interval, 5 ms, and commits ~40 cells at once). A kernel has idle time between cells
for that commit. So by default the history writes are held back while cells are timed, in
every set-up alike, and the figures are kerasmagic's own; ``--history-writes`` keeps IPython's
default (one commit per cell) to see what a back-to-back in-process loop pays.

    python benchmarks/hook_overhead.py [--cells 1000] [--keras] [--history-writes]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import comm
import psutil
from comm.base_comm import BaseComm, CommManager
from IPython.core.interactiveshell import InteractiveShell

from kerasmagic import _extension

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
RESULTS = Path(__file__).parent / "results"
NAMESPACE = """
objects = [[i] for i in range(1_000_000)]         # 1M live (gc-tracked) objects
lookup = {i: str(i) for i in range(100_000)}      # a big dict (the probe must not copy it)
"""
LIVE_ONLY = (("live", "kerasmagic.live"),)  # (part name, module), as _extension.PARTS
KERAS = """
import keras, numpy as np
models = [keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)]) for _ in range(3)]
"""


class WireComm(BaseComm):  # type: ignore[misc]
    """A comm that serialises what it would send, as a kernel does, and drops it."""

    sent = 0
    timed = 0  # sent while timed cells ran (not while loading, opening or warming up)

    def publish_msg(self, msg_type: str, data: Any = None, **keys: Any) -> None:
        json.dumps({"msg_type": msg_type, "data": data, "metadata": keys.get("metadata")})
        WireComm.sent += 1


def use_wire_comms() -> None:
    """Make every comm (the widget's, the sidebar's) a ``WireComm`` of one fresh manager."""
    manager = CommManager()
    comm.get_comm_manager = lambda: manager
    comm.create_comm = lambda **kwargs: WireComm(**kwargs)


def show_widget_and_sidebar(shell: InteractiveShell) -> None:
    """Display the live widget and open a sidebar comm, as a notebook with both does."""
    from kerasmagic.live import get_monitor
    from kerasmagic.views.comm import TARGET
    from kerasmagic.views.protocol import PROTOCOL
    from kerasmagic.views.widget import LiveWidget

    monitor = get_monitor(shell)
    assert monitor is not None
    monitor.attach("widget", LiveWidget(monitor))  # what ``%gpu_mem --live`` shows in a kernel
    content = {
        "comm_id": "sidebar",
        "target_name": TARGET,
        "data": {"protocol": PROTOCOL, "type": "hello"},
    }
    sent = WireComm.sent
    comm.get_comm_manager().comm_open(None, "", {"content": content})
    # The full state answers a hello; a refused one (an old protocol number) answers an error
    # and a close, and the cells would be timed without a sidebar.
    assert "sidebar" in comm.get_comm_manager().comms and WireComm.sent > sent


def time_cells(shell: InteractiveShell, cells: int) -> list[float]:
    """Return the wall time of each of ``cells`` trivial cells, in seconds."""
    times = []
    for i in range(cells):
        start = time.perf_counter()
        shell.run_cell(f"t = {i}", store_history=True)
        times.append(time.perf_counter() - start)
    return times


def thread_cpu_s(native_id: int | None) -> float:
    """Return the CPU seconds used so far by the thread with this OS id."""
    for thread in psutil.Process().threads():
        if thread.id == native_id:
            return float(thread.user_time + thread.system_time)
    return 0.0


def sampler_share(shell: InteractiveShell, seconds: float, busy: bool) -> float:
    """Return the sampler's CPU use as a share of one core over ``seconds``."""
    from kerasmagic.live import get_monitor

    monitor = get_monitor(shell)
    assert monitor is not None
    native_id = monitor.sampler.native_id
    before, start = thread_cpu_s(native_id), time.perf_counter()
    if busy:
        shell.run_cell(f"import time; time.sleep({seconds})")
    else:
        time.sleep(seconds)
    return (thread_cpu_s(native_id) - before) / (time.perf_counter() - start)


def cells_with_parts(
    shell: InteractiveShell, cells: int, parts: tuple[tuple[str, str], ...], shown: bool = False
) -> list[float]:
    """Return each cell's time with the extension loaded with only ``parts`` (``shown``: the
    live widget displayed and a sidebar open too)."""
    saved = _extension.PARTS
    _extension.PARTS = parts
    try:
        shell.run_line_magic("load_ext", "kerasmagic")
        if shown:
            show_widget_and_sidebar(shell)
        for _ in range(20):  # let the first snapshot and the sampler's start settle
            shell.run_cell("pass", store_history=True)
        sent = WireComm.sent
        times = time_cells(shell, cells)
        if shown:
            WireComm.timed += WireComm.sent - sent
        shell.run_line_magic("unload_ext", "kerasmagic")
    finally:
        _extension.PARTS = saved
    return times


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--keras", action="store_true", help="also import Keras, hold 3 models")
    parser.add_argument("--sampler-s", type=float, default=10.0)
    parser.add_argument(
        "--history-writes",
        action="store_true",
        help="let IPython's history thread commit every cell's input while cells are timed",
    )
    args = parser.parse_args()
    use_wire_comms()
    shell = InteractiveShell.instance()
    shell.run_cell(NAMESPACE + (KERAS if args.keras else ""))
    history = shell.history_manager
    assert history is not None
    if not args.history_writes:
        history.db_cache_size = 10 * args.cells + 100  # written after the timing, at once
    # Interleave the three set-ups in rounds: IPython's own per-cell cost drifts as its history
    # grows, and measuring one set-up after another would charge that drift to the later ones.
    rounds, times = 10, {"without": [], "live": [], "all": [], "shown": []}
    for _ in range(rounds):
        times["without"] += time_cells(shell, args.cells // rounds)
        times["live"] += cells_with_parts(shell, args.cells // rounds, LIVE_ONLY)
        times["all"] += cells_with_parts(shell, args.cells // rounds, _extension.PARTS)
        times["shown"] += cells_with_parts(shell, args.cells // rounds, _extension.PARTS, True)
    without, with_live, with_all, shown = (
        statistics.median(times[k]) for k in ("without", "live", "all", "shown")
    )
    shell.run_line_magic("load_ext", "kerasmagic")
    result = {
        "cells": args.cells,
        "keras_models_in_namespace": args.keras,
        "history_written_per_cell": args.history_writes,
        "parts_loaded": [name for name, _ in _extension.PARTS],
        "median_without_ms": without * 1e3,
        "median_with_live_monitor_only_ms": with_live * 1e3,
        "median_with_all_parts_ms": with_all * 1e3,
        "live_monitor_added_ms": (with_live - without) * 1e3,
        "all_parts_added_ms": (with_all - without) * 1e3,
        "median_with_widget_and_sidebar_ms": shown * 1e3,
        "widget_and_sidebar_added_ms": (shown - without) * 1e3,
        "comm_messages_per_cell": WireComm.timed / len(times["shown"]),
        "sampler_cpu_idle_pct": 100 * sampler_share(shell, args.sampler_s, busy=False),
        "sampler_cpu_busy_pct": 100 * sampler_share(shell, args.sampler_s, busy=True),
        "gc_objects": len(gc.get_objects()),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
    }
    shell.run_line_magic("unload_ext", "kerasmagic")
    history.db_cache_size = 0
    history.writeout_cache()
    RESULTS.mkdir(exist_ok=True)
    name = "hook_overhead_keras.json" if args.keras else "hook_overhead.json"
    (RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
