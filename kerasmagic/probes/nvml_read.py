"""The blocking NVML reading behind ``read_gpus``: session, re-initialisation, status values.

Runs on the NVML worker thread (``nvml_worker``); ``_lock`` serialises it with ``shutdown``.
Nothing here raises: every failure becomes a ``GpuInfo`` status with a one-line message.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import time
import warnings
from types import ModuleType
from typing import Any, cast

from kerasmagic.probes.nvml_devices import Visible, describe, is_error, read_device
from kerasmagic.probes.nvml_devices import visible_devices as resolve_visible
from kerasmagic.probes.nvml_types import GpuInfo

_lock = threading.Lock()
_nvml: ModuleType | None = None
_failure: GpuInfo | None = None  # remembered so a missing driver is not probed every sample
_visible: tuple[str | None, list[Visible]] | None = None  # (CUDA_VISIBLE_DEVICES, devices)
_last_good: tuple[float, GpuInfo] | None = None  # (time.monotonic(), reading)
DEPRECATED_PYNVML = "The pynvml package is deprecated"  # printed by that package's import hook


def remembered_failure() -> GpuInfo | None:
    """Return the start-up failure that every reading repeats, if there was one."""
    return _failure


def last_good() -> tuple[float, GpuInfo] | None:
    """Return (monotonic time, reading) of the newest "ok" reading, if any."""
    return _last_good


def _import_pynvml() -> ModuleType:
    """Import pynvml; the deprecated ``pynvml`` package's FutureWarning is not for our users.

    One filter is added and removed again, rather than ``catch_warnings``, which would put back
    the whole filter list and so drop any filter the main thread set meanwhile.
    """
    if sys.modules.get("pynvml") is not None:
        return importlib.import_module("pynvml")
    warnings.filterwarnings("ignore", DEPRECATED_PYNVML, FutureWarning)
    filters = cast("list[Any]", warnings.filters)  # a list at run time; typeshed says Sequence
    ours = filters[0]
    try:
        return importlib.import_module("pynvml")
    finally:
        with contextlib.suppress(ValueError):  # someone reset the filters meanwhile
            filters.remove(ours)


def _start() -> ModuleType | GpuInfo:
    """Return the initialised pynvml module, or the failure (remembered) that prevents it."""
    global _nvml, _failure
    if _nvml is not None:
        return _nvml
    try:
        module = _import_pynvml()
    except ImportError:
        _failure = GpuInfo("no_driver", "nvidia-ml-py (pynvml) is not installed", ())
        return _failure
    except Exception as exc:
        _failure = GpuInfo("error", f"pynvml failed to import: {describe(None, exc)}", ())
        return _failure
    try:
        module.nvmlInit()
    except AttributeError as exc:
        _failure = GpuInfo("error", describe(module, exc), ())
        return _failure
    except Exception as exc:  # NVMLError_LibraryNotFound, OSError, DriverNotLoaded, ...
        _failure = GpuInfo("no_driver", _no_driver(module, exc), ())
        return _failure
    _nvml = module
    return module


def _no_driver(nvml: ModuleType, exc: Exception) -> str:
    """Say what NVML's failure to start means to a person: no NVIDIA GPU here (no driver
    library at all), or a driver that is there and did not start (and why)."""
    missing = getattr(nvml, "NVMLError_LibraryNotFound", None)
    if isinstance(missing, type) and isinstance(exc, missing):
        return "no NVIDIA GPU"
    return f"no NVIDIA GPU in use: the NVIDIA driver did not start ({describe(nvml, exc)})"


def _visible_devices(nvml: ModuleType) -> list[Visible]:
    """Resolve the visible devices once per NVML session and CUDA_VISIBLE_DEVICES value."""
    global _visible
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if _visible is None or _visible[0] != spec:
        _visible = (spec, resolve_visible(nvml))
    return _visible[1]


def _read(nvml: ModuleType) -> GpuInfo:
    """Read every visible device; raises what the binding raises."""
    global _visible
    try:
        visible = _visible_devices(nvml)
        if not visible:
            if int(nvml.nvmlDeviceGetCount()) == 0:
                return GpuInfo("no_gpu", "the NVIDIA driver reports no GPU", ())
            return GpuInfo("hidden", "CUDA_VISIBLE_DEVICES hides every GPU", ())
        return GpuInfo("ok", None, tuple(read_device(nvml, i, v) for i, v in enumerate(visible)))
    except Exception:
        _visible = None  # a lost, reset or re-initialised GPU: resolve the devices again
        raise


def _read_or_restart(nvml: ModuleType) -> GpuInfo:
    """Read; if NVML was shut down under us (a user's ``nvmlShutdown()``), start it once again."""
    try:
        return _read(nvml)
    except Exception as exc:
        if not is_error(nvml, exc, "Uninitialized"):
            return GpuInfo("error", f"NVML error: {describe(nvml, exc)}", ())
    try:
        nvml.nvmlInit()
        return _read(nvml)
    except Exception as exc:
        why = describe(nvml, exc)
        return GpuInfo("error", f"not available: NVML was shut down and did not restart: {why}", ())


def read_now() -> GpuInfo:
    """Return a fresh reading of every GPU this process may use (blocks while NVML does)."""
    global _last_good
    with _lock:
        nvml = _start()
        if isinstance(nvml, GpuInfo):
            return nvml
        info = _read_or_restart(nvml)
        if info.status == "ok":
            _last_good = (time.monotonic(), info)
        return info


def shutdown(wait_s: float) -> bool:
    """Shut NVML down and forget everything; False if a reading still blocks after ``wait_s``."""
    global _nvml, _failure, _visible, _last_good
    if not _lock.acquire(timeout=wait_s):
        return False
    try:
        module, _nvml, _failure, _visible, _last_good = _nvml, None, None, None, None
        if module is not None:
            with contextlib.suppress(Exception):  # already shut down by the user, a lost GPU
                module.nvmlShutdown()
    finally:
        _lock.release()
    return True
