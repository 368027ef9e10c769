"""Host memory of this process, read with psutil."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class RamInfo:
    """Resident memory of this process and of the host, in bytes."""

    rss_bytes: int
    peak_rss_bytes: int | None
    total_bytes: int
    available_bytes: int


def _peak_rss_bytes() -> int | None:
    """Return the process's peak resident set size, or None where unknown."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


_process: psutil.Process | None = None


def _this_process() -> psutil.Process:
    """Return a cached ``psutil.Process`` for this PID (creating one reads /proc: ~0.3 ms)."""
    global _process
    if _process is None or _process.pid != os.getpid():  # new after a fork
        _process = psutil.Process()
    return _process


HOST_TTL_S = 1.0  # host totals change slowly; /proc/meminfo costs ~0.1 ms per read
_host: tuple[float, int, int] = (float("-inf"), 0, 0)  # (read at, total, available)


def _host_memory() -> tuple[int, int]:
    global _host
    now = time.monotonic()
    if now - _host[0] > HOST_TTL_S:
        vm = psutil.virtual_memory()
        _host = (now, int(vm.total), int(vm.available))
    return _host[1], _host[2]


def ram_info(rss_bytes: int, peak_rss_bytes: int | None, total: int, available: int) -> RamInfo:
    """Return a reading whose peak is never below its RSS.

    Linux keeps the peak (``ru_maxrss``) from RSS counters it syncs lazily (per thread, per
    CPU), so it can read a little below the RSS ``/proc`` gives a moment earlier (800.6 MB
    against 800.8 MB): the RSS just read is then the peak.
    """
    peak = None if peak_rss_bytes is None else max(peak_rss_bytes, rss_bytes)
    return RamInfo(
        rss_bytes=rss_bytes, peak_rss_bytes=peak, total_bytes=total, available_bytes=available
    )


def read_ram() -> RamInfo:
    """Return this process's RSS and peak, and the host's total and available memory."""
    rss = int(_this_process().memory_info().rss)
    total, available = _host_memory()
    return ram_info(rss, _peak_rss_bytes(), total, available)
