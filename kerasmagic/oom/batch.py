"""The largest training batch that fits: measured with the allocator's peak, confirmed once.

Two small train steps give the allocator's peak at two batch sizes; the difference is the cost
of one sample, the rest is what the model holds anyway (weights, optimizer slots). The limit
minus a margin, over that cost, is the batch that should fit; one real step at that size
confirms it (on an out-of-memory error it backs off and tries again). The model's weights, the
optimizer's state and the metrics are put back after every try, and the traced train function
is dropped: the model leaves as it came, apart from an optimizer that is now built.
Anchor: PyTorch Lightning's batch size finder, which probes by running out of memory; this
needs at most one out-of-memory error and usually none.
"""

from __future__ import annotations

import gc
import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kerasmagic.backends.oom import find_oom
from kerasmagic.compat.registry import works
from kerasmagic.units import fmt_bytes

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
    if not 0 < margin <= 1:
        raise ValueError(f"margin must be in (0, 1], not {margin!r}")
    if limit_mb is not None and (
        isinstance(limit_mb, bool)
        or not isinstance(limit_mb, int | float)
        or not (math.isfinite(limit_mb) and limit_mb > 0)
    ):
        raise ValueError(f"limit_mb must be a positive number of megabytes, not {limit_mb!r}")
    if getattr(model, "optimizer", None) is None or not callable(
        getattr(model, "train_on_batch", None)
    ):
        raise ValueError("find_batch_size needs a compiled Keras model: call model.compile() first")
    meter = device_meter(None if limit_mb is None else int(limit_mb * 2**20))
    if isinstance(meter, str):
        return BatchFit(None, f"kerasmagic: {meter}: no batch size measured")
    samples = _rows(x)
    cap = min(samples, max_batch) if max_batch else samples
    saved = _save(model)
    tf_log = logging.getLogger("tensorflow")  # each probe's new shape retraces: not news
    level = tf_log.level
    tf_log.setLevel(logging.ERROR)
    try:
        return _search(model, x, y, meter, cap, margin, saved)
    finally:
        tf_log.setLevel(level)
        _restore(model, saved)
        # The probes' traces (fit traces its own). Replaced before it is unset: Keras < 3.5
        # keeps the old one among TensorFlow's tracked dependencies after ``= None``, and on
        # TF 2.16 a step that ran out keeps what it allocated with it.
        if works("keras.train_function"):  # moved: said once, by compat; the traces stay
            model.make_train_function(force=True)
        model.train_function = None
        gc.collect()


def _search(
    model: Any, x: Any, y: Any, meter: Meter, cap: int, margin: float, saved: Any
) -> BatchFit:
    small, large = (min(p, cap) for p in PROBES)
    budget = int(meter.limit_bytes * margin)
    peaks: dict[int, int] = {}
    for batch in (small, *dict.fromkeys((small, large))):  # the first step warms up, unmeasured
        peak = _step(model, x, y, batch, meter, saved)
        if peak is None:
            return BatchFit(0, f"kerasmagic: even a batch of {batch} runs out of memory on "
                            f"{meter.device}: free memory first (kerasmagic.reset())")  # fmt: skip
        peaks[batch] = peak
    prev, best, ooms = small, large, 0
    for _ in range(TRIES if peaks[large] <= budget else 0):
        guess = _next_guess(peaks, prev, best, budget, cap)
        if guess <= best * 1.05 or guess <= best + 1:
            break
        peak = _step(model, x, y, guess, meter, saved)
        if peak is None:
            ooms += 1
            break
        peaks[guess] = peak
        if peak > budget:  # it fits, past the margin: once more, between the two
            inside = _next_guess(peaks, best, guess, budget, guess - 1)
            if best < inside < guess:
                peak = _step(model, x, y, inside, meter, saved)
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
        return BatchFit(0, "\n".join(lines), meter.limit_bytes)
    best = max(fitting)
    why = f"all {cap} samples; " if best == cap else ""
    tail = f"; {ooms} out-of-memory error on the way" if ooms else ""
    lines.append(f"kerasmagic: batch {best} fits ({why}one step peaked at "
                 f"{fmt_bytes(peaks[best])}{tail})")  # fmt: skip
    return BatchFit(best, "\n".join(lines), meter.limit_bytes)


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


def _step(model: Any, x: Any, y: Any, batch: int, meter: Meter, saved: Any) -> int | None:
    """Run one train step of ``batch`` samples; return the allocator's peak, None on OOM."""
    gc.collect()
    meter.reset()
    try:
        model.train_on_batch(_take(x, batch), _take(y, batch))
    except Exception as error:
        if find_oom(error) is None:
            raise
        return None  # leaving the except block drops the error and the step's frames
    finally:
        _restore(model, saved)
    return meter.peak()


def device_meter(limit_bytes: int | None = None) -> Meter | str:
    """Return the meter of Keras's backend and device, or why it has none (a short phrase)."""
    backend = _keras_backend()
    if backend == "tensorflow":
        return _tf_meter(limit_bytes)
    if backend == "torch":
        return _torch_meter(limit_bytes)
    if backend == "jax":
        return "JAX's allocator peak cannot be reset, so one train step cannot be measured"
    return f"Keras backend {backend!r} keeps no allocator figures kerasmagic reads"


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


def _rows(data: Any) -> int:
    """Return the number of samples in an array or a dict, list or tuple of arrays."""
    if isinstance(data, Mapping):
        return min(_rows(v) for v in data.values())
    if isinstance(data, (list, tuple)):
        return min(_rows(v) for v in data)
    shape = getattr(data, "shape", None)
    if not shape:
        raise ValueError("find_batch_size takes arrays (or dicts, lists, tuples of arrays)")
    return int(shape[0])


def _take(data: Any, n: int) -> Any:
    if data is None:
        return None
    if isinstance(data, Mapping):
        return {k: _take(v, n) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_take(v, n) for v in data)
    return data[:n]


def _save(model: Any) -> tuple[list[Any], list[Any]]:
    """Build the optimizer if it is not (so its state can be put back); copy both states."""
    optimizer = model.optimizer
    if not getattr(optimizer, "built", True) and callable(getattr(optimizer, "build", None)):
        optimizer.build(model.trainable_variables)
    return model.get_weights(), [v.numpy() for v in _variables(optimizer)]


def _restore(model: Any, saved: tuple[list[Any], list[Any]]) -> None:
    weights, slots = saved
    model.set_weights(weights)
    for variable, value in zip(_variables(model.optimizer), slots, strict=False):
        variable.assign(value)
    if callable(getattr(model, "reset_metrics", None)):
        model.reset_metrics()


def _variables(optimizer: Any) -> Sequence[Any]:
    variables = getattr(optimizer, "variables", ())
    return list(variables() if callable(variables) else variables)
