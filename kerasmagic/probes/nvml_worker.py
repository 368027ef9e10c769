"""One daemon thread that runs a blocking read, so a hung driver never stalls its callers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Generic, TypeVar

T = TypeVar("T")


class DeadlineWorker(Generic[T]):
    """Run ``fn`` on one daemon thread; each caller waits for the result at most a deadline.

    At most one ``fn`` runs at a time and nothing queues behind it: a caller that finds a call in
    flight (a hung driver, or another thread's reading) waits on that call instead of starting a
    second one. The thread is a daemon, so a call that never returns cannot block exit.
    """

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        self._fn = fn
        self._name = name
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._job: futures.Future[T] | None = None
        self._started = 0.0  # time.monotonic() when the newest call was asked for
        self._thread: threading.Thread | None = None
        self._generation = 0  # a thread runs while this is the number it was started with

    def call(self, timeout_s: float) -> T:
        """Return ``fn()``'s result, or raise ``TimeoutError`` once it has run ``timeout_s``.

        The deadline counts from the call's start: joining a call that already hangs past it
        costs nothing, so a hung driver costs one deadline, not one per caller.
        """
        job, started = self._current()
        try:
            return job.result(max(0.0, started + timeout_s - time.monotonic()))
        except futures.TimeoutError:  # not yet the builtin TimeoutError on Python 3.10
            raise TimeoutError(f"no answer within {timeout_s} s") from None

    def busy(self) -> bool:
        """Return True while a call is in flight."""
        job = self._job
        return job is not None and not job.done()

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
            self._generation += 1
            self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        return True

    def _current(self) -> tuple[futures.Future[T], float]:
        """Return the call in flight, or a new one, and when it was asked for."""
        with self._lock:
            alive = self._thread is not None and self._thread.is_alive()  # False after a fork
            if alive and self._job is not None and not self._job.done():
                return self._job, self._started
            job: futures.Future[T] = futures.Future()
            self._job, self._started = job, time.monotonic()
            if not alive:
                self._generation += 1
                self._thread = threading.Thread(
                    target=self._loop, args=(self._generation,), name=self._name, daemon=True
                )
                self._thread.start()
            self._wake.set()
            return job, self._started

    def _loop(self, generation: int) -> None:
        while True:
            self._wake.wait()
            with self._lock:
                if generation != self._generation:  # stopped, or a newer thread took over
                    return
                self._wake.clear()
                job = self._job
            if job is None or job.done():
                continue
            try:
                job.set_result(self._fn())
            except Exception as exc:  # handed to the waiting caller, not lost in the thread
                job.set_exception(exc)
