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
from types import CodeType
from typing import Any

from kerasmagic.backends import Backend, BackendDevice, BackendInfo, Modes, keras_backend
from kerasmagic.backends.tensorflow import runtime, stack
from kerasmagic.backends.tensorflow.graphs import (
    GraphInfo,
    clear_stale_traces,
    custom_gradient_count,
    estimate_bytes,
    function_count,
    purge_custom_gradients,
    read_graph,
    traced_ops,
)
from kerasmagic.backends.tensorflow.runtime import TfInfo, read_tf, tf_context
from kerasmagic.backends.tensorflow.runtime import reset_tf_peaks as reset_peaks
from kerasmagic.compat.registry import works

RESTORED_EAGER = (
    "kerasmagic: the error stopped TensorFlow as it left graph mode, which left it there; "
    "eager execution is on again, as before the cell"
)
RESTORED_SWITCHES = (
    "kerasmagic: the interrupt stopped TensorFlow as it entered or left a graph, which left "
    "{n} entr{ies} on its stack of context switches; removed, as before the cell"
)

# oneDNN's CPU allocator, TF's default where its statistics exist, skips tensors under 256 KB
# (a small CNN read 0 B); TF_CPU_ALLOCATOR_USE_BFC=true counts every one (notes/tf-memory.md).
UNCOUNTED_CPU = (
    "misses tensors under 256 KB; set TF_CPU_ALLOCATOR_USE_BFC=true before importing "
    "TensorFlow for the exact figure"
)


def cpu_uncounted() -> str | None:
    """What TF's CPU figures miss, or None where its BFC allocator counts every tensor."""
    bfc = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in ("true", "1")
    return None if bfc else UNCOUNTED_CPU


def in_use() -> bool:
    """TensorFlow is in use once imported (Keras under JAX/PyTorch does not import it)."""
    return "tensorflow" in sys.modules and tf_context() is not None


def info(tf: TfInfo, graph: GraphInfo) -> BackendInfo:
    """Return TensorFlow's figures from readings already taken."""
    module = sys.modules.get("tensorflow")
    version = getattr(module, "__version__", None)
    devices = tuple(
        BackendDevice(
            d.device,
            d.current_bytes,
            d.peak_bytes,
            kind=d.kind,
            uncounted=None if d.kind != "cpu" else cpu_uncounted(),
        )
        for d in tf.devices
    )
    on_gpu = bool(tf.gpu_devices)
    figures = {
        "default_graph_ops": graph.default_graph_ops,
        "custom_gradients": graph.custom_gradients,
        "functions": graph.functions,
    }
    caches = {k: v for k, v in figures.items() if v is not None}
    platform = None if not tf.initialized else ("gpu" if on_gpu else "cpu")
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
    result = purge_custom_gradients(run)
    graphs = "training graph" + ("" if result.dropped == 1 else "s")
    said = (
        [f"released {result.dropped} {graphs} (TF's gradient registry)"] if result.dropped else []
    )
    return said + ([result.message] if result.message else [])


def read_light() -> BackendInfo:
    """``read`` without the function library's count (~1 ms)."""
    return info(read_tf(), read_graph(functions=False))


def refresh(earlier: BackendInfo) -> BackendInfo:
    """Read from a background thread: the allocator and the process-wide graph figures afresh,
    the default graph's ops (per thread) as ``earlier`` had them."""
    graph = GraphInfo(
        default_graph_ops=earlier.caches.get("default_graph_ops"),
        custom_gradients=custom_gradient_count(),
        functions=function_count(),
    )
    return info(read_tf(), graph)


def allocated() -> int | None:
    """Return the bytes TensorFlow's allocators hold over every device with statistics."""
    return read_tf().current_bytes


def model_graphs(model: Any) -> tuple[int | None, int | None]:
    """Return the ops of ``model``'s traced functions and their estimated bytes."""
    ops = traced_ops(model)
    return ops, estimate_bytes(ops)


def purge(namespace: Mapping[str, Any]) -> int:
    """Free the gradient-registry entries of models that are gone, and again after clearing
    the traces ``namespace``'s tf.functions keep of variables that just died; return how many
    entries went."""
    dropped = purge_custom_gradients().dropped
    if clear_stale_traces(namespace, ()):
        dropped += purge_custom_gradients().dropped
    return dropped


def clear_traces(
    namespace: Mapping[str, Any], stale: Sequence[Any], roots: Sequence[Any]
) -> list[str]:
    """Free the traces of ``stale`` models held by tf.functions in ``namespace``."""
    return clear_stale_traces(namespace, stale, roots)


def attach(stop_at: Sequence[CodeType], patch: bool) -> str | None:
    """Op stack traces end at ``stop_at``'s frames; with ``patch``, once TensorFlow is
    imported, they are captured as strings only (``stack.py``). Return why not, if they
    cannot be."""
    for code in stop_at:
        stack.stop_at(code)
    return stack.install() if patch and "tensorflow" in sys.modules else None


def read_modes() -> runtime.Mode | None:
    """Return the main thread's mode (None before TensorFlow is imported, or if it moved)."""
    return runtime.read_mode() if works("tf.modes") else None


def put_back(before: object, failed: bool) -> list[str]:
    """Drop the context switches blocks that are over left (after any cell); after a failed
    one, switch eager execution back on if an interrupt left the thread in graph mode."""
    if not works("tf.modes"):  # moved: said once, by compat
        return []
    start = before if isinstance(before, runtime.Mode) else None
    said = []
    dropped = runtime.drop_stale_switches(start)
    if dropped:
        said.append(RESTORED_SWITCHES.format(n=dropped, ies="y" if dropped == 1 else "ies"))
    if failed and start is not None and runtime.restore_eager(start):
        said.append(RESTORED_EAGER)
    return said


def configure(growth: bool, limit_mb: int | None) -> str:
    """Memory growth or a cap per GPU, before TensorFlow starts its devices."""
    return runtime.configure_tensorflow(growth, limit_mb)


BACKEND = Backend(
    "tensorflow",
    in_use,
    read,
    reset,
    configure,
    reset_peaks,
    collect=collect,
    allocated=allocated,
    read_light=read_light,
    refresh=refresh,
    clear_traces=clear_traces,
    traced=model_graphs,
    registered=custom_gradient_count,
    purge=purge,
    attach=attach,
    detach=stack.uninstall,
    modes=Modes(read_modes, put_back),
    limit=runtime.device_limit,
)
