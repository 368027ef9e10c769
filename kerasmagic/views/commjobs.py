"""Sidebar requests answered on the main thread, between cells, one run shared by all waiting.

"Free memory" and "Scan" walk the garbage collector and touch the user's namespace, so they
never run on a comm's subshell thread while a cell runs: they are queued on the kernel's main
event loop and run after the cell. A request that arrives while a run is pending joins it, and
every request gets an answer: the run's reply, or an error naming what it raised.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kerasmagic.views.commproto import clip, message

log = logging.getLogger(__name__)
Answer = Callable[[Any, dict[str, Any]], None]  # (comm, message) -> sent


def on_main_thread(shell: Any, fn: Callable[[], None]) -> None:
    """Run ``fn`` now on the main thread, else queue it there (after the running cell)."""
    loop = getattr(getattr(shell, "kernel", None), "io_loop", None)
    if threading.current_thread() is threading.main_thread() or loop is None:
        fn()
    else:
        loop.add_callback(fn)


class MainThreadJob:
    """One kind of request run on the main thread; concurrent requests share one run."""

    def __init__(self, name: str, work: Callable[[], dict[str, Any]], shell: Any, answer: Answer):
        self._name = name
        self._work = work  # returns the reply's fields; may raise
        self._shell = shell
        self._answer = answer
        self._lock = threading.Lock()
        self._waiters: list[tuple[Any, str]] = []
        self._pending = False

    def request(self, comm: Any, rid: str) -> None:
        """Queue a run, or join the one already queued: each request gets its result."""
        with self._lock:
            self._waiters.append((comm, rid))
            if self._pending:
                return
            self._pending = True
        on_main_thread(self._shell, self._run)

    def _run(self) -> None:
        fields: dict[str, Any] = {"error": f"{self._name} was interrupted"}
        try:
            fields = {"request": self._name, **self._work()}
        except Exception as exc:
            log.exception("kerasmagic: %s failed", self._name)
            fields = {"error": clip(f"{self._name} failed: {type(exc).__name__}: {exc}")}
        finally:  # an interrupt (KeyboardInterrupt) still answers, then goes on up
            with self._lock:
                waiters, self._waiters = self._waiters, []
                self._pending = False
            kind = "error" if "error" in fields else "reply"
            for comm, rid in waiters:
                self._answer(comm, message(kind, id=rid, **fields))
