"""Live memory monitor: per-cell records, a background peak sampler, the leak detector.

``%load_ext kerasmagic`` gives each shell one ``LiveMonitor`` (with its ``Sampler`` thread) fed
by IPython's cell events. Its cell hooks take a cheap snapshot on the main thread (no gc scan, no
TF import). The sampler thread reads only RAM, NVML and what the backends let a thread read
(a backend's ``refresh``), reuses the last main-thread snapshot's per-thread figures (default graph,
Keras) and never touches user objects.

The leak detector is pure logic: a cell leaks when each of its last ``min_runs`` runs (same
source hash) grew the same figure, by enough in total, with no single run carrying most of it
(TensorFlow's allocator is exact: there any growth in each run counts). The advice depends on how
the cell ran: plain, under ``%%fresh_model``, or isolated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import textwrap
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from traitlets import Float, Int
from traitlets.config import Configurable

import kerasmagic.probes as probes
from kerasmagic.backends import keras_backend, read_active
from kerasmagic.compat.registry import say_once
from kerasmagic.interrupts.held import held_interrupts, interrupt_finished_cell, interrupt_next_cell
from kerasmagic.oom.explain import OomFacts
from kerasmagic.probes import GpuInfo, RamInfo, read_ram
from kerasmagic.shellstate import ShellState, state_of
from kerasmagic.snapshot import MemorySnapshot, SnapshotDelta, diff, take_snapshot


@dataclass(frozen=True)
class CellRecord:
    """One executed cell: its snapshots at start and end, their delta, and in-cell peaks."""

    execution_count: int
    started_s: float
    duration_s: float
    start: MemorySnapshot
    end: MemorySnapshot
    delta: SnapshotDelta
    peak_rss_bytes: int
    peak_gpu_bytes: int | None
    source_hash: str = ""  # same cell source -> same hash; the leak detector groups by it
    mode: str = "plain"  # "fresh" under %%fresh_model, "isolate" with --isolate (cell_mode)
    oom: OomFacts | None = None  # the cell ended in an out-of-memory error (kerasmagic.oom)

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict that ``json.dumps`` accepts."""
        return {k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in vars(self).items()}


def source_hash(source: str) -> str:
    """Return a short stable hash of a cell's source (whitespace at the ends ignored)."""
    return hashlib.blake2b(source.strip().encode(), digest_size=8).hexdigest()


# -- advice: the cause, and the remedy that fits how the cell ran -----------------------------
PLAIN, FRESH, ISOLATED = "plain", "fresh", "isolate"
FRESH_REMEDY = (
    "Run the cell under %%fresh_model (frees stale models, TF's gradient registry and Keras "
    "names first), or %%fresh_model --isolate to train in a fresh process."
)
UNDER_FRESH = {  # what -> advice for a cell that already runs under %%fresh_model
    "graph_ops": (
        "The cell adds ops to TensorFlow's default graph on every run (TF1 graph mode): create "
        "the ops once in an earlier cell and feed new values (placeholders, feed_dict), or "
        "call tf.compat.v1.reset_default_graph() before rebuilding them."
    ),
    "functions": (
        "A tf.function that outlives the cell traces again on every run: one defined in an "
        "earlier cell and called with each new model, or one called with Python numbers "
        "(each new value is a new trace). Pass tensors, or define the function inside the "
        "cell; fn.experimental_get_tracing_count() shows its traces."
    ),
    "custom_gradients": (
        "A tf.function from an earlier cell keeps every traced training step (and its "
        "custom-gradient entries) alive: define the training step inside the cell, or "
        "reuse one model and optimizer with it."
    ),
    "live_models": (
        "Each run keeps one more model alive through a name the cell does not rebind or a "
        "structure it appends to: %gpu_mem --deep shows what holds them; use "
        "%%fresh_model --keep/--all, or store weights or metrics instead of models."
    ),
    "name_counter": (
        "Keras's name counter still grows: layers are created outside the cleaned cell "
        "(in a function from an earlier cell run on another thread, or after a reset)."
    ),
    "memory": (
        "%%fresh_model already frees stale models, so something else keeps this memory: data "
        "the cell appends to on every run (%gpu_mem --deep lists the largest holders), or "
        "native memory that only a process exit returns: %%fresh_model --isolate."
    ),
}
UNDER_ISOLATE = (
    "The cell runs isolated, so the growth is in what it brings back into the kernel "
    "(--outputs) or in data the kernel keeps: bring back weights or metrics, not arrays."
)
WIDTH = 80  # columns: a notebook breaks a long line anywhere, so the message wraps between words


def cell_mode(source: str) -> str:
    """Return how a cell runs: under ``%%fresh_model`` (with or without ``--isolate``) or plain."""
    first = source.lstrip().split("\n", 1)[0]
    if not first.startswith("%%fresh_model"):
        return PLAIN
    return ISOLATED if "--isolate" in first.split() else FRESH


@dataclass(frozen=True)
class LeakVerdict:
    """``growing``: a figure grew run after run; ``what`` names it; ``message`` says it in words,
    wrapped between words within ``WIDTH`` columns."""

    growing: bool
    what: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict for JSON."""
        return dataclasses.asdict(self)


STABLE = LeakVerdict(False, "", "stable")
SIGNALS: dict[str, tuple[Callable[[CellRecord], int | None], str]] = {  # what -> read it, label
    "tf_tensors": (lambda r: r.delta.device_bytes.get("tensorflow"), "TensorFlow's tensors"),
    "rss": (lambda r: r.delta.rss_bytes, "RSS"),
    "gpu": (lambda r: r.delta.gpu_used_bytes, "GPU memory"),
    "backend": (lambda r: r.delta.backend_bytes, "the Keras backend's device memory"),
    "custom_gradients": (lambda r: _tf(r, "custom_gradients"), "TF custom-gradient registry"),
    "functions": (lambda r: _tf(r, "functions"), "traced TF functions"),
    "graph_ops": (lambda r: _tf(r, "default_graph_ops"), "default-graph ops"),
    "live_models": (lambda r: r.delta.live_models, "live Keras models"),
    "name_counter": (lambda r: r.delta.name_counter, "Keras layer-name counter"),
}
BYTE_SIGNALS = ("tf_tensors", "rss", "gpu", "backend")  # tf_tensors: exact, no noise floor
RunsOf = Mapping[str, Sequence[CellRecord]]  # a source hash -> that cell's latest runs
CAUSES = ("graph_ops", "functions", "custom_gradients", "live_models", "name_counter")


def _tf(record: CellRecord, cache: str) -> int | None:
    return record.delta.cache("tensorflow", cache)


class LeakDetector(Configurable):
    """Thresholds for "growing"; set them as ``c.LeakDetector.min_runs = 5`` and so on."""

    min_runs = Int(3, config=True, help="Runs of the same cell that must each grow to warn.")
    min_step_bytes = Int(2 * 2**20, config=True, help="Bytes a run must add to count as growing.")
    min_total_bytes = Int(8 * 2**20, config=True, help="Growth over those runs needed to warn.")
    max_share = Float(0.7, config=True, help="Largest share of the growth one run may carry.")
    window = Int(4, config=True, help="Judge only cells run among the last `window` cells.")

    def judge(self, history: Sequence[CellRecord], runs_of: RunsOf | None = None) -> LeakVerdict:
        """Return the first growing verdict among recently run cells, newest first. ``runs_of``
        maps a source hash to that cell's latest runs (else the history is scanned). A plain
        cell's runs before the latest ``%%fresh_model`` cell do not count: that cleanup freed
        what they kept, as the warning's remedy asks."""
        recent = reversed(history[-max(1, self.window) :])
        cleaned = next((r.started_s for r in reversed(history) if r.mode != PLAIN), -math.inf)
        for key in dict.fromkeys(r.source_hash for r in recent if r.source_hash):  # each once
            runs = (runs_of or {}).get(key) or [r for r in history if r.source_hash == key]
            runs = [r for r in runs if r.mode != PLAIN or r.started_s > cleaned]
            if (verdict := self.judge_runs(runs[-self.min_runs :])).growing:
                return verdict
        return STABLE

    def judge_runs(self, runs: Sequence[CellRecord]) -> LeakVerdict:
        """Judge the runs of one cell (oldest first)."""
        if len(runs) < max(self.min_runs, 2):
            return STABLE
        growing: dict[str, list[int]] = {}
        for what, (get, _) in SIGNALS.items():
            values = [get(r) for r in runs]
            steps = [int(v) for v in values if v is not None]
            if len(steps) == len(values) and self._grows(what, steps):
                growing[what] = steps
        return self._verdict(runs, growing) if growing else STABLE

    def _grows(self, what: str, steps: list[int]) -> bool:
        total = sum(steps)
        # TF's tensors are exact and the counts whole: there any growth in each run counts
        if what == "tf_tensors" or what not in BYTE_SIGNALS:
            return min(steps) >= 1
        big = min(steps) >= self.min_step_bytes and total >= max(self.min_total_bytes, 1)
        return big and max(steps) <= self.max_share * total

    def _verdict(self, runs: Sequence[CellRecord], growing: dict[str, list[int]]) -> LeakVerdict:
        """Name the first growing figure, its likely cause among the others, and the remedy."""
        what, steps = next(iter(growing.items()))
        cause = next((w for w in CAUSES if w in growing), "memory")
        first, last = runs[0].duration_s, runs[-1]
        said = (
            f"Cell [{last.execution_count}] grows {_amount(what, steps)} per run over its last "
            f"{len(steps)} runs"
        )
        if cause in growing and cause != what:
            said += f", and {_amount(cause, growing[cause])} per run"
        if cause == "graph_ops":
            took = f" (its runs took {first:.2f} s → {last.duration_s:.2f} s)"
            said += ". Each op added makes later session calls slower"
            said += took if last.duration_s >= 1.2 * first else ""
        remedy = {ISOLATED: UNDER_ISOLATE, FRESH: UNDER_FRESH[cause]}.get(last.mode, FRESH_REMEDY)
        said = textwrap.fill(
            f"{said}. {remedy}", WIDTH, break_long_words=False, break_on_hyphens=False
        )
        return LeakVerdict(True, what, said)


def _amount(what: str, steps: list[int]) -> str:
    n = sum(steps) / len(steps)
    size = f"{n / 2**20:.1f} MB" if abs(n) >= 2**20 / 10 else f"{n / 1024:.1f} KB"
    return f"{SIGNALS[what][1]} by {size if what in BYTE_SIGNALS else f'{n:.0f}'}"


# -- the monitor ----------------------------------------------------------------------------------
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
        self._lock, self._verdict = threading.Lock(), STABLE
        self._latest: MemorySnapshot | None = None
        self._start: tuple[MemorySnapshot, str, str] | None = None
        self._at_cell_end: Callable[[CellRecord | None], None] | None = None
        self._recorded: CellRecord | None = None  # this cell's record, for _at_cell_end
        self._runs_of: dict[str, deque[CellRecord]] = {}  # source hash -> its latest runs
        self.detector = LeakDetector(parent=self)
        self.sampler = Sampler(self.interval_s, self.idle_interval_s, self._on_sample)

    def history(self) -> list[CellRecord]:
        """Return the recorded cells, oldest first."""
        with self._lock:
            return list(self._history)

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
        if self._start is None or self._start[2] != FRESH or self._at_cell_end is not None:
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
        if (base := self._latest) is None:
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
        """Keep the records for a reload, unregister the cell hooks, stop the sampler thread,
        drop every subscriber and close the attached views."""
        with contextlib.suppress(TypeError):  # not weakly referenceable: nothing kept
            _kept[self._shell] = self.history(), dict(self._runs_of)
        for event in HOOKS:
            with contextlib.suppress(ValueError):  # already removed
                self._shell.events.unregister(event, getattr(self, event))
        self.sampler.stop()
        with self._lock:
            self._subscribers.clear()
            views, self._views = list(self._views.values()), {}
        for view in views:
            with contextlib.suppress(Exception):  # one that fails to close is dropped all the same
                view.close()

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
        # _cell counts cell starts, so a late reading never lands in the next cell
        self._running_cell, self._cell, self._peak_rss, self.samples = False, 0, 0, 0
        self._peak_gpu: int | None = None
        self._thread: threading.Thread | None = None

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
            self._thread = threading.Thread(target=self._loop, name="kerasmagic-sampler")
            self._thread.daemon = True
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


# -- the extension's part -------------------------------------------------------------------------
# Each shell's records at its last unload: a reload in the same kernel goes on from them (the
# sidebar's chart, the widget, the leak detector), as the kernel's own cells do.
_kept: weakref.WeakKeyDictionary[Any, Records] = weakref.WeakKeyDictionary()
HOOKS = ("pre_run_cell", "post_run_cell")


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
    """Stop ``monitor``: its hooks, its sampler thread, its views; keep its records."""
    monitor.stop()
