"""Per-GPU memory read through NVML (the ``pynvml`` module of nvidia-ml-py).

NVML is initialised on the first reading, never at import, and shut down at exit. Every failure
is a value (``GpuInfo.status``), never an exception: a machine without an NVIDIA driver is an
ordinary case, not an error.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import psutil

GpuStatus = Literal["ok", "no_driver", "no_gpu", "hidden", "error"]


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as CUDA sees it in this process, memory in bytes."""

    cuda_index: int
    nvml_index: int | None
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    process_used_bytes: int | None  # None: NVML lists processes under PIDs we cannot match


@dataclass(frozen=True)
class GpuInfo:
    """All GPUs visible to this process, or why there are none."""

    status: GpuStatus
    message: str | None
    devices: tuple[GpuDevice, ...]

    @property
    def used_bytes(self) -> int | None:
        """Return this process's VRAM over all GPUs, else the devices' total use, else None."""
        if not self.devices:
            return None
        mine = [d.process_used_bytes for d in self.devices]
        if all(m is not None for m in mine):
            return sum(m for m in mine if m is not None)
        return sum(d.used_bytes for d in self.devices)


_lock = threading.Lock()
_nvml: ModuleType | None = None
_failure: GpuInfo | None = None  # remembered so a missing driver is not probed every sample


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _session() -> ModuleType:
    """Return the initialised pynvml module, initialising it once."""
    global _nvml
    with _lock:
        if _nvml is None:
            module = importlib.import_module("pynvml")
            module.nvmlInit()
            _nvml = module
            atexit.register(shutdown)
        return _nvml


def shutdown() -> None:
    """Shut NVML down and forget failures; the next reading initialises it again."""
    global _nvml, _failure, _visible
    with _lock:
        module, _nvml, _failure, _visible = _nvml, None, None, None
    if module is not None:
        with contextlib.suppress(Exception):
            module.nvmlShutdown()


def _visible_handles(nvml: ModuleType) -> list[tuple[int | None, Any]]:
    """Return (NVML index, handle) for each device CUDA_VISIBLE_DEVICES lets CUDA see."""
    count = int(nvml.nvmlDeviceGetCount())
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
    handles: list[tuple[int | None, Any]] = []
    for item in (part.strip() for part in spec.split(",")):
        if item.isdigit():
            if int(item) >= count:
                break  # CUDA ignores this entry and everything after it
            handles.append((int(item), nvml.nvmlDeviceGetHandleByIndex(int(item))))
        elif item.startswith(("GPU-", "MIG-")):
            handles.append(_handle_by_uuid(nvml, item, count))
        else:
            break
    return handles


def _handle_by_uuid(nvml: ModuleType, uuid: str, count: int) -> tuple[int | None, Any]:
    """Find a device by full or prefix UUID, as CUDA accepts both."""
    for i in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        if _text(nvml.nvmlDeviceGetUUID(handle)).startswith(uuid):
            return i, handle
    return None, nvml.nvmlDeviceGetHandleByUUID(uuid)  # MIG instances are not indexed


def _process_used_bytes(nvml: ModuleType, handle: Any) -> int | None:
    """Return this PID's usage, 0 if absent, None if NVML's PIDs are not ours to match."""
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    mine = [p for p in procs if int(p.pid) == os.getpid()]
    if mine:
        used = [p.usedGpuMemory for p in mine]
        return None if any(u is None for u in used) else sum(int(u) for u in used)
    if any(not psutil.pid_exists(int(p.pid)) for p in procs):
        return None  # another PID namespace (a container): our entry may be among them
    return 0


@dataclass(frozen=True)
class _Visible:
    """What never changes about a visible device while NVML stays initialised."""

    nvml_index: int | None
    handle: Any
    uuid: str
    name: str


_visible: tuple[str | None, list[_Visible]] | None = None  # (CUDA_VISIBLE_DEVICES, devices)


def _visible_devices(nvml: ModuleType) -> list[_Visible]:
    """Resolve the visible devices once per NVML session and CUDA_VISIBLE_DEVICES value."""
    global _visible
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if _visible is None or _visible[0] != spec:
        devices = [
            _Visible(n, h, _text(nvml.nvmlDeviceGetUUID(h)), _text(nvml.nvmlDeviceGetName(h)))
            for n, h in _visible_handles(nvml)
        ]
        _visible = (spec, devices)
    return _visible[1]


def _device(nvml: ModuleType, cuda_index: int, visible: _Visible) -> GpuDevice:
    mem = nvml.nvmlDeviceGetMemoryInfo(visible.handle)
    return GpuDevice(
        cuda_index=cuda_index,
        nvml_index=visible.nvml_index,
        uuid=visible.uuid,
        name=visible.name,
        total_bytes=int(mem.total),
        used_bytes=int(mem.used),
        process_used_bytes=_process_used_bytes(nvml, visible.handle),
    )


def read_gpus() -> GpuInfo:
    """Return memory of every GPU this process may use; failures become a status."""
    global _failure
    if _failure is not None:
        return _failure
    try:
        nvml = _session()
    except ImportError:
        _failure = GpuInfo("no_driver", "nvidia-ml-py (pynvml) is not installed", ())
        return _failure
    except Exception as exc:
        _failure = GpuInfo("no_driver", f"no NVIDIA driver: {exc}", ())
        return _failure
    global _visible
    try:
        visible = _visible_devices(nvml)
        if not visible:
            if int(nvml.nvmlDeviceGetCount()) == 0:
                return GpuInfo("no_gpu", "the NVIDIA driver reports no GPU", ())
            return GpuInfo("hidden", "CUDA_VISIBLE_DEVICES hides every GPU", ())
        devices = tuple(_device(nvml, i, v) for i, v in enumerate(visible))
    except Exception as exc:
        _visible = None  # a lost or reset GPU: resolve the devices again next time
        return GpuInfo("error", f"NVML error: {exc}", ())
    return GpuInfo("ok", None, devices)
