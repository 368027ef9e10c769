"""TensorFlow's runtime: the allocator per device (CPU:0 and GPUs), the memory configuration
(growth, a cap) and each device's limit, and the thread's eager mode, put back after an
interrupt left it in graph mode.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kerasmagic.backends import BackendDevice, Limit
from kerasmagic.backends.oom import GPU_TOTAL, HOST_RAM, index_of, is_cpu
from kerasmagic.compat.registry import loaded, say_once, works


# -- alloc: TensorFlow's own allocator figures, read only when the user has imported TensorFlow
def tf_context() -> Any | None:
    """Return TensorFlow's eager context if TensorFlow is imported, without importing it.

    None while ``import tensorflow`` is still running (another thread may be sampling).
    """
    module = loaded("tensorflow.python.eager.context")  # tf.context moved: said once, by compat
    return module.context() if module is not None and works("tf.context") else None


def runtime_initialized() -> bool:
    """Return True once TensorFlow has created its devices (GPU memory may be taken)."""
    ctx = tf_context()
    return ctx is not None and getattr(ctx, "_context_handle", None) is not None


def _each_device(method: str) -> list[tuple[str, str, Any]]:
    """Return (name, kind, answer) of each device whose allocator may keep statistics (CPU:0,
    and TensorFlow's logical GPUs "GPU:0", ..., once its runtime is up), ``method`` of
    ``tf.config.experimental`` asked of it; one without ("Allocator stats not available": a
    CPU with ``TF_ENABLE_ONEDNN_OPTS=0``, some builds) is left out."""
    ctx = tf_context()
    if ctx is None or not runtime_initialized():
        return []
    gpus = ctx.list_logical_devices("GPU")
    out = []
    for name, kind in [("CPU:0", "cpu")] + [(f"GPU:{i}", "gpu") for i in range(len(gpus))]:
        with contextlib.suppress(ValueError, RuntimeError):
            call = getattr(sys.modules["tensorflow"].config.experimental, method)
            out.append((name, kind, call(name)))
    return out


def read_tf() -> tuple[BackendDevice, ...] | None:
    """Return the bytes TensorFlow's allocator has in use on each device now and at its peak
    (``BackendDevice``'s name, in use, peak and kind), or None before its runtime started;
    never imports TensorFlow or starts its runtime.

    CPU:0 keeps statistics where oneDNN is on (TensorFlow turns it on only for CPUs with
    AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX), but oneDNN's allocator leaves tensors under
    256 KB uncounted; ``TF_CPU_ALLOCATOR_USE_BFC=true``, set before TensorFlow starts, puts CPU
    tensors on a BFC allocator that counts every one, as a GPU's does (notes/tf-memory.md).
    """
    if "tensorflow" not in sys.modules or not runtime_initialized():
        return None
    found = _each_device("get_memory_info")
    return tuple(BackendDevice(n, int(i["current"]), int(i["peak"]), kind=k) for n, k, i in found)


def reset_tf_peaks() -> list[str]:
    """Reset TensorFlow's peak counter on every device that keeps one; return those reset."""
    return [name for name, _, _ in _each_device("reset_memory_stats")]


# -- config: TensorFlow's GPU memory settings, which only work before it starts its devices
TOO_LATE = (
    "too late: TensorFlow has already initialised its GPUs in this kernel. Restart the kernel "
    "and run this first (or set TF_FORCE_GPU_ALLOW_GROWTH=true before importing TensorFlow)."
)


def configure_tensorflow(growth: bool = False, limit_mb: int | None = None) -> str:
    """Turn on TensorFlow's memory growth and/or cap each GPU at ``limit_mb``.

    Imports TensorFlow if needed (the user asked for it), but never raises for a machine
    without GPUs or for a runtime that has already started: the message says so.
    """
    tf = importlib.import_module("tensorflow")
    gpus = tf.config.list_physical_devices("GPU")  # safe: does not start the runtime
    if not gpus:
        return "no GPU visible to TensorFlow: nothing to configure"
    if runtime_initialized():
        return TOO_LATE
    try:
        for gpu in gpus:
            if limit_mb is not None:
                config = tf.config.LogicalDeviceConfiguration(memory_limit=limit_mb)
                tf.config.set_logical_device_configuration(gpu, [config])
            elif growth:
                tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:
        return TOO_LATE
    what = f"memory capped at {limit_mb} MB" if limit_mb is not None else "memory growth on"
    return f"{what} for {len(gpus)} GPU(s)"


# -- limit: the cap on CPU:0 is TF_CPU_BFC_MEM_LIMIT_IN_MB; on a GPU, the logical device's
# memory_limit (%gpu_mem --limit, tf.config.set_logical_device_configuration), read from the
# physical GPU's configuration, which starts nothing. Without a cap: host RAM, the GPU's total.
CPU_CAP_VAR = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
TF_CAP = "TensorFlow's memory_limit"


def tf_logical_gpus(tf: Any) -> list[tuple[int, int | None]]:
    """Return each logical GPU of TensorFlow as (physical index, memory_limit in MB or None).

    Reads the configuration set on each physical GPU; never starts TensorFlow's runtime.
    """
    gpus = enumerate(tf.config.list_physical_devices("GPU"))
    configs = [(i, tf.config.get_logical_device_configuration(gpu) or [None]) for i, gpu in gpus]
    return [(i, getattr(c, "memory_limit", None)) for i, each in configs for c in each]


def tf_gpu_limit(
    index: int, logical: Sequence[tuple[int, int | None]], totals: Sequence[int]
) -> Limit | None:
    """Return the limit of TensorFlow's ``GPU:index``: its memory_limit, else its GPU's total.

    ``logical`` is ``tf_logical_gpus``'s answer, ``totals`` each visible GPU's bytes (NVML).
    """
    physical, cap_mb = logical[index] if index < len(logical) else (index, None)
    if cap_mb:
        return Limit(int(cap_mb) * 2**20, TF_CAP)
    return Limit(totals[physical], GPU_TOTAL) if physical < len(totals) else None


def device_limit(device: str, totals: Sequence[int], host_total: int | None) -> Limit | None:
    """Return the limit of TensorFlow's ``device`` (the backend's ``limit``): its cap, else the
    host's RAM (``CPU:0``) or its GPU's total."""
    if is_cpu(device):
        cap = os.environ.get(CPU_CAP_VAR, "")
        if cap.isdigit():
            return Limit(int(cap) * 2**20, CPU_CAP_VAR)
        return Limit(host_total, HOST_RAM) if host_total else None
    tf = sys.modules.get("tensorflow")
    return tf_gpu_limit(index_of(device), tf_logical_gpus(tf) if tf is not None else [], totals)


# -- mode: TensorFlow's execution mode on the main thread, and putting it back after an interrupt
@dataclass(frozen=True)
class Mode:
    """The thread's execution mode and the depth of its two context stacks."""

    eager: bool
    switches: int  # TF's context switches (1 at a cell's top level: eager)
    graphs: int  # graphs entered as the default (0 at a cell's top level)


_primed: set[str] = set()  # "graph", then "eager" once TensorFlow's runtime is up


def prime_nest_checks() -> None:
    """Have TensorFlow's nest cache its type checks of the leaves every trace meets, while a
    Ctrl-C is held (before a cell): graph tensors, numpy's and Python's values, dicts, tuples
    and lists, and eager tensors once the runtime is up (making one earlier would start it).

    ``nest.flatten`` (every trace) asks a C++ cache whether a leaf's type is a CompositeTensor;
    the first time per type that runs ``ABCMeta.__instancecheck__`` in Python, and a Ctrl-C
    raised there is taken for "yes" (an error read as a ``bool``) and cached for the process's
    life: every later ``fit`` fails with "'SymbolicTensor' object has no attribute
    '_type_spec'". Once a type is cached, no Python runs there.
    """
    if "eager" in _primed or (tf := loaded("tensorflow")) is None:
        return
    eager = runtime_initialized()
    if "graph" in _primed and not eager:  # every cell until the runtime starts: nothing to do
        return
    leaves: list[Any] = [tf.constant(0.0)] if eager else []
    if "graph" not in _primed:
        numpy = sys.modules.get("numpy")
        # and the containers a trace flattens: a dict's first check, interrupted, failed every
        # later fit with "'dict' object has no attribute '_type_spec'" (seen once in CI)
        leaves += [0, 0.0, True, "", b"", None, {"": 0}, (0,)]
        leaves += [numpy.zeros(1)] if numpy else []
        with tf.Graph().as_default():
            leaves.append(tf.constant(0.0))
    tf.nest.flatten(leaves, expand_composites=True)
    _primed.update(("graph", "eager") if eager else ("graph",))


def _stacks() -> tuple[Any, list[Any], list[Any]] | None:
    """Return the eager context, its stack of context switches and the default-graph stack of
    this thread, or None before TensorFlow is imported (never imports it)."""
    ctx, ops = tf_context(), sys.modules.get("tensorflow.python.framework.ops")
    if ctx is None or ops is None:
        return None
    graphs = getattr(getattr(ops, "_default_graph_stack", None), "stack", ())
    return ctx, ctx.context_switches.stack, list(graphs)


def read_mode() -> Mode | None:
    """Return this thread's mode, or None before TensorFlow is imported (never imports it)."""
    if (found := _stacks()) is None:
        return None
    ctx, switches, graphs = found
    return Mode(bool(ctx.executing_eagerly()), len(switches), len(graphs))


def drop_stale_switches(before: Mode | None) -> int:
    """Pop the context switches left above ``before`` by blocks that are over; return how many.

    An entry stays while its block is open: a graph's while that graph is on the default-graph
    stack and the thread is in graph mode; an eager one (``init_scope`` in a graph) while a
    graph entered since ``before`` is still open. Anything above the last such entry is left by
    an interrupted entry or exit. Without ``before``: a thread as TensorFlow starts it.
    """
    try:
        start, found = before or Mode(True, 1, 0), _stacks()
        if found is None or len(found[1]) <= max(1, start.switches):  # a cell's end, nearly always
            return 0
        ctx, stack, graphs = found
        opened, depth = graphs[start.graphs :], len(stack)
        while len(stack) > max(1, start.switches):
            graph = getattr(stack[-1].enter_context_fn, "__self__", None)
            mine = any(g is graph for g in opened) and not ctx.executing_eagerly()
            if mine if graph is not None else opened:  # its block is still open
                break
            stack.pop()
        return depth - len(stack)
    except Exception:  # TF's private stacks renamed: a warning once, never a per-cell error
        say_once(["kerasmagic: could not read TensorFlow's context switches"], exc_info=True)
        return 0


def restore_eager(before: Mode) -> bool:
    """Switch the thread back to eager mode if it was eager ``before`` and is now in graph mode
    with no ``with`` block still open (both stacks as deep as before); True if it did."""
    if not before.eager or read_mode() != Mode(False, before.switches, before.graphs):
        return False  # other depths: a suspended block holds the switch, undone when collected
    ctx: Any = tf_context()
    ctx._thread_local_data.is_eager = True  # what Context._mode's finally does
    return bool(ctx.executing_eagerly())
