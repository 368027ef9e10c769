"""Per-GPU memory read through NVML (the ``pynvml`` module of nvidia-ml-py).

NVML is initialised on the first reading, never at import, and shut down at exit; after a user's
own ``nvmlShutdown()`` it is started again. Every failure is a value (``GpuInfo.status``), never
an exception: a machine without an NVIDIA driver is an ordinary case, not an error.

Readings run on one worker thread and callers wait at most ``DEADLINE_S``: a hung driver never
stalls a cell. Late, a caller gets the last good reading marked "stale" (or "not available"),
and no second NVML call starts while one hangs.
"""

from __future__ import annotations

import atexit
import threading
import time

from kerasmagic.probes import nvml_read
from kerasmagic.probes.nvml_types import GpuDevice, GpuInfo, GpuStatus
from kerasmagic.probes.nvml_worker import DeadlineWorker

__all__ = ["DEADLINE_S", "GpuDevice", "GpuInfo", "GpuStatus", "read_gpus", "shutdown"]

DEADLINE_S = 0.15  # a healthy reading takes well under 1 ms per GPU
EXIT_WAIT_S = 1.0  # at exit, how long a hung reading may delay NVML's shutdown

_worker: DeadlineWorker[GpuInfo] = DeadlineWorker(nvml_read.read_now, "kerasmagic-nvml")
_exit_lock = threading.Lock()
_exit_registered = False


def read_gpus(timeout_s: float = DEADLINE_S) -> GpuInfo:
    """Return memory of every GPU this process may use; failures and delays become a status."""
    failure = nvml_read.remembered_failure()
    if failure is not None:
        return failure  # no driver: answered here, without a thread
    _register_exit()
    try:
        return _worker.call(timeout_s)
    except TimeoutError:
        return _late(timeout_s)
    except Exception as exc:  # read_now returns its failures; this is a last resort
        return GpuInfo("error", f"NVML error: {type(exc).__name__}: {exc}", ())


def _late(timeout_s: float) -> GpuInfo:
    """Return the last good reading marked stale, or "not available", when NVML is late."""
    waited = f"NVML did not answer within {timeout_s * 1000:.0f} ms"
    last = nvml_read.last_good()
    if last is None:
        return GpuInfo("error", f"not available: {waited} (starting, or a hung driver)", ())
    age_s = time.monotonic() - last[0]
    return GpuInfo("stale", f"{waited}; figures from {age_s:.0f} s ago", last[1].devices)


def wait_idle(timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for a reading in flight; return True if none is left."""
    return _worker.wait_idle(timeout_s)


def shutdown(wait_s: float = EXIT_WAIT_S) -> None:
    """Shut NVML down and forget failures and readings; the next reading initialises it again.

    A reading that still hangs after ``wait_s`` is left alone, and so is NVML.
    """
    if wait_idle(wait_s):
        nvml_read.shutdown(wait_s)


def stop(wait_s: float = EXIT_WAIT_S) -> None:
    """Shut NVML down and end the reading thread (``%unload_ext``); the next reading restarts
    both. A reading that still hangs is left alone."""
    if _worker.stop(wait_s):
        nvml_read.shutdown(wait_s)


def _register_exit() -> None:
    global _exit_registered
    with _exit_lock:
        if not _exit_registered:
            atexit.register(shutdown)
            _exit_registered = True
