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
import sys
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
        if not self.devices:
            return None
        mine = [d.process_used_bytes for d in self.devices]
        if all(m is not None for m in mine):
            return sum(m for m in mine if m is not None)
        return sum(d.used_bytes for d in self.devices)


# -- the reading thread, with a deadline -----------------------------------------------------------
class DeadlineWorker:
    """Run ``fn`` on one daemon thread; each caller waits for the result at most a deadline.

    At most one ``fn`` runs at a time and nothing queues behind it: a caller that finds a call in
    flight (a hung driver, or another thread's reading) waits on that call instead of starting a
    second one. The thread is a daemon, so a call that never returns cannot block exit.
    """

    def __init__(self, fn: Callable[[], GpuInfo], name: str) -> None:
        self._fn, self._name = fn, name
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[futures.Future[GpuInfo] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._job: futures.Future[GpuInfo] | None = None
        self._started = 0.0  # time.monotonic() when the newest call was asked for

    def call(self, timeout_s: float) -> GpuInfo:
        """Return ``fn()``'s result, or raise ``TimeoutError`` once it has run ``timeout_s``.

        The deadline counts from the call's start: joining a call that already hangs past it
        costs nothing, so a hung driver costs one deadline, not one per caller.
        """
        with self._lock:
            alive = self._thread is not None and self._thread.is_alive()  # False after a fork
            if not alive or self._job is None or self._job.done():
                self._job, self._started = futures.Future(), time.monotonic()
                if not alive:  # each thread reads its own queue: a stopped one ends on None
                    self._jobs = queue.SimpleQueue()
                    self._thread = threading.Thread(
                        target=self._loop, args=(self._jobs,), name=self._name, daemon=True
                    )
                    self._thread.start()
                self._jobs.put(self._job)
            job, started = self._job, self._started
        return job.result(max(0.0, started + timeout_s - time.monotonic()))

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the call in flight; return True if none is left."""
        job = self._job
        return job is None or not futures.wait([job], timeout_s).not_done

    def stop(self, timeout_s: float) -> bool:
        """End the thread once no call is in flight; return False if one still runs (left be).

        A later ``call`` starts a new thread.
        """
        if not self.wait_idle(timeout_s):
            return False
        with self._lock:
            thread, self._thread = self._thread, None
            self._jobs.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        return True

    def _loop(self, jobs: queue.SimpleQueue[futures.Future[GpuInfo] | None]) -> None:
        while (job := jobs.get()) is not None:
            try:
                job.set_result(self._fn())
            except Exception as exc:  # handed to the waiting caller, not lost in the thread
                job.set_exception(exc)


# -- one device's reading --------------------------------------------------------------------------
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
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
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


# -- NVML's state in this process ------------------------------------------------------------------
_lock = threading.Lock()
_nvml: ModuleType | None = None
_failure: GpuInfo | None = None  # remembered so a missing driver is not probed every sample
_visible: tuple[str | None, list[Visible]] | None = None  # (CUDA_VISIBLE_DEVICES, devices)
_last_good: tuple[float, GpuInfo] | None = None  # (time.monotonic(), reading)
DEPRECATED_PYNVML = "The pynvml package is deprecated"  # printed by that package's import hook


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
    except Exception as exc:  # no driver library at all, or a driver that did not start
        message = "no NVIDIA GPU"
        if not is_error(module, exc, "LibraryNotFound"):
            message += f" in use: the NVIDIA driver did not start ({describe(module, exc)})"
        _failure = GpuInfo("no_driver", message, ())
        return _failure
    _nvml = module
    atexit.unregister(shutdown)  # once, however often NVML starts again
    atexit.register(shutdown)
    return module


def _visible_devices(nvml: ModuleType) -> list[Visible]:
    """Resolve the visible devices once per NVML session and CUDA_VISIBLE_DEVICES value."""
    global _visible
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if _visible is None or _visible[0] != spec:
        get_uuid, get_name = nvml.nvmlDeviceGetUUID, nvml.nvmlDeviceGetName
        found = [
            Visible(n, h, text(get_uuid(h)), text(get_name(h))) for n, h in _visible_handles(nvml)
        ]
        _visible = (spec, found)
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


def _shutdown_nvml(wait_s: float) -> bool:
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


# -- what the probes read --------------------------------------------------------------------------
DEADLINE_S = 0.15  # a healthy reading takes well under 1 ms per GPU
EXIT_WAIT_S = 1.0  # at exit, how long a hung reading may delay NVML's shutdown

_worker = DeadlineWorker(read_now, "kerasmagic-nvml")
wait_idle = _worker.wait_idle  # wait up to a timeout for a reading in flight; True if none left


def read_gpus(timeout_s: float = DEADLINE_S) -> GpuInfo:
    """Return memory of every GPU this process may use; failures and delays become a status."""
    if _failure is not None:
        return _failure  # no driver: answered here, without a thread
    try:
        return _worker.call(timeout_s)
    except TimeoutError:
        return _late(timeout_s)
    except Exception as exc:  # read_now returns its failures; this is a last resort
        return GpuInfo("error", f"NVML error: {type(exc).__name__}: {exc}", ())


def _late(timeout_s: float) -> GpuInfo:
    """Return the last good reading marked stale, or "not available", when NVML is late."""
    waited = f"NVML did not answer within {timeout_s * 1000:.0f} ms"
    last = _last_good
    if last is None:
        return GpuInfo("error", f"not available: {waited} (starting, or a hung driver)", ())
    age_s = time.monotonic() - last[0]
    return GpuInfo("stale", f"{waited}; figures from {age_s:.0f} s ago", last[1].devices)


def shutdown(wait_s: float = EXIT_WAIT_S) -> None:
    """Shut NVML down and forget failures and readings; the next reading initialises it again.

    A reading that still hangs after ``wait_s`` is left alone, and so is NVML.
    """
    if wait_idle(wait_s):
        _shutdown_nvml(wait_s)


def stop(wait_s: float = EXIT_WAIT_S) -> None:
    """Shut NVML down and end the reading thread (``%unload_ext``); the next reading restarts
    both. A reading that still hangs is left alone."""
    if _worker.stop(wait_s):
        _shutdown_nvml(wait_s)
