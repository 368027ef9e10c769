"""The per-cell record, and whether re-running a cell keeps growing memory or graphs.

Pure logic: no IPython, no TensorFlow. A cell leaks when each of its last ``min_runs`` runs (same
source hash) grew the same figure, by enough in total, with no single run carrying most of it
(TensorFlow's allocator is exact: there any growth in each run counts). The advice depends on how
the cell ran: plain, under ``%%fresh_model``, or isolated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from traitlets import Float, Int
from traitlets.config import Configurable

from kerasmagic.snapshot import MemorySnapshot, SnapshotDelta

if TYPE_CHECKING:
    from kerasmagic.oom.explain import OomFacts


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
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in ("start", "end", "delta", "oom"):
            out[key] = None if out[key] is None else out[key].to_dict()
        return out


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
        maps a source hash to that cell's latest runs (else the history is scanned)."""
        seen: set[str] = set()
        for record in reversed(history[-max(1, self.window) :]):
            key = record.source_hash
            if key and key not in seen:
                seen.add(key)
                runs = (runs_of or {}).get(key) or [r for r in history if r.source_hash == key]
                verdict = self.judge_runs(list(runs)[-self.min_runs :])
                if verdict.growing:
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
        if what == "tf_tensors":  # exact: any growth in each run counts
            return min(steps) > 0
        if what not in BYTE_SIGNALS:  # a count: each run added one or more
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
