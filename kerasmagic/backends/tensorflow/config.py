"""TensorFlow's GPU memory settings, which only work before it starts its devices."""

from __future__ import annotations

import importlib

from kerasmagic.backends.tensorflow.alloc import runtime_initialized

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
