"""NVML's GPUs, read on a worker thread with a deadline, typed, "not available" as a value.

NVML is started lazily on the first read (never at import), read off the main thread so a hung
driver cannot stall a cell (``DEADLINE_S``), and shut down at exit. Readings are
``GpuInfo``/``GpuDevice`` in bytes; a missing driver, no GPU or an NVML error is a status.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, cast

import psutil

__all__ = ["DEADLINE_S", "GpuDevice", "GpuInfo", "GpuStatus", "read_gpus", "shutdown"]

GpuStatus = Literal["ok", "stale", "no_driver", "no_gpu", "hidden", "error"]


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as CUDA sees it in this process, memory in bytes."""

    cuda_index: int
    nvml_index: int | None
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    process_used_bytes: int | None  # None: not available or not ours to match, see the note
    process_note: str | None = None  # why process_used_bytes is None, in one line


@dataclass(frozen=True)
class GpuInfo:
    """All GPUs visible to this process, or why there are none."""

    status: GpuStatus
    message: str | None
    devices: tuple[GpuDevice, ...]

    @property
    def used_bytes(self) -> int | None:
        """Return this process's VRAM over all GPUs, else the devices' total use, else None."""
        mine = [d.process_used_bytes for d in self.devices]
        if None in mine:
            return sum(d.used_bytes for d in self.devices)
        return sum(m or 0 for m in mine) if mine else None


# -- the reading thread, with a deadline -----------------------------------------------------------
class DeadlineWorker:
    """Run ``fn`` on one daemon thread; each caller waits for the result at most a deadline.

    At most one ``fn`` runs at a time and nothing queues behind it: a caller that finds a call in
    flight (a hung driver, or another thread's reading) waits on that call instead of starting a
    second one. The thread is a daemon, so a call that never returns cannot block exit.
    """

    def __init__(self, fn: Callable[[], GpuInfo], name: str) -> None:
        self._fn, self._name, self._lock = fn, name, threading.Lock()
        self._jobs: queue.SimpleQueue[futures.Future[GpuInfo] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # The newest call, and the time.monotonic() it was asked for.
        self._job: tuple[futures.Future[GpuInfo], float] | None = None

    def call(self, timeout_s: float) -> GpuInfo:
        """Return ``fn()``'s result, or raise ``TimeoutError`` once it has run ``timeout_s``.

        The deadline counts from the call's start: joining a call that already hangs past it
        costs nothing, so a hung driver costs one deadline, not one per caller.
        """
        with self._lock:
            alive = self._thread is not None and self._thread.is_alive()  # False after a fork
            if not alive or self._job is None or self._job[0].done():
                self._job = futures.Future(), time.monotonic()
                if not alive:  # each thread reads its own queue: a stopped one ends on None
                    self._jobs = queue.SimpleQueue()
                    self._thread = threading.Thread(
                        target=self._loop, args=(self._jobs,), name=self._name, daemon=True
                    )
                    self._thread.start()
                self._jobs.put(self._job[0])
            job, started = self._job
        return job.result(max(0.0, started + timeout_s - time.monotonic()))

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the call in flight; return True if none is left."""
        return self._job is None or not futures.wait([self._job[0]], timeout_s).not_done

    def stop(self, timeout_s: float) -> bool:
        """End the thread once no call is in flight; return False if one still runs (left be).

        A later ``call`` starts a new thread. Never called from the thread itself (it runs
        ``fn`` only), so joining it is safe.
        """
        if idle := self.wait_idle(timeout_s):
            with self._lock:
                thread, self._thread = self._thread, None
                self._jobs.put(None)
            if thread is not None:
                thread.join(timeout_s)
        return idle

    def _loop(self, jobs: queue.SimpleQueue[futures.Future[GpuInfo] | None]) -> None:
        while (job := jobs.get()) is not None:
            try:
                job.set_result(self._fn())
            except Exception as exc:  # handed to the waiting caller, not lost in the thread
                job.set_exception(exc)


# -- one reading -----------------------------------------------------------------------------------
Visible = tuple[Any, tuple[int | None, str, str]]  # (handle, (NVML index, UUID, name))


def text(value: Any) -> str:
    """Return a binding's string (old bindings return bytes) or an error as one line."""
    return " ".join((value.decode() if isinstance(value, bytes) else str(value)).split())


def describe(nvml: ModuleType | None, exc: Exception) -> str:
    """Return one line saying what went wrong: NVML's own words, else the exception's type too."""
    if nvml is not None and isinstance(exc, AttributeError) and exc.obj is nvml:
        return f"this pynvml has no {exc.name}: install a current nvidia-ml-py"
    message = text(exc)
    if message and not isinstance(exc, getattr(nvml, "NVMLError", ())):
        return f"{type(exc).__name__}: {message}"
    return message or type(exc).__name__


def _visible_devices(nvml: ModuleType) -> list[Visible]:
    """Return (handle, (NVML index, UUID, name)) of each device CUDA_VISIBLE_DEVICES lets CUDA
    see, resolved once per NVML session and CUDA_VISIBLE_DEVICES value."""
    global _visible
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if _visible is not None and _visible[0] == spec:
        return _visible[1]
    count = int(nvml.nvmlDeviceGetCount())
    found: list[tuple[int | None, Any]] = []
    for item in map(str, range(count)) if spec is None else (p.strip() for p in spec.split(",")):
        if item.isdigit() and int(item) < count:
            found.append((int(item), nvml.nvmlDeviceGetHandleByIndex(int(item))))
        elif item.startswith(("GPU-", "MIG-")):  # a full or prefix UUID, as CUDA accepts both
            indexed = ((i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count))
            ours = (ih for ih in indexed if text(nvml.nvmlDeviceGetUUID(ih[1])).startswith(item))
            found.append(next(ours, None) or (None, nvml.nvmlDeviceGetHandleByUUID(item)))
        else:
            break  # CUDA ignores this entry and everything after it
    get_uuid, get_name = nvml.nvmlDeviceGetUUID, nvml.nvmlDeviceGetName
    _visible = (spec, [(h, (n, text(get_uuid(h)), text(get_name(h)))) for n, h in found])
    return _visible[1]


def _process_share(nvml: ModuleType, handle: Any) -> tuple[int | None, str | None]:
    """Return this PID's usage (0 if absent), or None and why it is not available."""
    try:
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception as exc:
        if isinstance(exc, nvml.NVMLError_Uninitialized):
            raise  # the whole reading starts NVML again
        hint = " (usual on WSL2 and vGPU)" if isinstance(exc, nvml.NVMLError_NotSupported) else ""
        return None, f"not available: NVML's process list failed: {describe(nvml, exc)}{hint}"
    mine = [p.usedGpuMemory for p in procs if int(p.pid) == os.getpid()]
    if None in mine:
        return None, "unknown: the driver does not report per-process use"
    if not mine and any(not psutil.pid_exists(int(p.pid)) for p in procs):
        return None, "unknown: NVML lists PIDs of another PID namespace (a container)"
    return sum(int(u) for u in mine), None


def _read(nvml: ModuleType, restart: bool = False) -> GpuInfo:
    """Read every visible device (a good reading is kept as ``_last_good``); errors become a
    status. If NVML was shut down under us (a user's ``nvmlShutdown()``), start it once again
    (``restart``)."""
    global _visible, _last_good
    try:
        if restart:
            nvml.nvmlInit()
        if not (visible := _visible_devices(nvml)):
            if int(nvml.nvmlDeviceGetCount()) == 0:
                return GpuInfo("no_gpu", "the NVIDIA driver reports no GPU", ())
            return GpuInfo("hidden", "CUDA_VISIBLE_DEVICES hides every GPU", ())
        devices = []
        for cuda_index, (handle, facts) in enumerate(visible):
            # The memory first: the per-process share degrades on its own.
            mem, share = nvml.nvmlDeviceGetMemoryInfo(handle), _process_share(nvml, handle)
            devices.append(GpuDevice(cuda_index, *facts, int(mem.total), int(mem.used), *share))
        _last_good = (time.monotonic(), GpuInfo("ok", None, tuple(devices)))
        return _last_good[1]
    except Exception as exc:
        _visible = None  # a lost, reset or re-initialised GPU: resolve the devices again
        if not restart and isinstance(exc, nvml.NVMLError_Uninitialized):
            return _read(nvml, restart=True)
        lost = "not available: NVML was shut down and did not restart"
        return GpuInfo("error", f"{lost if restart else 'NVML error'}: {describe(nvml, exc)}", ())


# -- NVML's state in this process ------------------------------------------------------------------
_lock = threading.Lock()
_nvml: ModuleType | None = None
_failure: GpuInfo | None = None  # remembered so a missing driver is not probed every sample
_visible: tuple[str | None, list[Visible]] | None = None  # (CUDA_VISIBLE_DEVICES, devices)
_last_good: tuple[float, GpuInfo] | None = None  # (time.monotonic(), reading)


def _import_pynvml() -> ModuleType:
    """Import pynvml; the deprecated ``pynvml`` package's FutureWarning is not for our users.

    One filter is added and removed again, rather than ``catch_warnings``, which would put back
    the whole filter list and so drop any filter the main thread set meanwhile.
    """
    # What that package's import hook prints:
    warnings.filterwarnings("ignore", "The pynvml package is deprecated", FutureWarning)
    ours = warnings.filters[0]
    try:
        return importlib.import_module("pynvml")
    finally:
        with contextlib.suppress(ValueError):  # someone reset the filters meanwhile
            cast("list[Any]", warnings.filters).remove(ours)  # a list; typeshed says Sequence


def read_now() -> GpuInfo:
    """Return a fresh reading of every GPU this process may use (blocks while NVML does).

    NVML is started on the first reading; a failure to start it is remembered (``_failure``).
    """
    global _nvml, _failure
    with _lock:
        if _nvml is not None:
            return _read(_nvml)
        module: ModuleType | None = None
        try:
            module = _import_pynvml()
            module.nvmlInit()
        except Exception as exc:
            status: GpuStatus = "error"
            if module is None and isinstance(exc, ImportError):
                status, message = "no_driver", "nvidia-ml-py (pynvml) is not installed"
            elif module is None:
                message = f"pynvml failed to import: {describe(None, exc)}"
            elif isinstance(exc, AttributeError):
                message = describe(module, exc)
            else:  # no driver library at all, or a driver that did not start
                status, message = "no_driver", "no NVIDIA GPU"
                if not isinstance(exc, module.NVMLError_LibraryNotFound):
                    message += f" in use: the NVIDIA driver did not start ({describe(module, exc)})"
            _failure = GpuInfo(status, message, ())
            return _failure
        _nvml = module
        atexit.unregister(shutdown)  # once, however often NVML starts again
        atexit.register(shutdown)
        return _read(module)


def _shutdown_nvml(ready: bool, wait_s: float) -> None:
    """If ``ready``, shut NVML down and forget everything, unless a reading still blocks after
    ``wait_s``."""
    global _nvml, _failure, _visible, _last_good
    if not ready or not _lock.acquire(timeout=wait_s):
        return
    try:
        module, _nvml, _failure, _visible, _last_good = _nvml, None, None, None, None
        if module is not None:
            with contextlib.suppress(Exception):  # already shut down by the user, a lost GPU
                module.nvmlShutdown()
    finally:
        _lock.release()


# -- what the probes read --------------------------------------------------------------------------
DEADLINE_S = 0.15  # a healthy reading takes well under 1 ms per GPU
EXIT_WAIT_S = 1.0  # at exit, how long a hung reading may delay NVML's shutdown

_worker = DeadlineWorker(read_now, "kerasmagic-nvml")
wait_idle = _worker.wait_idle  # wait up to a timeout for a reading in flight; True if none left


def read_gpus(timeout_s: float = DEADLINE_S) -> GpuInfo:
    """Return memory of every GPU this process may use; failures and delays become a status.

    When NVML is late: the last good reading marked stale, else "not available".
    """
    if _failure is not None:
        return _failure  # no driver: answered here, without a thread
    try:
        return _worker.call(timeout_s)
    except TimeoutError:
        waited, last = f"NVML did not answer within {timeout_s * 1000:.0f} ms", _last_good
    except Exception as exc:  # read_now returns its failures; this is a last resort
        return GpuInfo("error", f"NVML error: {type(exc).__name__}: {exc}", ())
    if last is None:
        return GpuInfo("error", f"not available: {waited} (starting, or a hung driver)", ())
    age_s = time.monotonic() - last[0]
    return GpuInfo("stale", f"{waited}; figures from {age_s:.0f} s ago", last[1].devices)


def shutdown(wait_s: float = EXIT_WAIT_S) -> None:
    """Shut NVML down and forget failures and readings; the next reading initialises it again.

    A reading that still hangs after ``wait_s`` is left alone, and so is NVML.
    """
    _shutdown_nvml(wait_idle(wait_s), wait_s)


def stop(wait_s: float = EXIT_WAIT_S) -> None:
    """Shut NVML down and end the reading thread (``%unload_ext``); the next reading restarts
    both. A reading that still hangs is left alone."""
    _shutdown_nvml(_worker.stop(wait_s), wait_s)
