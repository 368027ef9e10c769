"""TensorFlow: allocator per device (CPU:0 and GPUs), graph and function caches.

The TensorFlow internals live beside this module: ``alloc`` (allocator per device), ``graph``
(default graph, gradient registry, function library), ``config`` (growth / memory cap),
``purge`` (custom-gradient registry), ``traces`` (tf.function traces of dropped models),
``stack`` + ``tracetree`` (string op stack traces), ``traced`` (a model's traced graphs) and
``mode`` (the main thread's eager mode, put back after an interrupt left it in graph mode).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from kerasmagic.backends import Backend, BackendDevice, BackendInfo, keras_backend
from kerasmagic.backends.tensorflow import stack
from kerasmagic.backends.tensorflow.alloc import TfInfo, read_tf, tf_context
from kerasmagic.backends.tensorflow.alloc import reset_tf_peaks as reset_peaks
from kerasmagic.backends.tensorflow.graph import GraphInfo, read_graph
from kerasmagic.backends.tensorflow.purge import purge_custom_gradients


def in_use() -> bool:
    """TensorFlow is in use once imported (Keras under JAX/PyTorch does not import it)."""
    return "tensorflow" in sys.modules and tf_context() is not None


def info(tf: TfInfo, graph: GraphInfo) -> BackendInfo:
    """Return TensorFlow's figures from readings already taken."""
    module = sys.modules.get("tensorflow")
    version = getattr(module, "__version__", None)
    devices = tuple(
        BackendDevice(d.device, d.current_bytes, d.peak_bytes, kind=d.kind) for d in tf.devices
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


def configure(growth: bool, limit_mb: int | None) -> str:
    """Memory growth or a cap per GPU, before TensorFlow starts its devices."""
    from kerasmagic.backends.tensorflow.config import configure_tensorflow

    return configure_tensorflow(growth, limit_mb)


BACKEND = Backend("tensorflow", in_use, read, reset, configure, reset_peaks, collect=collect)
