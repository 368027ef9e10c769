"""JAX: live arrays, compiled executables, per-device allocator and pre-allocation settings.

On a GPU, XLA pre-allocates 75% of the device at JAX's first operation, so NVML shows most of
the GPU as used whatever the model needs; the settings that change this are environment
variables read once, when JAX starts its backends.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from kerasmagic.backends import BackendDevice, BackendInfo, attempt, keras_backend
from kerasmagic.compat.registry import loaded, works

PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
ALLOCATOR = "XLA_PYTHON_CLIENT_ALLOCATOR"
PREALLOCATED = (
    "JAX pre-allocated most of this GPU (XLA_PYTHON_CLIENT_PREALLOCATE): NVML's figure is the "
    "pool, not the model; the JAX rows show what is in use"
)
TOO_LATE = (
    "too late: JAX has already started its devices in this kernel. Restart the kernel and run "
    "this first, or set {settings} before importing jax"
)


def started() -> bool:
    """Return True once JAX has created its backends (device memory may be taken)."""
    # moved: said once, by compat
    if (bridge := sys.modules.get("jax._src.xla_bridge")) is None or not works("jax.started"):
        return False
    return bool(attempt(bridge.backends_are_initialized, False))


def in_use() -> bool:
    """JAX is in use when Keras runs on it, or JAX itself started devices (Keras imports JAX
    under the other backends too, without using it)."""
    return loaded("jax") is not None and (keras_backend() == "jax" or started())


def preallocating() -> bool:
    """Return True when XLA's GPU client pre-allocates a pool (JAX's default)."""
    off = os.environ.get(PREALLOCATE, "true").strip().lower() in ("false", "0")
    return not off and os.environ.get(ALLOCATOR, "").strip().lower() != "platform"


def _device(device: Any) -> BackendDevice:
    stats = attempt(device.memory_stats, None) or {}
    reserved = stats.get("bytes_reserved") or stats.get("pool_bytes")
    name, kind = f"{device.platform}:{device.id}", str(device.platform)
    used, peak, limit = (stats.get(k) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit"))
    return BackendDevice(name, used, peak, limit, reserved, kind)


def compiled_count() -> int | None:
    """Return how many compiled executables JAX's in-memory compilation cache holds."""
    pxla = sys.modules.get("jax._src.interpreters.pxla")
    if pxla is None or not works("jax.compiled"):  # moved: said once, by compat
        return None
    return attempt(lambda: int(pxla._cached_compilation.cache_info().currsize), None)


def _nbytes(array: Any) -> int:
    return attempt(lambda: int(array.nbytes), 0)


def caches(jax: Any) -> dict[str, int]:
    """Return live arrays (count, bytes) and compiled executables, where readable."""
    arrays = attempt(jax.live_arrays, None)
    nbytes = sum(_nbytes(a) for a in arrays or ())
    out = {} if arrays is None else {"live_arrays": len(arrays), "live_array_bytes": nbytes}
    compiled = compiled_count()
    return out if compiled is None else {**out, "compiled": compiled}


def _platform(jax: Any) -> str | None:
    return attempt(lambda: str(jax.default_backend()), None)


def read() -> BackendInfo:
    """Return JAX's figures; before JAX starts its devices only its version."""
    jax = loaded("jax")
    version, keras = getattr(jax, "__version__", None), keras_backend() == "jax"
    if jax is None or not started():
        note = "JAX has not started its devices yet (no device memory taken)"
        return BackendInfo("jax", version, keras, None, notes=(note,) if jax else ())
    platform = _platform(jax)
    devices = tuple(_device(d) for d in attempt(jax.local_devices, list[Any]()))
    notes = (PREALLOCATED,) if platform == "gpu" and preallocating() else ()
    return BackendInfo("jax", version, keras, platform, devices, caches(jax), notes)


def reset() -> list[str]:
    """Empty JAX's jit/pjit compilation caches (they keep every traced model's executables)."""
    if (jax := loaded("jax")) is None or not callable(getattr(jax, "clear_caches", None)):
        return []
    jax.clear_caches()
    return ["jax.clear_caches"]


def configure(growth: bool, limit_mb: int | None) -> str:
    """Set XLA's pre-allocation variables; they only count before JAX starts its devices."""
    settings = {PREALLOCATE: "false"} if growth else {}
    if limit_mb is not None:
        from kerasmagic.probes import read_gpus

        gpus = read_gpus()
        if not gpus.devices:
            return f"no GPU to cap for JAX ({gpus.message or gpus.status})"
        total = min(d.total_bytes for d in gpus.devices)
        settings["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{min(1.0, limit_mb * 2**20 / total):.3f}"
    shown = " and ".join(f"{k}={v}" for k, v in settings.items())
    if started() and _platform(loaded("jax")) == "cpu":
        return "JAX runs on the CPU in this kernel: no GPU memory to configure"
    if started():
        return TOO_LATE.format(settings=shown)
    os.environ.update(settings)
    return f"{shown} set for JAX (read when JAX starts its devices)"


modes = None  # no thread-wide modes to put back
