"""Know before fit: a fit's peak predicted from small fits, and the largest batch that fits.

``predict_fit`` runs the user's own fit (same data, validation, shuffle) for a few steps at an
eighth and half the batch (each twice), reads the allocator's peak of each phase (around the
steps, train steps, validation steps) over what it began with, and extends each phase's line
through them to the full batch:
what a fit holds whatever its batch (weights, optimizer slots, the data ``fit`` converts) and
what grows with it (activations, prefetched batches) are measured, not modelled. A probe runs
only where the probes so far leave room for it below the device's limit, so a prediction never
runs out of memory, and the model leaves with its weights, optimizer state, step counter, RNG
state and compiled functions as it came.

``find_batch_size`` measures instead: two small train steps give the allocator's peak at two
batch sizes; the difference is the cost of one sample, the rest is what the model holds anyway
(weights, optimizer slots). The limit minus a margin, over that cost, is the batch that should
fit; one real step at that size confirms it (on an out-of-memory error it backs off and tries
again). The model's weights, the optimizer's state and the metrics are put back after every
try, and the traced train function is dropped: the model leaves as it came, apart from an
optimizer that is now built.
Anchor: PyTorch Lightning's batch size finder, which probes by running out of memory; this
needs at most one out-of-memory error and usually none.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import logging
import math
import numbers
import operator
import random
import statistics
import sys
import textwrap
import time
import types
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from kerasmagic.backends.oom import find_oom
from kerasmagic.cleanup.loops import Freezer
from kerasmagic.compat.registry import works
from kerasmagic.imports import AfterImport
from kerasmagic.interrupts.held import held_interrupts
from kerasmagic.units import fill, fmt_bytes

PROBES = (16, 64)  # the two small batch sizes measured
TRIES = 10  # measured steps after the two probes, at most (doubling from 64: 4096 by 6)


@dataclass(frozen=True)
class Meter:
    """One device's allocator peak, to reset and read, and its limit."""

    device: str
    reset: Callable[[], None]
    peak: Callable[[], int]
    limit_bytes: int
    limit_source: str  # where the limit comes from, in words


@dataclass(frozen=True)
class BatchFit:
    """What the finder measured and chose (``batch`` is None when nothing could be measured)."""

    batch: int | None
    message: str
    limit_bytes: int | None = None


def find_batch_size(
    model: Any,
    x: Any,
    y: Any = None,
    *,
    max_batch: int | None = None,
    limit_mb: float | None = None,
    margin: float = 0.9,
    verbose: bool = True,
) -> int | None:
    """Return the largest training batch of ``x``/``y`` that fits on the model's device.

    ``max_batch`` caps the answer (the number of samples always does); ``limit_mb`` replaces
    the device's limit (megabytes of 2**20 bytes, as ``%gpu_mem --limit``); ``margin`` is the
    share of the limit a step may use. Prints the figures it used (unless ``verbose=False``);
    returns None, saying why in one line, where the backend keeps no allocator figures (JAX,
    PyTorch on the CPU).
    """
    found = measure_batch(model, x, y, max_batch=max_batch, limit_mb=limit_mb, margin=margin)
    if verbose:
        print(found.message)
    return found.batch


def measure_batch(
    model: Any,
    x: Any,
    y: Any = None,
    *,
    max_batch: int | None = None,
    limit_mb: float | None = None,
    margin: float = 0.9,
) -> BatchFit:
    """Measure and confirm the batch (see ``find_batch_size``); return it with its figures."""
    _check(model, margin, limit_mb, "find_batch_size", "train_on_batch")
    meter = device_meter(_mb(limit_mb))
    if isinstance(meter, str):
        return BatchFit(None, fill(f"kerasmagic: {meter}: no batch size measured"))
    samples, max_batch = _rows(x), _whole("max_batch", max_batch)
    cap = min(samples, max_batch) if max_batch else samples
    with _kept(model), _quiet(), _young_only():  # each probe's new shape retraces: not news
        found = _search(model, x, y, meter, cap, margin)
    if missed := _uncounted(meter):
        found = replace(found, message=f"{found.message}\n{fill(f'kerasmagic: {missed}')}")
    return found


def _search(model: Any, x: Any, y: Any, meter: Meter, cap: int, margin: float) -> BatchFit:
    small, large = (min(p, cap) for p in PROBES)
    budget = int(meter.limit_bytes * margin)
    peaks: dict[int, int] = {}
    for batch in (small, *dict.fromkeys((small, large))):  # the first step warms up, unmeasured
        peak = _step(model, x, y, batch, meter)
        if peak is None:
            why = f"even a batch of {batch} runs out of memory on {meter.device}"
            return BatchFit(0, fill(f"kerasmagic: {why}: free memory first (kerasmagic.reset())"))
        peaks[batch] = peak
    prev, best, ooms = small, large, 0
    for _ in range(TRIES if peaks[large] <= budget else 0):
        guess = _next_guess(peaks, prev, best, budget, cap)
        if guess <= best * 1.05 or guess <= best + 1:
            break
        peak = _step(model, x, y, guess, meter)
        if peak is None:
            ooms += 1
            break
        peaks[guess] = peak
        if peak > budget:  # it fits, past the margin: once more, between the two
            inside = _next_guess(peaks, best, guess, budget, guess - 1)
            if best < inside < guess:
                peak = _step(model, x, y, inside, meter)
                if peak is not None:
                    peaks[inside] = peak
            break
        prev, best = best, guess
    return _verdict(peaks, budget, meter, margin, cap, ooms)


def _verdict(
    peaks: Mapping[int, int], budget: int, meter: Meter, margin: float, cap: int, ooms: int
) -> BatchFit:
    """Return the largest measured batch within ``budget``, with the figures in words."""
    low, high = min(peaks), max(peaks)
    per = (peaks[high] - peaks[low]) / (high - low) if high > low else None
    lines = [
        f"kerasmagic: {len(peaks)} train steps on {meter.device}, batch {low} to {high}: peak "
        f"{fmt_bytes(min(peaks.values()))} to {fmt_bytes(max(peaks.values()))}"
        + (f" (~{fmt_bytes(int(per))} a sample)" if per and per > 0 else ""),
        f"kerasmagic: limit {fmt_bytes(meter.limit_bytes)} ({meter.limit_source}); a step may "
        f"use {margin:.0%} of it, {fmt_bytes(budget)}",
    ]
    fitting = [b for b, p in peaks.items() if p <= budget]
    if not fitting:
        lines.append(f"kerasmagic: no batch of {low} or more fits in {fmt_bytes(budget)}: free "
                     "memory first (kerasmagic.reset()), or make the model smaller")  # fmt: skip
        return BatchFit(0, "\n".join(map(fill, lines)), meter.limit_bytes)
    best = max(fitting)
    why = f"all {cap} samples; " if best == cap else ""
    tail = f"; {ooms} out-of-memory error on the way" if ooms else ""
    lines.append(f"kerasmagic: batch {best} fits ({why}one step peaked at "
                 f"{fmt_bytes(peaks[best])}{tail})")  # fmt: skip
    return BatchFit(best, "\n".join(map(fill, lines)), meter.limit_bytes)


def _next_guess(peaks: Mapping[int, int], a: int, b: int, budget: int, cap: int) -> int:
    """Return where a line through the measured peaks meets ``budget``, at most twice ``b``.

    Peaks vary a little from step to step (ops run in parallel), so each batch counts with the
    highest peak seen at or below it, and the steeper of two lines is used: through ``a`` and
    ``b``, and through the smallest batch measured and ``b``. Beyond ``b`` a step may grow
    faster than measured, so the guess never more than doubles.
    """

    def envelope(n: int) -> int:
        return max(p for m, p in peaks.items() if m <= n)

    first = min(peaks)
    slopes = [(envelope(b) - envelope(m)) / (b - m) for m in (a, first) if m < b]
    per = max(slopes, default=0.0)
    reach = int(b + (budget - envelope(b)) / per) if per > 0 else 2 * b
    return max(1, min(cap, 2 * b, reach))


def _step(model: Any, x: Any, y: Any, batch: int, meter: Meter) -> int | None:
    """Run one train step of ``batch`` samples; return the allocator's peak, None on OOM."""
    gc.collect()
    meter.reset()
    try:
        model.train_on_batch(_take(x, batch), _take(y, batch))
    except Exception as error:
        if find_oom(error) is None:
            raise
        return None  # leaving the except block drops the error and the step's frames
    return meter.peak()


def device_meter(limit_bytes: int | None = None) -> Meter | str:
    """Return the meter of Keras's backend and device, or why it has none (a short phrase)."""
    backend = _keras_backend()
    if backend == "tensorflow":
        return _tf_meter(limit_bytes)
    if backend == "torch":
        return _torch_meter(limit_bytes)
    if backend == "jax":
        jax = sys.modules.get("jax")
        if jax is not None and jax.default_backend() == "cpu":
            return "JAX keeps no allocator figures on the CPU"
        return "JAX's allocator peak cannot be reset, so one train step cannot be measured"
    return f"Keras backend {backend!r} keeps no allocator figures kerasmagic reads"


def _tf_cpu(meter: Meter) -> bool:
    return meter.device == "CPU:0" and _keras_backend() == "tensorflow"


def _uncounted(meter: Meter) -> str | None:
    """What the meter's figures miss: TF's CPU allocator, unless BFC, skips small tensors."""
    if not _tf_cpu(meter):
        return None
    from kerasmagic.backends.tensorflow import cpu_uncounted

    uncounted = cpu_uncounted()
    return f"CPU:0's allocator {uncounted}" if uncounted else None


def _keras_backend() -> str:
    keras = sys.modules.get("keras")
    backend = getattr(getattr(keras, "backend", None), "backend", None)
    return str(backend()) if callable(backend) else "tensorflow"


def _tf_meter(limit_bytes: int | None) -> Meter | str:
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return "TensorFlow is not imported"
    device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    experimental = tf.config.experimental
    try:
        experimental.reset_memory_stats(device)
        in_use = int(experimental.get_memory_info(device)["current"])
    except (ValueError, RuntimeError):
        return f"TensorFlow keeps no allocator statistics on {device} here"
    limit, source = _limit(device, in_use, limit_bytes)
    return Meter(
        device,
        lambda: experimental.reset_memory_stats(device),
        lambda: int(experimental.get_memory_info(device)["peak"]),
        limit,
        source,
    )


def _torch_meter(limit_bytes: int | None) -> Meter | str:
    from kerasmagic.backends.torch import cuda_started, loaded_torch

    torch = loaded_torch()
    if torch is None or not cuda_started(torch):
        return "PyTorch keeps no allocator figures on the CPU"
    from kerasmagic.backends.torch import device_limit

    cuda = torch.cuda
    limit, source = (limit_bytes, "given") if limit_bytes else device_limit(torch, 0)
    peak = lambda: int(cuda.max_memory_allocated(0))  # noqa: E731
    return Meter("cuda:0", lambda: cuda.reset_peak_memory_stats(0), peak, limit, source)


def _limit(device: str, in_use: int, given: int | None) -> tuple[int, str]:
    """Return the device's limit and where it comes from."""
    if given:
        return given, "given"
    from kerasmagic.backends.oom import device_limit
    from kerasmagic.probes.nvml import read_gpus

    gpus = read_gpus().devices if device.startswith("GPU") else ()
    known = device_limit("tensorflow", device, gpus)
    if known is not None:
        return known.bytes, known.source
    import psutil

    return in_use + int(psutil.virtual_memory().available), "host RAM available, no cap set"


def _arrays(data: Any) -> Iterator[Any]:
    """Yield the arrays of an array or a dict, list or tuple of arrays (nested)."""
    if isinstance(data, Mapping | list | tuple):
        for part in data.values() if isinstance(data, Mapping) else data:
            yield from _arrays(part)
    else:
        yield data


def _rows(data: Any) -> int:
    """Return the number of samples in an array or a dict, list or tuple of arrays."""

    def rows(array: Any) -> int:
        shape = getattr(array, "shape", None)
        if not shape:
            raise ValueError("x and y must be arrays (or dicts, lists, tuples of arrays); found "
                             f"a {type(array).__name__}")  # fmt: skip
        if not shape[0]:
            raise ValueError("x has no samples")
        return int(shape[0])

    return min(map(rows, _arrays(data)))


def _whole(name: str, value: Any) -> int | None:
    """Return ``value`` (an int or a NumPy integer) as an int; refuse anything else but None."""
    if value is None:
        return None
    whole = operator.index(value) if isinstance(value, numbers.Integral) else 0
    if whole >= 1 and not isinstance(value, bool):
        return whole
    raise ValueError(f"{name} must be a positive whole number, not {value!r}")


def _take(data: Any, n: int) -> Any:
    if data is None:
        return None
    if isinstance(data, Mapping):
        return {k: _take(v, n) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_take(v, n) for v in data)
    return data[:n]


def _variables(optimizer: Any) -> Sequence[Any]:
    variables = getattr(optimizer, "variables", ())
    return list(variables() if callable(variables) else variables)


# -- know before fit ----------------------------------------------------------------------------
SHARES = (8, 2)  # probes at an eighth and half the batch (the half twice)
# train steps a probe runs: fewer miss the peak of tf.data's prefetch, still growing
PROBE_STEPS = 4
ROOM = 0.75  # a probe's worst case stays below this share of the limit: near it, a free
# share split in chunks can fail an allocation (under a 160 MB cap, a probe whose worst case
# was under 144 MB ran out)
GROWTH = 1.5  # the worst case: the steepest slope measured, this much steeper
PARALLEL = (  # a GPU's kernels are dispatched inline, in order: its peaks repeat
    "CPU:0 runs ops in parallel, so a fit's peak varies from run to run (up to ~25% here); "
    "tf.config.threading.set_inter_op_parallelism_threads(1) before TensorFlow starts makes it "
    "repeatable"
)
NAMED = 0.9  # the batch named as fitting keeps this share of the margin's budget: predicted
# again from probes of its own size, one named from batch 12288 came out 3% past the margin


@dataclass(frozen=True, repr=False)
class FitPrediction:
    """A fit's peak on its device, predicted before it runs (``peak_bytes`` None: not known;
    the limit: even the first, smallest run ran out of memory).

    ``probes`` are the (batch, allocator peak) pairs measured; ``largest_batch`` is the largest
    batch whose predicted peak stays within ``margin`` of the limit (at most the training
    samples, where they are known: a batch past them is all of them); ``notes`` say what the
    prediction cannot see; ``least_bytes`` is the peak read with the line's slope less what
    a weight's tensor or two held by one probe more than another could add to it (past the
    margin with ``least_bytes`` within it, ``fits`` is None: the probes cannot tell). ``str()``
    is the one line a notebook shows.
    """

    batch_size: int | None
    device: str | None
    peak_bytes: int | None
    limit_bytes: int | None = None
    margin: float = 0.9
    largest_batch: int | None = None
    probes: tuple[tuple[int, int], ...] = ()
    seconds: float = 0.0
    notes: tuple[str, ...] = ()
    message: str = ""
    least_bytes: int | None = None

    @property
    def fits(self) -> bool | None:
        """Whether the predicted peak stays within ``margin`` of the limit (None: not known,
        or the probes cannot tell: the least the peak can be, ``least_bytes``, is within it)."""
        if self.peak_bytes is None or self.limit_bytes is None:
            return None
        budget = self.limit_bytes * self.margin
        if self.peak_bytes > budget and (self.least_bytes or self.peak_bytes) <= budget:
            return None
        return self.peak_bytes <= budget

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        """The figures in one line (a cell that ends in ``predict_fit(...)`` shows it under the
        printed line), not the message again."""
        if self.peak_bytes is None:
            return f"FitPrediction(batch {self.batch_size}: not predicted)"
        verdict = {True: "fits", False: "does not fit", None: "may not fit"}[self.fits]
        verdict = "limit not known" if self.limit_bytes is None else verdict
        if self.largest_batch:
            verdict += f"; largest batch {self.largest_batch}"
        elif self.fits is False:
            verdict += "; no batch fits"
        return (
            f"FitPrediction(batch {self.batch_size}: peak {fmt_bytes(self.peak_bytes)} on "
            f"{self.device}, limit {fmt_bytes(self.limit_bytes)}, {verdict})"
        )


def predict_fit(
    model: Any,
    x: Any = None,
    y: Any = None,
    *,
    batch_size: int | None = None,
    validation_data: Any = None,
    validation_split: float = 0.0,
    validation_batch_size: int | None = None,
    shuffle: bool | str = True,
    class_weight: Any = None,
    sample_weight: Any = None,
    callbacks: Sequence[Any] | None = None,
    epochs: int = 1,
    initial_epoch: int = 0,
    steps_per_epoch: int | None = None,
    validation_steps: int | None = None,
    validation_freq: int = 1,
    limit_mb: float | None = None,
    margin: float = 0.9,
    verbose: bool = True,
) -> FitPrediction:
    """Predict the allocator's peak of ``model.fit(x, y, batch_size=...)`` before it runs.

    Takes ``fit``'s own arguments (arrays or dicts/lists of arrays, a ``tf.data.Dataset`` or a
    ``keras.utils.PyDataset``; a dataset's own batch is the batch predicted; a generator is
    refused, as its batch cannot be given back: ``%%fresh_model --predict`` can) and says in one
    line: the peak on the device, its limit (``limit_mb`` replaces it), whether the fit stays
    within ``margin`` of it and the largest batch that does. ``callbacks`` are not run: they are
    only named as what the prediction cannot see. ``epochs``, ``initial_epoch``, the steps and
    ``validation_freq`` are taken so a ``fit`` call can be copied whole: every step repeats the
    same peak. ``verbose`` is whether the line is printed. Costs about five full-size steps and
    five traces; never runs out of memory itself; leaves the model as it came.
    """
    counts = dict(epochs=epochs, steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                  validation_freq=validation_freq, initial_epoch=initial_epoch or None)  # fmt: skip
    for name, count in counts.items():  # checked as fit would; none moves the peak
        _whole(name, count)
    _check(model, margin, limit_mb, "predict_fit")
    batch, samples, probe_args, notes = _fit_inputs(
        x, y, batch_size, validation_data, validation_batch_size, validation_split
    )
    if callbacks:
        notes.append("callbacks not run: what they allocate is not counted")
    meter = None if batch is None else device_meter(_mb(limit_mb))
    if isinstance(meter, Meter) and _tf_cpu(meter):
        if missed := _uncounted(meter):
            notes.append(missed)
        if sys.modules["tensorflow"].config.threading.get_inter_op_parallelism_threads() != 1:
            notes.append(PARALLEL)
    if batch is None or not isinstance(meter, Meter):
        why = notes.pop() if batch is None else f"cannot predict on this backend here: {meter}"
        message = fill(f"kerasmagic: {why}")
        return _said(FitPrediction(batch, None, None, margin=margin, message=message), verbose)
    if _tf_cpu(meter) and (short := _no_room_to_copy(meter, x, y, sample_weight, validation_data)):
        return _said(_runs_out(FitPrediction(batch, meter.device, None, margin=margin), meter,
                               short), verbose)  # fmt: skip
    fixed = dict(validation_split=validation_split, shuffle=shuffle, class_weight=class_weight,
                 sample_weight=sample_weight)  # fmt: skip
    if not getattr(model, "built", True):  # built as fit would, so its weights can be kept
        kind = _kind(x)
        sample = x if kind == "arrays" else _first(x, kind)
        model(_take(sample[0] if kind != "arrays" else sample, 1))
    started = time.perf_counter()
    with _kept(model), _quiet(), _young_only():
        peaks, oom = _probe(model, meter, batch, lambda b: {**fixed, **probe_args(b)})
    gc.collect()  # each probe's dataset (with its copy of unaligned arrays) is garbage in cycles
    if oom:
        notes.append(f"a probe of batch {oom} ran out of memory")
    prediction = _predicted(peaks, batch, meter, margin, tuple(notes),
                            time.perf_counter() - started, samples, _tensor(model))  # fmt: skip
    return _said(prediction, verbose)


def _check(
    model: Any, margin: float, limit_mb: float | None, caller: str, method: str = "fit"
) -> None:
    """Refuse a bad argument in one clear line."""
    if isinstance(margin, bool) or not isinstance(margin, numbers.Real) or not 0 < margin <= 1:
        raise ValueError(f"margin must be in (0, 1], not {margin!r}")
    if limit_mb is not None and (
        isinstance(limit_mb, bool)
        or not isinstance(limit_mb, int | float)
        or not (math.isfinite(limit_mb) and limit_mb > 0)
    ):
        raise ValueError(f"limit_mb must be a positive number of megabytes, not {limit_mb!r}")
    if not callable(getattr(model, method, None)):
        raise ValueError(f"{caller} needs a compiled Keras model, not a {type(model).__name__}")
    if getattr(model, "optimizer", None) is None:
        raise ValueError(f"{caller} needs a compiled Keras model: call model.compile() first")


def _mb(limit_mb: float | None) -> int | None:
    return None if limit_mb is None else int(limit_mb * 2**20)


def _said(prediction: FitPrediction, verbose: bool) -> FitPrediction:
    if verbose:
        print(prediction.message)
    return prediction


ProbeArgs = Callable[[int], dict[str, Any]]


def _fit_inputs(
    x: Any, y: Any, batch_size: int | None, validation: Any, validation_batch: int | None,
    split: float = 0.0,
) -> tuple[int | None, int | None, ProbeArgs, list[str]]:  # fmt: skip
    """Return the batch predicted, the training samples where known (a batch past them is all
    of them; a dataset's: its batches times its batch), ``fit``'s arguments for a probe of
    ``b``, and the notes.

    Arrays are probed whole at a smaller ``batch_size``; a ``tf.data.Dataset`` rebatched; a
    ``PyDataset`` or a ``peeked`` generator through its first batch, cut. Any other generator
    cannot be probed without using it up: the batch is None and the last note says why (as
    ``validation_data``: not probed, and a note says so).
    """
    batch_size = _whole("batch_size", batch_size)
    validation_batch = _whole("validation_batch_size", validation_batch)
    notes: list[str] = []
    kind, samples = _kind(x), None
    if kind == "generator" and x not in _FIRST:
        notes.append("a generator cannot be probed without using it up: pass arrays, a "
                     "tf.data.Dataset or a keras.utils.PyDataset, or fit in a %%fresh_model "
                     "--predict cell, which gives its first batch back")  # fmt: skip
        return None, None, lambda b: {}, notes
    if kind != "arrays":  # the batch a dataset or generator gives: its first one's
        first = _first(x, kind)
        batch = _rows(first[0] if isinstance(first, tuple) else first)
    if kind == "generator":
        train: ProbeArgs = lambda b: {"x": _repeated(_take(first, b))}  # noqa: E731
    elif kind == "dataset":
        notes.append("the tf.data.Dataset is rebatched to probe: buffers that grow are not seen")
        train = _rebatched("x", x)
        batches = int(x.cardinality())  # negative: endless or not known
        samples = batch * batches if batches > 0 else None
    elif kind == "pydataset":
        train = lambda b: {"x": _cut(type(x).__mro__, first, b)}  # noqa: E731
        with contextlib.suppress(Exception):  # an endless one has no length
            samples = batch * len(x)
    else:
        rows = _rows(x)  # less what validation_split takes, as fit splits them
        split = split if isinstance(split, float | int) and 0 < split < 1 else 0
        samples = math.floor(rows * (1 - split)) or rows
        batch = min(batch_size or 32, samples)
        train = lambda b: {"x": x, "y": y, "batch_size": b}  # noqa: E731
    share, given = (validation_batch or batch) / batch, _kind(validation)
    if given == "dataset":
        revalid = _rebatched("validation_data", validation)
        valid: ProbeArgs = lambda b: revalid(max(1, round(b * share)))  # noqa: E731
    elif given == "generator" and validation in _FIRST:
        valid = lambda b: {"validation_data": _repeated(_take(  # noqa: E731
            _FIRST[validation], max(1, round(b * share))))}  # fmt: skip
    elif given == "generator":
        notes.append("validation steps not counted: their generator cannot be probed without "
                     "using it up")  # fmt: skip
        valid = lambda b: {}  # noqa: E731
    else:
        valid = lambda b: {"validation_data": validation,  # noqa: E731
                           "validation_batch_size": max(1, round(b * share))}  # fmt: skip
    return batch, samples, lambda b: {**train(b), **valid(b), "validation_steps": 1}, notes


def _rebatched(name: str, dataset: Any) -> ProbeArgs:
    """Return ``b -> {name: dataset}`` in batches of ``b``; a dataset of single samples (with scalar
    parts, which cannot be unbatched) is refused in one line, as fit would fail on it too."""
    try:
        samples = dataset.unbatch()
    except ValueError as error:
        raise ValueError(f"{name} is a tf.data.Dataset of single samples, not batches ({error}): "
                         "fit takes batches, so call .batch(n) on it") from None  # fmt: skip
    return lambda b: {name: samples.batch(b)}


def _kind(data: Any) -> str:
    """Return "dataset", "pydataset", "generator" or "arrays" (None and tensors included)."""
    names = {c.__name__ for c in type(data).__mro__}
    if "DatasetV2" in names:
        return "dataset"
    if "PyDataset" in names or ("Sequence" in names and hasattr(data, "__getitem__")):
        return "pydataset"
    if isinstance(data, Iterator):
        return "generator"
    return "arrays"


def _first(data: Any, kind: str) -> Any:
    """The first batch of a dataset, a ``PyDataset`` or a ``peeked`` generator."""
    if kind == "generator":
        return _FIRST[data]
    return data[0] if kind == "pydataset" else next(iter(data))


_FIRST: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # peeked batches


def peeked(data: Any) -> Any:
    """Return a generator that yields what ``data`` (a generator) would, its first batch read
    already, for ``_fit_inputs`` to probe with; anything else as it is (an iterator that is not
    a generator too: made one, Keras 3 would take what it refuses)."""
    __tracebackhide__ = True  # the user's generator raising: its own frames
    if not isinstance(data, types.GeneratorType):
        return data
    try:
        first = next(data)
    except StopIteration:
        return data

    def again() -> Iterator[Any]:
        yield first
        yield from data

    replay = again()
    _FIRST[replay] = first
    return replay


def _repeated(batch: Any) -> Iterator[Any]:
    """A generator of ``batch`` without end (a probe stops at its steps)."""
    while True:
        yield batch


def _cut(mro: Sequence[type], first: Any, b: int) -> Any:
    """Return a PyDataset of ``first`` cut to ``b`` samples, for as many steps as a probe runs."""
    base = next(c for c in mro if c.__name__ in ("PyDataset", "Sequence"))
    batch = tuple(_take(part, b) for part in first) if isinstance(first, tuple) else _take(first, b)

    class Cut(base):  # type: ignore[misc, valid-type]
        def __len__(self) -> int:
            return PROBE_STEPS

        def __getitem__(self, index: int) -> Any:
            return batch

    return Cut()


@contextmanager
def _kept(model: Any) -> Iterator[None]:
    """Put back the model's variables, optimizer state, compiled functions and RNG states."""
    optimizer = model.optimizer
    if not getattr(optimizer, "built", True) and callable(getattr(optimizer, "build", None)):
        optimizer.build(model.trainable_variables)  # as fit would: its slots are then counted
    metrics = [v for m in getattr(model, "metrics", ()) for v in getattr(m, "variables", ())]
    variables = list({id(v): v for v in (*model.variables, *_variables(optimizer), *metrics)}
                     .values())  # fmt: skip
    values = [v.numpy() for v in variables]
    names = ("train_function", "test_function", "predict_function", "history", "stop_training")
    attributes = {name: vars(model).get(name, _MISSING) for name in names}
    rng = _rng_kept()
    try:
        yield
    finally:
        with held_interrupts() as held:  # a Ctrl-C now would leave the model half put back
            if attributes["train_function"] in (None, _MISSING) and works("keras.train_function"):
                # the probes' traces go: replaced before it is unset, as Keras < 3.5 keeps the
                # old one among TF's tracked dependencies after ``= None``
                model.make_train_function(force=True)
            for name, value in attributes.items():
                if value is _MISSING:
                    vars(model).pop(name, None)
                else:
                    setattr(model, name, value)
            # The probes' data (fit's copy of the arrays) is garbage in cycles: freed before the
            # values go back, as each is a new tensor, and TF's capped CPU allocator crashes the
            # process (SIGSEGV) where making one from NumPy runs out (seen: 78 MB of x, 160 MB cap)
            gc.collect()
            for variable, value in zip(variables, values, strict=True):
                variable.assign(value)
            for put_back in rng:
                put_back()
        held.deliver()


_MISSING = object()


def _rng_kept() -> list[Callable[[], None]]:
    """Each RNG a probe draws from, as a call that puts it back: Python's, NumPy's and TF's
    op-seed generator (``tf.random.set_seed`` makes it; each shuffle draws from it)."""
    python = random.getstate()
    back = [lambda: random.setstate(python)]
    if (numpy := sys.modules.get("numpy")) is not None:
        drawn = numpy.random.get_state()
        back.append(lambda: numpy.random.set_state(drawn))
    if works("tf.op_seeds"):
        from tensorflow.python.eager import context

        if (generator := getattr(context.context(), "_rng", None)) is not None:
            seeds = generator.getstate()
            back.append(lambda: generator.setstate(seeds))
    return back


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence TF's retracing warnings and Keras's "ran out of data": each probe's own."""
    tf_log = logging.getLogger("tensorflow")
    level = tf_log.level
    tf_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        tf_log.setLevel(level)


@contextmanager
def _young_only() -> Iterator[None]:
    """Freeze what is alive (after one full collection) while probes run, as a loop's second
    model does (``cleanup/loops.py``): each probe's ``gc.collect()``, there to free the last
    probe's garbage, then walks only what the probes made (0.23 s to ~20 ms with TF loaded)."""
    ours = not Freezer.frozen
    try:
        with held_interrupts() as held:  # frozen and known to be ours, or neither
            if ours:
                gc.collect()
                Freezer.freeze()
        held.deliver()
        yield
    finally:
        if ours:
            Freezer.thaw()


Phases = tuple[int, int, int, int, int]  # a fit's peaks: around its steps (data, epoch), train,
# validation; and what was in use as the train and the validation phases began


def _probe(
    model: Any, meter: Meter, batch: int, args: ProbeArgs
) -> tuple[dict[int, list[Phases]], int | None]:
    """Run the probes that have room; return each run's phases' peaks by batch (the trace's at
    batch 0) and the batch that ran out, if any."""
    warm = _warm(batch)  # traces, builds the metrics: its peak only bounds the next
    targets = sorted({max(1, batch // share) for share in SHARES} - {batch})
    gc.collect()
    meter.reset()
    held = meter.peak()  # in use now: the peak of nothing yet
    first = _fit_peak(model, meter, warm, args, steps=1)
    if first is None:
        return {}, warm
    phases = {0: [first]}  # the trace's own peak: a floor, as fit traces too
    room = int(meter.limit_bytes * ROOM)
    # Each target in as many steps as the room allows, twice: where its tensors land in the
    # allocator's free chunks varies from fit to fit, and an allocator keeps a chunk less than
    # twice a tensor's size whole for it.
    for target in (*targets, *targets):
        while True:
            probed = {b: max(map(max, runs)) for b, runs in phases.items() if b}
            size = _room({0: held, **(probed or {warm: max(first)})}, target, room)
            if size is None:
                return phases, None
            measured = _fit_peak(model, meter, size, args, steps=PROBE_STEPS)
            if measured is None:
                return phases, size
            phases.setdefault(size, []).append(measured)
            if size == target:
                break
    return phases, None


def _warm(batch: int) -> int:
    """The batch of the first, one-step run of a prediction."""
    return max(1, batch // 64)


def _room(peaks: Mapping[int, int], target: int, room: int) -> int | None:
    """Return the largest batch up to ``target`` whose worst case stays within ``room``.

    ``peaks`` maps each batch measured to its peak, batch 0 to what was held before any probe.
    The worst case starts at the highest peak measured (one run can land low: its tensors in
    chunks already free) and grows at the steepest slope up to it, from nothing included,
    steeper still: a step's peak jumps by a tensor where the allocator hands it a whole free
    chunk up to twice its size. A step under a tenth of the largest probe is not taken.
    """
    top = max(peaks)
    if target <= top:
        return target
    high = max(peaks.values())
    slope = GROWTH * max((high - p) / (top - b) for b, p in peaks.items() if b < top)
    size = min(target, top + int((room - high) / slope)) if slope > 0 else target
    return size if size == target or size > top * 1.1 else None


def _fit_peak(model: Any, meter: Meter, batch: int, args: ProbeArgs, steps: int) -> Phases | None:
    """Run ``fit`` for ``steps`` steps of ``batch``; return its phases' peaks, None on OOM.

    Read apart, a phase's peak grows with the batch as a line: the peak of the whole fit is the
    larger of what is fixed (converting the data) and what grows (steps), and at small batches
    the fixed part hides the growing one. The train and validation phases also say what was in
    use as they began: whether ``fit`` copied the data into the allocator, and into how large a
    chunk, varies from fit to fit (the same fit held 0, 25 or 42 MB more), so a phase's growth
    is read over its own start.
    """
    gc.collect()
    meter.reset()
    phases = [0, 0, 0, 0, 0]

    def read(phase: int, begins: int = 0) -> None:
        phases[phase] = max(phases[phase], meter.peak())
        meter.reset()
        if begins:  # just reset: the peak is what is in use
            phases[begins] = max(phases[begins], meter.peak())

    hooks = {"on_train_begin": (0, 3), "on_train_batch_end": (1, 0), "on_test_begin": (0, 4),
             "on_test_batch_end": (2, 0)}  # fmt: skip
    base = _callback_class(model)
    reader = type("PhasePeaks", (base,), {
        name: functools.partialmethod(lambda self, at, *_, **__: read(*at), at)
        for name, at in hooks.items()
    })()  # fmt: skip
    try:
        model.fit(**args(batch), epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[reader])
    except Exception as error:
        if find_oom(error) is None:
            raise
        return None
    read(0)
    return phases[0], phases[1], phases[2], phases[3], phases[4]


def _callback_class(model: Any) -> type:
    """Keras's ``Callback`` of the Keras that defines ``model`` (Keras 3 or tf-keras)."""
    legacy = type(model).__module__.startswith("tf_keras") or any(
        c.__module__.startswith("tf_keras") for c in type(model).__mro__
    )
    return sys.modules["tf_keras" if legacy else "keras"].callbacks.Callback  # type: ignore[no-any-return]


def _predicted(
    phases: Mapping[int, list[Phases]], batch: int, meter: Meter, margin: float,
    notes: tuple[str, ...], seconds: float, samples: int | None = None, chunk: int = 0,
) -> FitPrediction:  # fmt: skip
    """Extend each phase's line through the probes to ``batch``.

    Each probe's peak varies: a tensor handed a larger chunk only ever adds, so each batch is
    read through its lowest run, and the line starts at the largest probe's highest. Its slope
    is the median of the slopes between every two batches probed (the two ends where there are
    two): one probe whose tensor took a larger chunk does not steer it. What is fixed
    (converting the data, the trace at batch 0) is the largest measured, and so is what a phase
    begins with. ``chunk`` is what one step can hold more than another of the same batch (a
    weight's gradient or two still alive as CPU:0's parallel ops run, or in a larger chunk):
    where the probes are close, that reads as a steep line, so a fit past the margin is said
    not to fit only where it does even with the slope less ``chunk`` over the probes' spread;
    short of that, the probes cannot tell (seen: probes at batch 9 and 10, 16.8 MB apart, one
    2048x2048 kernel, read a fit of 512 as 8 GB; it peaked at 144 MB).
    """
    budget = int(meter.limit_bytes * margin)
    sizes = sorted(b for b in phases if b)
    if len(sizes) == 1 and 0 < (warm := _warm(batch)) < sizes[0]:  # room for one probe only:
        # the first run's step is the line's other end (its train phase holds the trace too, so
        # the line is read from two runs where the probes usually give four)
        phases, sizes = {**phases, warm: phases[0]}, [warm, *sizes]
        notes = (*notes, "little room below the limit: one probe, read with the first step")
    probes = tuple((b, max(map(max, phases[b]))) for b in sizes)
    base = FitPrediction(batch, meter.device, None, limit_bytes=meter.limit_bytes,
                margin=margin, probes=probes, seconds=seconds, notes=notes)  # fmt: skip
    if not phases:  # the first, smallest run ran out of memory: the fit will too
        return _runs_out(base, meter, f"a fit of batch {_warm(batch)} already did")
    if len(sizes) < 2:
        why = "no probe ran"
        if 0 in phases:  # the first step ran, and left no room for a larger one
            why = (f"too little room below the limit to probe (one step of batch {_warm(batch)} "
                   f"peaked at {fmt_bytes(max(phases[0][0]))}): it may run out")  # fmt: skip
        why = "a batch under 4 is as small as a probe: run it" if batch < 4 else why
        return replace(base, message=fill(f"kerasmagic: cannot predict the fit of batch "
                                          f"{batch} on {meter.device}: {why}"))  # fmt: skip
    fixed = max(max(p) if b == 0 else p[0] for b, runs in phases.items() for p in runs)
    small, large = sizes[0], sizes[-1]
    peak, least, largest = fixed, fixed, None if fixed > budget else 10**9
    for phase in (1, 2):  # from the most a phase began with, as it grew over its start
        start = max(p[phase + 2] for runs in phases.values() for p in runs)
        grew = {b: [p[phase] - p[phase + 2] for p in phases[b]] for b in sizes}
        lows = {b: min(g) for b, g in grew.items()}
        pairs = itertools.combinations(sizes, 2)
        slope = max(0.0, statistics.median((lows[j] - lows[i]) / (j - i) for i, j in pairs))
        top = start + max(grew[large])
        peak = max(peak, int(top + slope * (batch - large)), top)
        flatter = max(0.0, slope - chunk / (large - small))
        least = max(least, int(start + lows[large] + flatter * (batch - large)))
        if largest is not None and slope > 0:  # named with the probes' worst case, as they ran
            largest = min(largest, int(large + (budget * NAMED - top) / (GROWTH * slope)))
    prediction = replace(base, peak_bytes=peak, least_bytes=least)
    fits = prediction.fits  # None: past the margin, but the least it can be is within it
    if largest is not None and samples:  # a batch past the training samples is all of them
        largest = min(largest, samples)
    if largest is not None and fits:  # named with more margin, but never below one that fits
        largest = max(largest, batch)
    largest = None if largest is None or largest < 1 or largest == 10**9 else largest
    span = f"~{fmt_bytes(least)} to " * (fits is None) + f"~{fmt_bytes(peak)}"
    verdict = {
        True: "fits",
        None: f"the probes cannot tell whether it fits {margin:.0%} of it: it may run out",
        False: f"too big for {margin:.0%} of it; "
        + (f"batch {largest} fits" if largest else "no batch fits: free memory first"),
    }[fits]
    if large * SHARES[0] < batch:  # a line this long multiplies the allocator's steps: a
        # 2048-wide MLP read from batch 85-198 of 4096 was named 129 and 528 in two runs; 2020 ran
        notes = (*notes, f"the room let probes reach batch {large} only, so this is rough: "
                 "find_batch_size measures the batch that fits with real steps")  # fmt: skip
    notes = (*notes, f"predicted in {seconds:.1f} s")
    said = "; ".join(notes)
    message = fill(
        f"kerasmagic: fit of batch {batch}{' (all its training samples)' * (batch == samples)} "
        f"will peak at {span} on {meter.device}, "
        f"limit {fmt_bytes(meter.limit_bytes)} ({meter.limit_source}): {verdict}. "
        f"{said[:1].upper()}{said[1:]}."
    )
    return replace(prediction, largest_batch=largest, message=message)


def _tensor(model: Any) -> int:
    """Twice the bytes of the model's largest variable (0 where they cannot be read)."""
    import numpy

    def size(v: Any) -> int:
        return int(math.prod(v.shape)) * int(
            getattr(v.dtype, "size", None) or numpy.dtype(str(v.dtype)).itemsize
        )

    try:
        return 2 * max(map(size, model.weights), default=0)
    except Exception:
        return 0


def _runs_out(base: FitPrediction, meter: Meter, why: str) -> FitPrediction:
    """``base`` said to run out of memory, its peak the limit, with no batch that fits."""
    said = (f"kerasmagic: fit of batch {base.batch_size} will run out of memory on "
            f"{meter.device}, limit {fmt_bytes(meter.limit_bytes)} ({meter.limit_source}): {why}; "
            "no batch fits: free memory first (kerasmagic.reset()), or use a smaller model or "
            "less data.")  # fmt: skip
    limit = meter.limit_bytes
    return replace(base, peak_bytes=limit, limit_bytes=limit, message=fill(said))


def _no_room_to_copy(meter: Meter, *data: Any) -> str | None:
    """Why ``fit`` cannot copy its arrays into TF's CPU allocator, if it cannot: more bytes
    than are free. Not tried: where making a tensor from NumPy runs out, TF's capped CPU
    allocator crashes the process (SIGSEGV) rather than raising."""
    copied = sum(int(getattr(array, "nbytes", 0) or 0) for array in _arrays(data))
    meter.reset()
    free = meter.limit_bytes - meter.peak()
    if copied <= free:
        return None
    return f"it copies its arrays ({fmt_bytes(copied)}) into that allocator, {fmt_bytes(free)} free"


_predicting = False  # a probe's own fit runs unpredicted


@contextmanager
def fits_predicted(margin: float = 0.9) -> Iterator[None]:
    """Predict each Keras ``fit`` in the block before it runs; stop one that would not fit.

    ``%%fresh_model --predict``'s block: the prediction's line is printed before the first
    step; a fit predicted past ``margin`` of the limit raises ``MemoryError`` with that line
    instead of running (one the probes cannot tell about runs). A fit like one the block
    predicted and then ran to its end (a K-fold loop's next fold: same model class, parameter
    count and optimizer, batch, data shapes) runs unpredicted and unsaid, and a line said once
    is not said again (a loop's fits on a backend that cannot be predicted). A generator's first
    batch is read to probe with and handed back: the fit gets every batch. ``Model.fit`` is
    wrapped for the block's time only; a Keras first imported in the block (a notebook's first
    cell, Run All) is wrapped as its import ends.
    """
    owned: dict[type, Any] = {}  # each class wrapped, and its own fit (None: inherited)
    fitted: set[tuple[Any, ...]] = set()  # fits this block predicted and ran
    told: set[str] = set()  # lines said: one that cannot predict (JAX's fits) is said once

    def wrap(module: Any) -> None:
        cls = getattr(module, "Model", None)
        if isinstance(cls, type) and cls not in owned:
            owned[cls] = vars(cls).get("fit")
            setattr(cls, "fit", _predicted_fit(getattr(cls, "fit"), margin, fitted, told))  # noqa: B009, B010

    keras = ("keras", "tf_keras")
    for name in keras:
        if name in sys.modules:
            wrap(sys.modules[name])
    hook = AfterImport(keras, lambda name: wrap(sys.modules[name]), named=True)
    hook.install()
    try:
        yield
    finally:
        with held_interrupts() as held:  # a Ctrl-C now would leave a class's fit wrapped
            hook.uninstall()
            for cls, fit in owned.items():
                if fit is not None:
                    setattr(cls, "fit", fit)  # noqa: B010
                elif "fit" in vars(cls):  # not yet wrapped where a Ctrl-C cut the wrap short
                    delattr(cls, "fit")
        held.deliver()


def _predicted_fit(
    fit: Callable[..., Any], margin: float, fitted: set[tuple[Any, ...]], told: set[str]
) -> Callable[..., Any]:
    import inspect

    signature = inspect.signature(fit)

    @functools.wraps(fit)
    def predicted(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _predicting
        __tracebackhide__ = True  # read by IPython's traceback formatter and holder_paths
        if _predicting:
            return fit(self, *args, **kwargs)
        try:
            bound = signature.bind_partial(self, *args, **kwargs)
        except TypeError:  # Keras says what is wrong with the call
            return fit(self, *args, **kwargs)
        given = bound.arguments  # a generator's first batch read, and given back to fit
        for name in ("x", "validation_data"):  # a loop: a comprehension's frame would show
            if name in given:
                given[name] = peeked(given[name])
        if isinstance(given.get("x"), types.GeneratorType) and given["x"] not in _FIRST:
            return fit(*bound.args, **bound.kwargs)  # empty: Keras says so
        names = ("batch_size", "validation_data", "validation_split", "validation_batch_size",
                 "shuffle", "class_weight", "sample_weight", "callbacks")  # fmt: skip
        key = _fit_key(self, given)
        if key is not None and key in fitted:
            return fit(*bound.args, **bound.kwargs)
        _predicting, interrupted = True, False
        try:  # a prediction that fails leaves the fit to run as the user wrote it
            prediction = predict_fit(
                self, given.get("x"), given.get("y"), margin=margin, verbose=False,
                **{name: given[name] for name in names if given.get(name) is not None},
            )  # fmt: skip
            said = prediction.message
        except KeyboardInterrupt:
            interrupted = True
        except Exception as error:
            prediction = None
            why = textwrap.shorten(f"{type(error).__name__}: {error}", 160, placeholder=" ...")
            said = fill(f"kerasmagic: this fit was not predicted ({why}); it runs as written")
        finally:
            _predicting = False
        if interrupted:  # raised out here: the probes' frames (and what they hold) are not kept
            raise KeyboardInterrupt("while kerasmagic predicted this fit: it did not start; "
                                    "the model is as it was")  # fmt: skip
        if said not in told:
            print(said)
            told.add(said)
        if prediction is not None and prediction.fits is False:
            raise MemoryError(" ".join(said.split()[1:]) + " Not started.")
        history = fit(*bound.args, **bound.kwargs)
        if key is not None and prediction is not None:  # it ran: its like runs unpredicted
            fitted.add(key)
        return history

    return predicted


def _fit_key(model: Any, given: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What makes two fits' peaks the same: the model's class, parameters, dtype policy and
    optimizer, the batch and split, and the data's shapes (a generator's: its first batch's).
    None where one is not known (a model not built, a dataset): such a fit is predicted each
    time."""
    settings = [given.get(n) for n in ("batch_size", "validation_split", "validation_batch_size")]
    kinds = [type(v).__qualname__ for v in (model, getattr(model, "optimizer", None))]
    try:
        params = model.count_params()  # raises while the model is not built
        data = [_shapes(given.get(n)) for n in ("x", "y", "validation_data", "sample_weight")]
        key = (*kinds, params, repr(getattr(model, "dtype_policy", None)), *settings, *data)
        hash(key)  # a value fit itself would refuse (batch_size=[64]) is left to fit to say
    except Exception:
        return None
    return key


def _shapes(data: Any) -> Any:
    """The shapes and dtypes of arrays (in dicts, lists, tuples; a ``peeked`` generator's first
    batch); raises on anything else."""
    if data is None:
        return None
    if isinstance(data, Iterator) and data in _FIRST:
        return "generator", _shapes(_FIRST[data])
    if isinstance(data, Mapping):
        return tuple(sorted((str(k), _shapes(v)) for k, v in data.items()))
    if isinstance(data, (list, tuple)):
        return tuple(_shapes(v) for v in data)
    return tuple(data.shape), str(data.dtype)  # AttributeError: not an array
