"""A stand-in ``pynvml`` module, injected through ``sys.modules`` (the seam the probe imports).

Like nvidia-ml-py it counts ``nvmlInit``/``nvmlShutdown`` calls: once the count drops to zero
every device call raises ``NVMLError_Uninitialized``, as after a user's own ``nvmlShutdown()``.
"""

from __future__ import annotations

import threading
import types
from dataclasses import dataclass, field
from typing import Any


class NVMLError(Exception):
    """Base of the fake NVML errors, as in nvidia-ml-py."""


class NVMLError_Uninitialized(NVMLError):
    """Raised by every call while NVML is not initialised."""

    def __str__(self) -> str:
        return "Uninitialized"


class NVMLError_NotSupported(NVMLError):
    """Raised by queries the platform lacks (per-process use on WSL2 and vGPU)."""

    def __str__(self) -> str:
        return "Not Supported"


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
    """Return a module with the pynvml calls the probe uses, backed by ``gpus``.

    ``state`` holds the counts, and knobs a test may turn while the module is in use:
    ``init_error``, ``procs_error`` (raised by the per-process query), ``hang_s`` (the memory
    call blocks that long, or until ``release`` is set) and ``memory_calls``.
    """
    mod = types.ModuleType("pynvml")
    state: dict[str, Any] = {
        "init": 0,
        "shutdown": 0,
        "refs": 0,
        "init_error": init_error,
        "procs_error": None,
        "hang_s": 0.0,
        "release": threading.Event(),
        "memory_calls": 0,
    }

    def nvmlInit() -> None:
        if state["init_error"] is not None:
            raise state["init_error"]
        state["init"] += 1
        state["refs"] += 1

    def nvmlShutdown() -> None:
        check()
        state["shutdown"] += 1
        state["refs"] -= 1

    def check() -> None:
        if state["refs"] <= 0:
            raise NVMLError_Uninitialized()

    def by_uuid(uuid: str) -> FakeGpu:
        check()
        for gpu in gpus:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLError("Not Found")

    def memory(handle: FakeGpu) -> Any:
        check()
        state["memory_calls"] += 1
        if state["hang_s"]:
            state["release"].wait(state["hang_s"])  # a hung driver
        if memory_error is not None:
            raise memory_error
        return types.SimpleNamespace(
            total=handle.total, used=handle.used, free=handle.total - handle.used
        )

    def procs(handle: FakeGpu) -> list[Any]:
        check()
        if state["procs_error"] is not None:
            raise state["procs_error"]
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.procs]

    def checked(fn: Any) -> Any:
        def call(*args: Any) -> Any:
            check()
            return fn(*args)

        return call

    mod.__dict__.update(
        NVMLError=NVMLError,
        NVMLError_Uninitialized=NVMLError_Uninitialized,
        NVMLError_NotSupported=NVMLError_NotSupported,
        NVMLError_LibraryNotFound=NVMLError_LibraryNotFound,
        nvmlInit=nvmlInit,
        nvmlShutdown=nvmlShutdown,
        nvmlDeviceGetCount=checked(lambda: len(gpus)),
        nvmlDeviceGetHandleByIndex=checked(lambda i: gpus[i]),
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetName=checked(lambda h: h.name.encode()),  # old bindings return bytes
        nvmlDeviceGetUUID=checked(lambda h: h.uuid),
        nvmlDeviceGetComputeRunningProcesses=procs,
        state=state,
    )
    return mod
