"""The live monitor: between-cell records, a background peak sampler, subscribers (views).

The cell hooks take a cheap snapshot on the main thread (no gc scan, no TF import). The sampler
thread reads only RAM, NVML and what the backends let a thread read (``Backend.refresh``), reuses
the last main-thread snapshot's per-thread figures (default graph, Keras) and never touches user
objects.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from traitlets import Float, Int
from traitlets.config import Configurable

import kerasmagic.probes as probes
from kerasmagic.backends import keras_backend, read_active
from kerasmagic.compat.registry import say_once
from kerasmagic.interrupts.held import held_interrupts, interrupt_finished_cell, interrupt_next_cell
from kerasmagic.live import leak
from kerasmagic.live.leak import CellRecord, LeakDetector, LeakVerdict, cell_mode, source_hash
from kerasmagic.oom.explain import OomFacts
from kerasmagic.probes import GpuInfo, RamInfo, read_ram
from kerasmagic.snapshot import MemorySnapshot, diff, take_snapshot

log = logging.getLogger(__name__)
Subscriber = Callable[[str, Any], None]
OnSample = Callable[[RamInfo, GpuInfo], None]
RUNS_KEPT = 32  # per cell source, for the leak detector (more than any sane min_runs)
MAX_SOURCES = 512
Records = tuple[list[CellRecord], dict[str, deque[CellRecord]]]  # the history, runs by source


def _never_raise(hook: Callable[[Any], None], arg: Any) -> bool:
    """Run a cell hook with Ctrl-C held; return whether a Ctrl-C arrived meanwhile. A failure is
    one warning line (once per kind), never a traceback after the user's cell."""
    with held_interrupts() as held:
        try:
            hook(arg)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"[:200]
            log.debug("kerasmagic: %s failed", hook.__name__, exc_info=True)
            say_once([f"kerasmagic: memory record skipped ({why})"])  # a broken probe: once
    return held.pending


class LiveMonitor(Configurable):
    """Records every cell of one shell and publishes samples; configure as ``c.LiveMonitor``."""

    interval_s = Float(0.5, config=True, help="Seconds between samples while a cell runs.")
    idle_interval_s = Float(2.0, config=True, help="Seconds between samples while no cell runs.")
    history_size = Int(1000, config=True, help="Cells kept in the history (oldest dropped first).")

    def __init__(
        self, shell: Any, oom: Callable[[Any], OomFacts | None] | None = None, **kwargs: Any
    ) -> None:
        """``oom`` returns the out-of-memory facts of a cell's result (``Explainer.facts``)."""
        super().__init__(**kwargs)
        self._shell, self._oom = shell, oom
        self._history: deque[CellRecord] = deque(maxlen=max(1, self.history_size))
        self._subscribers: list[Subscriber] = []
        self._views: dict[str, Any] = {}  # the widget or line printer this monitor feeds
        self._lock = threading.Lock()
        self._latest: MemorySnapshot | None = None
        self._start: tuple[MemorySnapshot, str, str] | None = None
        self._at_cell_end: Callable[[CellRecord | None], None] | None = None
        self._recorded: CellRecord | None = None  # this cell's record, for _at_cell_end
        self._verdict = leak.STABLE
        self._runs_of: dict[str, deque[CellRecord]] = {}  # source hash -> its latest runs
        self.detector = LeakDetector(parent=self)
        self.sampler = Sampler(self.interval_s, self.idle_interval_s, self._on_sample)

    def history(self) -> list[CellRecord]:
        """Return the recorded cells, oldest first."""
        with self._lock:
            return list(self._history)

    def records(self) -> Records:
        """Return what this monitor recorded: the history and each cell source's runs."""
        with self._lock:
            return list(self._history), dict(self._runs_of)

    def resume(self, records: Records) -> None:
        """Go on from an earlier monitor's ``records`` of this shell (a reload in one kernel)."""
        history, runs_of = records
        with self._lock:
            self._history.extend(history)
            self._runs_of.update(runs_of)
        self._verdict = self.detector.judge(history, self._runs_of)

    def latest(self) -> MemorySnapshot | None:
        """Return the newest sample or cell-end snapshot."""
        return self._latest

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn(kind, payload)`` on each "sample" and "cell"; return an unsubscriber."""
        with self._lock:
            self._subscribers.append(fn)

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._subscribers.remove(fn)

        return unsubscribe

    def at_cell_end(self, fn: Callable[[CellRecord | None], None]) -> bool:
        """Have ``fn(record)`` run once this ``%%fresh_model`` cell is recorded (so its report
        line reads the record's figures); False when no such cell is being recorded or one is
        already waiting (a magic called again inside the cell)."""
        if self._start is None or self._start[2] != leak.FRESH or self._at_cell_end is not None:
            return False
        self._at_cell_end = fn
        return True

    def runs(self, source_hash: str) -> list[CellRecord]:
        """Return the latest runs of the cell with this source hash, oldest first."""
        return list(self._runs_of.get(source_hash, ()))

    def verdict(self) -> LeakVerdict:
        """Return the leak detector's verdict on the history so far."""
        return self._verdict

    def refresh(self) -> MemorySnapshot:
        """Take a full snapshot (main thread only), make it the latest and emit it as a sample:
        after a cleanup, later samples build on its figures, not the last cell's."""
        snap = take_snapshot(self._shell.user_ns)
        with self._lock:
            self._latest = snap
        self._emit("sample", snap)
        return snap

    # -- IPython events (main thread) ------------------------------------------------------
    def pre_run_cell(self, info: Any) -> None:
        """Take the cell's start snapshot and reset the in-cell peaks (never raises)."""
        if _never_raise(self._pre_run_cell, info):
            interrupt_next_cell(self._shell)  # Ctrl-C before the cell ran: it must not run

    def _pre_run_cell(self, info: Any) -> None:
        latest = self._latest  # no user code ran since: only RSS is read afresh (half the cost)
        if latest is None:
            snap = take_snapshot(self._shell.user_ns, light=True)
        else:
            snap = replace(latest, time_s=time.time(), ram=read_ram())
        source = getattr(info, "raw_cell", "") or ""
        self._start = (snap, source_hash(source), cell_mode(source))
        self._latest = snap
        self.sampler.cell_started(snap.ram.rss_bytes, snap.gpu_used_bytes)

    def post_run_cell(self, result: Any) -> None:
        """Record the cell, judge the history, and tell subscribers (never raises); what
        waited for the record gets it, or None if none could be made."""
        at_end, self._at_cell_end = self._at_cell_end, None
        if _never_raise(self._post_run_cell, result):
            interrupt_finished_cell(self._shell, result)
        if at_end is not None:
            _never_raise(at_end, self._recorded)
        self._recorded = None

    def _post_run_cell(self, result: Any) -> None:
        if self._start is None:
            return
        (start, key, mode), self._start = self._start, None
        try:
            end = take_snapshot(self._shell.user_ns, light=True)
        except BaseException:
            self.sampler.cell_finished(start.ram.rss_bytes, None)  # back to idle sampling
            raise
        peak_rss, peak_gpu = self.sampler.cell_finished(end.ram.rss_bytes, end.gpu_used_bytes)
        before, after = start.ram.peak_rss_bytes, end.ram.peak_rss_bytes
        if before is not None and after is not None and after > before:  # a new all-time high
            peak_rss = max(peak_rss, after)
        count = getattr(result, "execution_count", None)
        count = int(count if count is not None else self._shell.execution_count)
        oom = None if self._oom is None else self._oom(result)
        cell = (count, start.time_s, end.time_s - start.time_s, start, end, diff(start, end))
        record = CellRecord(*cell, peak_rss, peak_gpu, key, mode, oom)
        runs = self._runs_of.pop(key, None) or deque(maxlen=RUNS_KEPT)
        runs.append(record)
        with self._lock:
            self._history.append(record)
            history = list(self._history)
            self._runs_of[key] = runs  # most recently run last
            if len(self._runs_of) > MAX_SOURCES:
                del self._runs_of[next(iter(self._runs_of))]  # the least recently run cell
            self._latest = end
        self._recorded = record
        self._verdict = self.detector.judge(history, self._runs_of)
        self._emit("cell", record)

    # -- sampler thread ----------------------------------------------------------------------
    def _on_sample(self, ram: RamInfo, gpu: GpuInfo) -> None:
        """Emit the latest snapshot with what a thread can read afresh: memory and the backends
        (not TF's default graph: it is per thread), so a first ``fit()`` shows TF as it runs."""
        base = self._latest
        if base is None:
            return
        now, name, found = time.time(), keras_backend(), read_active(earlier=base.backends)
        snap = replace(base, time_s=now, ram=ram, gpu=gpu, keras_backend=name, backends=found)
        with self._lock:  # a cell's end snapshot may have landed meanwhile: it wins
            if self._latest is not base:
                return
            self._latest = snap
        self._emit("sample", snap)

    def _emit(self, kind: str, payload: Any) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for fn in subscribers:
            try:
                fn(kind, payload)
            except Exception:
                log.exception("kerasmagic live subscriber %r failed on %r", fn, kind)

    def stop(self) -> None:
        """Stop the sampler thread, drop every subscriber and close the attached views."""
        self.sampler.stop()
        with self._lock:
            self._subscribers.clear()
            views, self._views = list(self._views.values()), {}
        for view in views:
            try:
                view.close()
            except Exception:
                log.debug("kerasmagic: closing a view failed", exc_info=True)

    def attach(self, key: str, view: Any) -> Any:
        """Keep ``view`` (anything with ``close()``) as this monitor's ``key`` view, closed on
        ``stop()``; return the view it replaces, if any (the caller closes it)."""
        with self._lock:
            old, self._views[key] = self._views.get(key), view
        return old

    def view(self, key: str) -> Any | None:
        """Return the attached view called ``key``, or None."""
        return self._views.get(key)


class Sampler:
    """A daemon thread that samples RAM and NVML every ``interval_s`` while a cell runs (keeping
    its peaks), every ``idle_interval_s`` otherwise; it sleeps on an ``Event``, never raises
    into the kernel and holds no user object."""

    def __init__(self, interval_s: float, idle_interval_s: float, on_sample: OnSample) -> None:
        self.interval_s, self.idle_interval_s = interval_s, idle_interval_s
        self._on_sample = on_sample
        self._stop, self._lock = threading.Event(), threading.Lock()
        self._running_cell = False
        self._cell = 0  # counts cell starts, so a late reading never lands in the next cell
        self._peak_rss = 0
        self._peak_gpu: int | None = None
        self._thread: threading.Thread | None = None
        self.samples = 0

    @property
    def alive(self) -> bool:
        """Return True while the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def native_id(self) -> int | None:
        """Return the OS thread id (for CPU accounting), or None when not running."""
        return self._thread.native_id if self._thread is not None else None

    def start(self) -> None:
        """Start the thread (once)."""
        if not self.alive:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._loop, name="kerasmagic-sampler", daemon=True
            )
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._thread = None

    def cell_started(self, rss_bytes: int, gpu_bytes: int | None) -> None:
        """Reset the peaks to the cell's start values; samples come every tick until it ends."""
        with self._lock:
            self._running_cell, self._cell = True, self._cell + 1
            self._peak_rss, self._peak_gpu = rss_bytes, gpu_bytes

    def cell_finished(self, rss_bytes: int, gpu_bytes: int | None) -> tuple[int, int | None]:
        """Return the cell's peak RSS and GPU bytes (including the end values)."""
        with self._lock:
            self._running_cell = False
            self._update(rss_bytes, gpu_bytes)
            return self._peak_rss, self._peak_gpu

    def _update(self, rss_bytes: int, gpu_bytes: int | None) -> None:
        self._peak_rss = max(self._peak_rss, rss_bytes)
        if gpu_bytes is not None:
            self._peak_gpu = max(self._peak_gpu or 0, gpu_bytes)

    def sample_once(self) -> None:
        """Read the probes once, update the peaks and report; log (never raise) failures."""
        try:
            cell = self._cell
            ram, gpu = probes.read_ram(), probes.read_gpus()  # not this module's read_ram
            with self._lock:
                if self._running_cell and self._cell == cell:
                    self._update(ram.rss_bytes, gpu.used_bytes)
            self.samples += 1
            self._on_sample(ram, gpu)
        except Exception:
            log.exception("kerasmagic sampler: reading memory failed")

    def _loop(self) -> None:
        # Tick every interval_s; sample on every tick while a cell runs, else every
        # idle_interval_s. A cell's start does not wake the thread: trivial cells end before
        # the next tick, so they never compete with it for the GIL.
        last = float("-inf")
        while not self._stop.is_set():
            now = time.monotonic()
            if self._running_cell or now - last >= self.idle_interval_s:
                self.sample_once()
                last = now
            self._stop.wait(self.interval_s)
