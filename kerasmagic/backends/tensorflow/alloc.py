"""TensorFlow's own allocator figures, read only when the user has imported TensorFlow."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TfDeviceMemory:
    """Bytes TensorFlow's allocator has in use on one device now and at its peak."""

    device: str
    current_bytes: int
    peak_bytes: int


@dataclass(frozen=True)
class TfInfo:
    """Whether TensorFlow is imported and its runtime started, and per-GPU allocator use."""

    imported: bool
    initialized: bool
    devices: tuple[TfDeviceMemory, ...]

    @property
    def current_bytes(self) -> int | None:
        """Return the allocator's bytes in use over all GPUs, or None without a GPU allocator."""
        return sum(d.current_bytes for d in self.devices) if self.devices else None


def tf_context() -> Any | None:
    """Return TensorFlow's eager context if TensorFlow is imported, without importing it.

    None while ``import tensorflow`` is still running (another thread may be sampling).
    """
    module = sys.modules.get("tensorflow.python.eager.context")
    top = sys.modules.get("tensorflow")
    if module is None or top is None or getattr(top.__spec__, "_initializing", False):
        return None
    return module.context()


def runtime_initialized() -> bool:
    """Return True once TensorFlow has created its devices (GPU memory may be taken)."""
    ctx = tf_context()
    return ctx is not None and getattr(ctx, "_context_handle", None) is not None


def gpu_device_names() -> list[str]:
    """Return TensorFlow's logical GPU names ("GPU:0", ...) once its runtime is up."""
    ctx = tf_context()
    if ctx is None or not runtime_initialized():
        return []
    return [f"GPU:{i}" for i, _ in enumerate(ctx.list_logical_devices("GPU"))]


def read_tf() -> TfInfo:
    """Return allocator use per GPU; never imports TensorFlow or starts its runtime."""
    if "tensorflow" not in sys.modules or tf_context() is None:
        return TfInfo(imported=False, initialized=False, devices=())
    if not runtime_initialized():
        return TfInfo(imported=True, initialized=False, devices=())
    tf = sys.modules["tensorflow"]
    devices = []
    for name in gpu_device_names():
        try:
            info = tf.config.experimental.get_memory_info(name)
        except (ValueError, RuntimeError):  # "Allocator stats not available" (CPU, some builds)
            continue
        devices.append(TfDeviceMemory(name, int(info["current"]), int(info["peak"])))
    return TfInfo(imported=True, initialized=True, devices=tuple(devices))


def reset_peaks() -> list[str]:
    """Reset the peak counters of every backend in use (TF, PyTorch); return the devices reset."""
    from kerasmagic.backends import reset_peaks_active

    return reset_tf_peaks() + reset_peaks_active(skip=("tensorflow",))


def reset_tf_peaks() -> list[str]:
    """Reset TensorFlow's peak counter on every GPU; return the devices reset."""
    if not runtime_initialized():
        return []
    tf = sys.modules["tensorflow"]
    done = []
    for name in gpu_device_names():
        try:
            tf.config.experimental.reset_memory_stats(name)
        except (ValueError, RuntimeError):
            continue
        done.append(name)
    return done
