"""Which NVML devices this process sees, and what one device reads: memory and our share.

Every function here may raise whatever the binding raises; ``nvml_read`` turns that into a
status. ``is_error(nvml, exc, "Uninitialized")`` tells NVML's own error classes apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psutil

from kerasmagic.probes.nvml_types import GpuDevice

PROCESS_QUERY = "nvmlDeviceGetComputeRunningProcesses"


def text(value: Any) -> str:
    """Return a binding's string (old bindings return bytes) or an error as one line."""
    return " ".join((value.decode() if isinstance(value, bytes) else str(value)).split())


def is_error(nvml: ModuleType, exc: BaseException, kind: str) -> bool:
    """Return True if ``exc`` is the binding's ``NVMLError_<kind>``."""
    cls = getattr(nvml, f"NVMLError_{kind}", None)
    return isinstance(cls, type) and isinstance(exc, cls)


def describe(nvml: ModuleType | None, exc: Exception) -> str:
    """Return one line saying what went wrong."""
    if nvml is not None and isinstance(exc, AttributeError) and getattr(exc, "obj", None) is nvml:
        return f"this pynvml has no {exc.name}: install a current nvidia-ml-py"
    base = getattr(nvml, "NVMLError", None)
    message = text(exc)
    if isinstance(base, type) and isinstance(exc, base):
        return message or type(exc).__name__
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


@dataclass(frozen=True)
class Visible:
    """What never changes about a visible device while NVML stays initialised."""

    nvml_index: int | None
    handle: Any
    uuid: str
    name: str


def visible_devices(nvml: ModuleType) -> list[Visible]:
    """Return each device CUDA_VISIBLE_DEVICES lets CUDA see, in CUDA's order."""
    return [
        Visible(n, h, text(nvml.nvmlDeviceGetUUID(h)), text(nvml.nvmlDeviceGetName(h)))
        for n, h in _visible_handles(nvml)
    ]


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
        if text(nvml.nvmlDeviceGetUUID(handle)).startswith(uuid):
            return i, handle
    return None, nvml.nvmlDeviceGetHandleByUUID(uuid)  # MIG instances are not indexed


def _process_share(nvml: ModuleType, handle: Any) -> tuple[int | None, str | None]:
    """Return this PID's usage (0 if absent), or None and why it is not available."""
    try:
        procs = getattr(nvml, PROCESS_QUERY)(handle)
    except Exception as exc:
        if is_error(nvml, exc, "Uninitialized"):
            raise  # the whole reading starts NVML again
        hint = " (usual on WSL2 and vGPU)" if is_error(nvml, exc, "NotSupported") else ""
        return None, f"not available: NVML's process list failed: {describe(nvml, exc)}{hint}"
    mine = [p for p in procs if int(p.pid) == os.getpid()]
    if mine:
        used = [p.usedGpuMemory for p in mine]
        if any(u is None for u in used):
            return None, "unknown: the driver does not report per-process use"
        return sum(int(u) for u in used), None
    if any(not psutil.pid_exists(int(p.pid)) for p in procs):
        return None, "unknown: NVML lists PIDs of another PID namespace (a container)"
    return 0, None


def read_device(nvml: ModuleType, cuda_index: int, visible: Visible) -> GpuDevice:
    """Read one device's memory; its per-process share degrades on its own."""
    mem = nvml.nvmlDeviceGetMemoryInfo(visible.handle)
    mine, note = _process_share(nvml, visible.handle)
    return GpuDevice(
        cuda_index=cuda_index,
        nvml_index=visible.nvml_index,
        uuid=visible.uuid,
        name=visible.name,
        total_bytes=int(mem.total),
        used_bytes=int(mem.used),
        process_used_bytes=mine,
        process_note=note,
    )
