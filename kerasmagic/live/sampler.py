"""A daemon thread that samples RAM and NVML and keeps the peaks of a cell (its callback reads
the backends' allocators on the same thread).

It sleeps on an ``Event`` between samples (fast while a cell runs, slow while idle), never
raises into the kernel and holds no reference to any user object.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kerasmagic.probes import GpuInfo, RamInfo, read_gpus, read_ram

log = logging.getLogger(__name__)
OnSample = Callable[[RamInfo, GpuInfo], None]


class Sampler:
    """Sample every ``interval_s`` while a cell runs, every ``idle_interval_s`` otherwise."""

    def __init__(self, interval_s: float, idle_interval_s: float, on_sample: OnSample) -> None:
        self.interval_s = interval_s
        self.idle_interval_s = idle_interval_s
        self._on_sample = on_sample
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._running_cell = False
        self._cell = 0  # counts cell starts, so a late reading never lands in the next cell
        self._peak_rss = 0
        self._peak_gpu: int | None = None
        self._thread: threading.Thread | None = None
        self.samples = 0

    @property
    def alive(self) -> bool:
        """Return True while the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def native_id(self) -> int | None:
        """Return the OS thread id (for CPU accounting), or None when not running."""
        return self._thread.native_id if self._thread is not None else None

    def start(self) -> None:
        """Start the thread (once)."""
        if self.alive:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="kerasmagic-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._thread = None

    def cell_started(self, rss_bytes: int, gpu_bytes: int | None) -> None:
        """Reset the peaks to the cell's start values; samples come every tick until it ends."""
        with self._lock:
            self._running_cell = True
            self._cell += 1
            self._peak_rss, self._peak_gpu = rss_bytes, gpu_bytes

    def cell_finished(self, rss_bytes: int, gpu_bytes: int | None) -> tuple[int, int | None]:
        """Return the cell's peak RSS and GPU bytes (including the end values)."""
        with self._lock:
            self._running_cell = False
            self._update(rss_bytes, gpu_bytes)
            return self._peak_rss, self._peak_gpu

    def _update(self, rss_bytes: int, gpu_bytes: int | None) -> None:
        self._peak_rss = max(self._peak_rss, rss_bytes)
        if gpu_bytes is not None:
            self._peak_gpu = max(self._peak_gpu or 0, gpu_bytes)

    def sample_once(self) -> None:
        """Read the probes once, update the peaks and report; log (never raise) failures."""
        try:
            with self._lock:
                cell = self._cell
            ram, gpu = read_ram(), read_gpus()
            with self._lock:
                if self._running_cell and self._cell == cell:
                    self._update(ram.rss_bytes, gpu.used_bytes)
            self.samples += 1
            self._on_sample(ram, gpu)
        except Exception:
            log.exception("kerasmagic sampler: reading memory failed")

    def _loop(self) -> None:
        # Tick every interval_s; sample on every tick while a cell runs, else every
        # idle_interval_s. A cell's start does not wake the thread: trivial cells end before
        # the next tick, so they never compete with it for the GIL.
        last = float("-inf")
        while not self._stop.is_set():
            now = time.monotonic()
            if self._running_cell or now - last >= self.idle_interval_s:
                self.sample_once()
                last = now
            self._stop.wait(self.interval_s)
