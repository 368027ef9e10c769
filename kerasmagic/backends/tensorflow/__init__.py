"""TensorFlow: allocator per device (CPU:0 and GPUs), graph and function caches.

The TensorFlow internals live beside this module: ``runtime`` (allocator per device, growth /
memory cap, each device's limit, the thread's eager mode), ``graphs`` (default graph, gradient
registry, function library, a model's traced graphs, tf.function traces of dropped models) and
``stack`` (string op stack traces).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import CodeType
from typing import Any

from kerasmagic.backends import BackendDevice, BackendInfo, Modes, attempt, keras_backend
from kerasmagic.backends.tensorflow import graphs, runtime, stack
from kerasmagic.backends.tensorflow.graphs import GraphInfo, custom_gradient_count, read_graph
from kerasmagic.backends.tensorflow.runtime import read_tf
from kerasmagic.compat.registry import works

RESTORED_EAGER = (
    "kerasmagic: the error stopped TensorFlow as it left graph mode, which left it there; "
    "eager execution is on again, as before the cell"
)
RESTORED_SWITCHES = (
    "kerasmagic: the interrupt stopped TensorFlow as it entered or left a graph, which left "
    "{n} entr{ies} on its stack of context switches; removed, as before the cell"
)


def cpu_uncounted() -> str | None:
    """What TF's CPU figures miss, or None where its BFC allocator counts every tensor.

    oneDNN's CPU allocator, TF's default where its statistics exist, skips tensors under 256 KB
    (a small CNN read 0 B); TF_CPU_ALLOCATOR_USE_BFC=true counts every one (notes/tf-memory.md).
    """
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in ("true", "1"):
        return None
    return (
        "misses tensors under 256 KB; set TF_CPU_ALLOCATOR_USE_BFC=true before importing "
        "TensorFlow for the exact figure"
    )


def in_use() -> bool:
    """TensorFlow is in use once imported (Keras under JAX/PyTorch does not import it)."""
    return "tensorflow" in sys.modules and runtime.tf_context() is not None


def info(tf: tuple[BackendDevice, ...] | None, graph: GraphInfo) -> BackendInfo:
    """Return TensorFlow's figures from readings already taken (``read_tf``'s: None before its
    runtime started)."""
    version = getattr(sys.modules.get("tensorflow"), "__version__", None)
    miss = cpu_uncounted()  # a GPU's BFC allocator counts every tensor
    devices = tuple(replace(d, uncounted=miss if d.kind == "cpu" else None) for d in tf or ())
    caches = {k: v for k, v in vars(graph).items() if v is not None}
    platform = None if tf is None else "gpu" if any(d.kind == "gpu" for d in devices) else "cpu"
    keras = keras_backend() == "tensorflow"
    return BackendInfo("tensorflow", version, keras, platform, devices, caches)


def read() -> BackendInfo:
    """Return TensorFlow's figures (never imports TensorFlow or starts its runtime)."""
    return info(read_tf(), read_graph())


def reset() -> list[str]:
    """Forget the string op traces (they name old cells' frames); reset TF's default graph
    unless Keras's ``clear_session`` (TF or tf-keras) just did."""
    stack.clear_cache()
    if keras_backend() == "tensorflow":
        return []
    try:
        sys.modules["tensorflow"].compat.v1.reset_default_graph()
    except (AssertionError, RuntimeError):  # inside a `with graph.as_default()` block
        return []
    return ["tensorflow.reset_default_graph"]


def collect(run: Callable[[], object]) -> list[str]:
    """Run the collection with the gradient registry's entries parked, so the entries of the
    graphs that go with it go too; say how many went, or why none could."""
    result = graphs.purge_custom_gradients(run)
    n = result.dropped
    said = [f"released {n} training graph{'' if n == 1 else 's'} (TF's gradient registry)"]
    return (said if n else []) + ([result.message] if result.message else [])


def refresh(earlier: BackendInfo) -> BackendInfo:
    """Read from a background thread: the allocator and the process-wide graph figures afresh,
    the default graph's ops (per thread) as ``earlier`` had them."""
    ops = earlier.caches.get("default_graph_ops")
    return info(read_tf(), GraphInfo(ops, custom_gradient_count(), graphs.function_count()))


def purge(namespace: Mapping[str, Any]) -> int:
    """Free the gradient-registry entries of models that are gone, and again after clearing
    the traces ``namespace``'s tf.functions keep of variables that just died; return how many
    entries went."""
    dropped = graphs.purge_custom_gradients().dropped
    if graphs.clear_stale_traces(namespace, ()):
        dropped += graphs.purge_custom_gradients().dropped
    return dropped


def attach(stop_at: Sequence[CodeType], patch: bool) -> str | None:
    """Op stack traces end at ``stop_at``'s frames; with ``patch``, once TensorFlow is
    imported, they are captured as strings only (``stack.py``). Return why not, if they
    cannot be."""
    for code in stop_at:
        stack.stop_at(code)
    return stack.install() if patch and "tensorflow" in sys.modules else None


def read_modes() -> runtime.Mode | None:
    """Before each cell: prime nest's type checks (``runtime.prime_nest_checks``, once), then
    read the thread's mode."""
    attempt(runtime.prime_nest_checks, None, "tensorflow.prime_nest_checks")
    return runtime.read_mode() if works("tf.modes") else None


def put_back(before: object, failed: bool) -> list[str]:
    """Drop the context switches blocks that are over left (after any cell); after a failed
    one, switch eager execution back on if an interrupt left the thread in graph mode."""
    if not works("tf.modes"):  # moved: said once, by compat
        return []
    start = before if isinstance(before, runtime.Mode) else None
    n = runtime.drop_stale_switches(start)
    said = [RESTORED_SWITCHES.format(n=n, ies="y" if n == 1 else "ies")] if n else []
    if failed and start is not None and runtime.restore_eager(start):
        said.append(RESTORED_EAGER)
    return said


def allocated() -> int | None:
    """Return the bytes TensorFlow's allocator holds now over every device that keeps statistics
    (the cleanup report's figure)."""
    return read_light().in_use_bytes


def read_light() -> BackendInfo:
    """Return ``read()`` less the function library's size (~1 ms)."""
    return info(read_tf(), read_graph(functions=False))


def traced(model: Any) -> tuple[int | None, int | None]:
    """Return the ops in the graphs ``model``'s traced functions hold, and their estimated bytes."""
    ops = graphs.traced_ops(model)
    return ops, ops and ops * graphs.OP_BYTES


# The rest of the interface of ``kerasmagic.backends``.
configure, reset_peaks = runtime.configure_tensorflow, runtime.reset_tf_peaks
clear_traces, registered = graphs.clear_stale_traces, custom_gradient_count
detach, limit = stack.uninstall, runtime.device_limit
modes = Modes(read_modes, put_back)
