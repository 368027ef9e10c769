"""TensorFlow's own allocator figures, read only when the user has imported TensorFlow."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from kerasmagic.compat.reaches import works


@dataclass(frozen=True)
class TfDeviceMemory:
    """Bytes TensorFlow's allocator has in use on one device now and at its peak.

    ``kind`` is "cpu" or "gpu": with oneDNN (TensorFlow's default on x86-64 Linux) or
    ``TF_CPU_ALLOCATOR_USE_BFC=true``, CPU tensors live on a BFC allocator that keeps the same
    exact statistics as a GPU's.
    """

    device: str
    current_bytes: int
    peak_bytes: int
    kind: str = "gpu"


@dataclass(frozen=True)
class TfInfo:
    """Whether TensorFlow is imported and its runtime started, and allocator use per device."""

    imported: bool
    initialized: bool
    devices: tuple[TfDeviceMemory, ...]

    @property
    def current_bytes(self) -> int | None:
        """Return the bytes of TensorFlow tensors over every device that keeps statistics."""
        return sum(d.current_bytes for d in self.devices) if self.devices else None

    @property
    def gpu_devices(self) -> tuple[TfDeviceMemory, ...]:
        """Return the GPU devices only (what VRAM is compared with)."""
        return tuple(d for d in self.devices if d.kind == "gpu")


def tf_context() -> Any | None:
    """Return TensorFlow's eager context if TensorFlow is imported, without importing it.

    None while ``import tensorflow`` is still running (another thread may be sampling).
    """
    module = sys.modules.get("tensorflow.python.eager.context")
    top = sys.modules.get("tensorflow")
    if module is None or top is None or getattr(top.__spec__, "_initializing", False):
        return None
    return module.context() if works("tf.context") else None  # moved: said once, by compat


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


def stat_device_names() -> list[tuple[str, str]]:
    """Return (name, kind) of every device whose allocator may keep statistics: CPU:0, GPUs."""
    if not runtime_initialized():
        return []
    return [("CPU:0", "cpu")] + [(name, "gpu") for name in gpu_device_names()]


def read_tf() -> TfInfo:
    """Return allocator use per device; never imports TensorFlow or starts its runtime.

    A device without statistics (CPU with ``TF_ENABLE_ONEDNN_OPTS=0``, some builds) is left out.
    """
    if "tensorflow" not in sys.modules or tf_context() is None:
        return TfInfo(imported=False, initialized=False, devices=())
    if not runtime_initialized():
        return TfInfo(imported=True, initialized=False, devices=())
    tf = sys.modules["tensorflow"]
    devices = []
    for name, kind in stat_device_names():
        try:
            info = tf.config.experimental.get_memory_info(name)
        except (ValueError, RuntimeError):  # "Allocator stats not available" on this device
            continue
        devices.append(TfDeviceMemory(name, int(info["current"]), int(info["peak"]), kind))
    return TfInfo(imported=True, initialized=True, devices=tuple(devices))


def reset_tf_peaks() -> list[str]:
    """Reset TensorFlow's peak counter on every device that keeps one; return those reset."""
    if not runtime_initialized():
        return []
    tf = sys.modules["tensorflow"]
    done = []
    for name, _ in stat_device_names():
        try:
            tf.config.experimental.reset_memory_stats(name)
        except (ValueError, RuntimeError):
            continue
        done.append(name)
    return done
