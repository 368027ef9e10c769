"""The between-cell hook, the peak sampler thread, subscribers, and clean unload."""

from __future__ import annotations

import gc
import json
import threading
import time
import weakref
from typing import Any

import pytest
from conftest import run
from IPython.core.interactiveshell import InteractiveShell

import kerasmagic
from kerasmagic.live import LiveMonitor, get_monitor

MB = 2**20


def monitor_of(shell: InteractiveShell) -> LiveMonitor:
    monitor = get_monitor(shell)
    assert monitor is not None
    return monitor


def test_one_record_per_cell_with_its_delta(ip: InteractiveShell) -> None:
    run(ip, "a = b'x' * (60 * 2**20)")
    run(ip, "n = 1")
    run(ip, "del a")
    records = kerasmagic.history()
    assert [r.execution_count for r in records] == [1, 2, 3]
    grow, same, free = (r.delta.rss_bytes for r in records)
    assert grow > 55 * MB and abs(same) < 5 * MB and free < -55 * MB
    assert records[0].end.ram.rss_bytes - records[0].start.ram.rss_bytes == grow
    assert all(r.duration_s >= 0 and r.peak_rss_bytes >= r.end.ram.rss_bytes for r in records)
    assert records[0].source_hash != records[1].source_hash
    assert json.loads(json.dumps(records[0].to_dict()))["delta"]["rss_bytes"] == grow


def test_same_source_same_hash(ip: InteractiveShell) -> None:
    run(ip, "z = 1")
    run(ip, "z = 1\n")
    first, second = monitor_of(ip).history()
    assert first.source_hash == second.source_hash


def test_history_is_bounded(ip: InteractiveShell) -> None:
    ip.config.LiveMonitor.history_size = 3
    try:
        ip.run_line_magic("unload_ext", "kerasmagic")
        ip.run_line_magic("load_ext", "kerasmagic")
        for i in range(5):
            run(ip, f"v = {i}")
        assert [r.execution_count for r in monitor_of(ip).history()] == [3, 4, 5]
    finally:
        del ip.config.LiveMonitor.history_size


def test_sampler_catches_a_peak_freed_before_the_cell_ends(ip: InteractiveShell) -> None:
    monitor = monitor_of(ip)
    monitor.sampler.interval_s = 0.05
    run(ip, "b = b'x' * (160 * 2**20); del b")  # raise the process's all-time peak first
    run(ip, "import time\nb = b'x' * (100 * 2**20)\ntime.sleep(0.4)\ndel b")
    record = monitor.history()[-1]
    assert record.start.ram.peak_rss_bytes == record.end.ram.peak_rss_bytes  # no new rusage high
    assert abs(record.delta.rss_bytes) < 10 * MB
    assert record.peak_rss_bytes - record.start.ram.rss_bytes > 90 * MB


def test_subscribers_get_samples_during_a_cell_and_one_cell_event(ip: InteractiveShell) -> None:
    monitor = monitor_of(ip)
    monitor.sampler.interval_s = 0.05
    time.sleep(0.6)  # let the thread finish the wait it began at the old 0.5 s interval
    events: list[tuple[str, str, Any]] = []

    def listen(kind: str, payload: Any) -> None:
        events.append((kind, threading.current_thread().name, payload))

    def broken(kind: str, payload: Any) -> None:
        raise RuntimeError("subscriber bug")

    monitor.subscribe(broken)
    unsubscribe = monitor.subscribe(listen)
    run(ip, "import time; time.sleep(1.0)")  # >= 3 samples even on a loaded machine
    samples = [e for e in events if e[0] == "sample"]
    cells = [e for e in events if e[0] == "cell"]
    assert len(samples) >= 3 and {e[1] for e in samples} == {"kerasmagic-sampler"}
    assert len(cells) == 1 and cells[0][2] is monitor.history()[-1]
    assert monitor.latest() is not None
    unsubscribe()
    count = len(events)
    run(ip, "time.sleep(0.15)")
    assert len(events) == count


def test_latest_is_the_newest_sample(ip: InteractiveShell) -> None:
    monitor = monitor_of(ip)
    run(ip, "w = 1")
    end = monitor.history()[-1].end
    assert monitor.latest() is end
    monitor.sampler.sample_once()
    latest = monitor.latest()
    assert latest is not None and latest.time_s >= end.time_s and latest is not end


def test_monitor_holds_no_user_objects(ip: InteractiveShell) -> None:
    run(ip, "class Big:\n    pass\nobj = Big()")
    ref = weakref.ref(ip.user_ns["obj"])
    run(ip, "del obj")
    monitor_of(ip).sampler.sample_once()
    gc.collect()
    assert ref() is None


def test_unload_stops_the_thread_and_removes_the_hooks(ip: InteractiveShell) -> None:
    monitor = monitor_of(ip)
    assert monitor.sampler.alive
    ip.run_line_magic("unload_ext", "kerasmagic")
    try:
        assert not monitor.sampler.alive
        assert get_monitor(ip) is None
        assert monitor.pre_run_cell not in ip.events.callbacks["pre_run_cell"]
        assert monitor.post_run_cell not in ip.events.callbacks["post_run_cell"]
        assert "kerasmagic-sampler" not in {t.name for t in threading.enumerate()}
        run(ip, "q = 1")
        assert kerasmagic.history() == []
    finally:
        ip.run_line_magic("load_ext", "kerasmagic")


def test_sampler_sleeps_between_samples(ip: InteractiveShell) -> None:
    monitor = monitor_of(ip)
    before = monitor.sampler.samples
    time.sleep(0.5)  # idle: default idle interval is 2 s
    assert monitor.sampler.samples - before <= 1


@pytest.mark.slow
def test_keras_state_is_read_on_the_main_thread(kip: InteractiveShell) -> None:
    run(kip, "m = build()")
    run(kip, "m2 = build()")
    record = monitor_of(kip).history()[-1]
    assert record.delta.name_counter is not None and record.delta.name_counter > 0
    assert record.delta.live_models == 1


def test_samples_during_a_cell_show_what_the_cell_created(kip: InteractiveShell) -> None:
    """A first fit() traces functions and registers gradients: samples show them as they come."""
    monitor = get_monitor(kip)
    assert monitor is not None
    monitor.sampler.stop()
    run(kip, "from kerasmagic.live import get_monitor as _gm")
    start = monitor.latest()
    assert start is not None
    run(
        kip,
        "m = build()\nm.fit(x, y, epochs=1, verbose=0)\n_gm(get_ipython()).sampler.sample_once()\n"
        "mid = _gm(get_ipython()).latest()",
    )
    mid = kip.user_ns["mid"]
    gradients = mid.cache("tensorflow", "custom_gradients")
    assert gradients is not None
    assert gradients > (start.cache("tensorflow", "custom_gradients") or 0)
    assert (mid.cache("tensorflow", "functions") or 0) > 0
    assert mid.keras_backend == "tensorflow" and mid.backend is not None


def test_a_reload_in_the_same_kernel_keeps_the_history(ip: InteractiveShell) -> None:
    """``%unload_ext`` then ``%load_ext``: the same kernel, the same cells; the monitor, the
    sidebar's state and the leak detector go on from them. A count that went back (a shell
    reset, as the tests' fixture does) is another run of cells: it starts afresh."""
    from kerasmagic.shellstate import state_of

    run(ip, "a = 1")
    run(ip, "b = 2")
    before = [r.execution_count for r in monitor_of(ip).history()]
    assert before == [1, 2]
    run(ip, "%unload_ext kerasmagic")
    run(ip, "%load_ext kerasmagic")
    state = state_of(ip)
    assert state is not None
    sidebar = state.part("sidebar")
    assert sidebar is not None
    sent = sidebar._state()["history"]
    assert [c["execution_count"] for c in sent] == before
    run(ip, "c = 3")
    assert [r.execution_count for r in monitor_of(ip).history()] == [*before, 5]
    ip.run_line_magic("unload_ext", "kerasmagic")
    ip.execution_count = 1
    ip.run_line_magic("load_ext", "kerasmagic")
    assert monitor_of(ip).history() == []
