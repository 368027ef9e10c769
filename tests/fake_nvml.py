"""A stand-in ``pynvml`` module, injected through ``sys.modules`` (the seam the probe imports)."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any


class NVMLError(Exception):
    """Base of the fake NVML errors, as in nvidia-ml-py."""


class NVMLError_LibraryNotFound(NVMLError):
    """Raised by nvmlInit when libnvidia-ml.so is absent."""


@dataclass
class FakeGpu:
    name: str
    uuid: str
    total: int
    used: int
    procs: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)


def make_pynvml(
    gpus: list[FakeGpu],
    *,
    init_error: Exception | None = None,
    memory_error: Exception | None = None,
) -> types.ModuleType:
    """Return a module with the pynvml calls the probe uses, backed by ``gpus``."""
    mod = types.ModuleType("pynvml")
    state: dict[str, Any] = {"init": 0, "shutdown": 0}

    def nvmlInit() -> None:
        if init_error is not None:
            raise init_error
        state["init"] += 1

    def nvmlShutdown() -> None:
        state["shutdown"] += 1

    def by_uuid(uuid: str) -> FakeGpu:
        for gpu in gpus:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLError("Not Found")

    def memory(handle: FakeGpu) -> Any:
        if memory_error is not None:
            raise memory_error
        return types.SimpleNamespace(
            total=handle.total, used=handle.used, free=handle.total - handle.used
        )

    mod.__dict__.update(
        NVMLError=NVMLError,
        NVMLError_LibraryNotFound=NVMLError_LibraryNotFound,
        nvmlInit=nvmlInit,
        nvmlShutdown=nvmlShutdown,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: gpus[i],
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetName=lambda h: h.name.encode(),  # old bindings return bytes
        nvmlDeviceGetUUID=lambda h: h.uuid,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in h.procs
        ],
        state=state,
    )
    return mod
