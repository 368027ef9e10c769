"""JAX: live arrays, compiled executables, per-device allocator and pre-allocation settings.

On a GPU, XLA pre-allocates 75% of the device at JAX's first operation, so NVML shows most of
the GPU as used whatever the model needs; the settings that change this are environment
variables read once, when JAX starts its backends.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from kerasmagic.backends import Backend, BackendDevice, BackendInfo, attempt, keras_backend
from kerasmagic.compat.registry import loaded, works

PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
MEM_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
ALLOCATOR = "XLA_PYTHON_CLIENT_ALLOCATOR"
PREALLOCATED = (
    "JAX pre-allocated most of this GPU (XLA_PYTHON_CLIENT_PREALLOCATE): NVML's figure is the "
    "pool, not the model; the JAX rows show what is in use"
)
TOO_LATE = (
    "too late: JAX has already started its devices in this kernel. Restart the kernel and run "
    "this first, or set {settings} before importing jax"
)


def _jax() -> Any | None:
    """Return the jax module once ``import jax`` has finished, else None."""
    return loaded("jax")


def started() -> bool:
    """Return True once JAX has created its backends (device memory may be taken)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is None or not works("jax.started"):  # moved: said once, by compat
        return False
    return bool(attempt(bridge.backends_are_initialized, False))


def in_use() -> bool:
    """JAX is in use when Keras runs on it, or JAX itself started devices (Keras imports JAX
    under the other backends too, without using it)."""
    return _jax() is not None and (keras_backend() == "jax" or started())


def preallocating() -> bool:
    """Return True when XLA's GPU client pre-allocates a pool (JAX's default)."""
    off = os.environ.get(PREALLOCATE, "true").strip().lower() in ("false", "0")
    return not off and os.environ.get(ALLOCATOR, "").strip().lower() != "platform"


def _device(device: Any) -> BackendDevice:
    stats = attempt(device.memory_stats, None) or {}
    return BackendDevice(
        name=f"{device.platform}:{device.id}",
        in_use_bytes=stats.get("bytes_in_use"),
        peak_bytes=stats.get("peak_bytes_in_use"),
        limit_bytes=stats.get("bytes_limit"),
        reserved_bytes=stats.get("bytes_reserved") or stats.get("pool_bytes"),
        kind=str(device.platform),
    )


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
    out: dict[str, int] = {}
    arrays = attempt(jax.live_arrays, None)
    if arrays is not None:
        out["live_arrays"] = len(arrays)
        out["live_array_bytes"] = sum(_nbytes(a) for a in arrays)
    compiled = compiled_count()
    if compiled is not None:
        out["compiled"] = compiled
    return out


def read() -> BackendInfo:
    """Return JAX's figures; before JAX starts its devices only its version."""
    jax = _jax()
    version = getattr(jax, "__version__", None)
    keras = keras_backend() == "jax"
    if jax is None or not started():
        note = "JAX has not started its devices yet (no device memory taken)"
        return BackendInfo("jax", version, keras, None, notes=(note,) if jax else ())
    platform = attempt(lambda: str(jax.default_backend()), None)
    found: list[Any] = attempt(jax.local_devices, [])
    devices = tuple(_device(d) for d in found)
    notes = (PREALLOCATED,) if platform == "gpu" and preallocating() else ()
    return BackendInfo("jax", version, keras, platform, devices, caches(jax), notes)


def reset() -> list[str]:
    """Empty JAX's jit/pjit compilation caches (they keep every traced model's executables)."""
    jax = _jax()
    if jax is None or not callable(getattr(jax, "clear_caches", None)):
        return []
    jax.clear_caches()
    return ["jax.clear_caches"]


def configure(growth: bool, limit_mb: int | None) -> str:
    """Set XLA's pre-allocation variables; they only count before JAX starts its devices."""
    settings = _settings(growth, limit_mb)
    if isinstance(settings, str):
        return settings
    shown = " and ".join(f"{k}={v}" for k, v in settings.items())
    if started():
        jax = _jax()
        platform = attempt(lambda: str(jax.default_backend()), None) if jax else None
        if platform == "cpu":
            return "JAX runs on the CPU in this kernel: no GPU memory to configure"
        return TOO_LATE.format(settings=shown)
    os.environ.update(settings)
    return f"{shown} set for JAX (read when JAX starts its devices)"


def _settings(growth: bool, limit_mb: int | None) -> dict[str, str] | str:
    """Return the environment for these options, or why there is nothing to set."""
    settings = {PREALLOCATE: "false"} if growth else {}
    if limit_mb is not None:
        from kerasmagic.probes import read_gpus

        gpus = read_gpus()
        if not gpus.devices:
            return f"no GPU to cap for JAX ({gpus.message or gpus.status})"
        total = min(d.total_bytes for d in gpus.devices)
        fraction = min(1.0, limit_mb * 2**20 / total)
        settings[MEM_FRACTION] = f"{fraction:.3f}"
    return settings


def reset_peaks() -> list[str]:
    """JAX has no call that resets its peak counters: nothing is reset."""
    return []


BACKEND = Backend("jax", in_use, read, reset, configure, reset_peaks)
