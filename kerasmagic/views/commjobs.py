"""Sidebar requests answered on the main thread, between cells, one run shared by all waiting.

"Free memory" and "Scan" walk the garbage collector and touch the user's namespace, so they
never run on a comm's subshell thread while a cell runs: they are queued on the kernel's main
event loop and run after the cell. A request that arrives while a run is queued or running
joins it, and every request gets an answer with its own id: the run's reply, or an error
naming what it raised.

In a kernel a run starts ``GATHER_S`` after the first request, not at once: requests sent
together (clicks, several sidebars, a frontend resending) reach the kernel one by one, and
over the main shell (a frontend without comm subshells) each was read only after the run the
one before it started had ended, so 50 of them ran 50 cleanups, one after another, each
blocking the kernel (9.8 s). Waiting that short while on the idle loop lets them all join.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kerasmagic.views.commproto import failure, message

log = logging.getLogger(__name__)
Answer = Callable[[Any, dict[str, Any]], None]  # (comm, message) -> sent


GATHER_S = 0.05  # a kernel's run waits this long for requests sent with the first one


def on_main_thread(shell: Any, fn: Callable[[], None], delay_s: float = 0.0) -> None:
    """Run ``fn`` on the kernel's main event loop ``delay_s`` from now (after the running cell);
    without a kernel (an in-process shell), run it now."""
    loop = getattr(getattr(shell, "kernel", None), "io_loop", None)
    if loop is None:
        fn()
    elif threading.current_thread() is threading.main_thread():
        loop.call_later(delay_s, fn)
    else:
        loop.add_callback(loop.call_later, delay_s, fn)  # add_callback: the thread-safe one


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
        on_main_thread(self._shell, self._run, GATHER_S)

    def _run(self) -> None:
        fields: dict[str, Any] = {"error": f"{self._name} was interrupted"}
        try:
            fields = {"request": self._name, **self._work()}
        except Exception as exc:
            log.exception("kerasmagic: %s failed", self._name)
            fields = {"error": failure(f"{self._name} failed", exc)}
        finally:  # an interrupt (KeyboardInterrupt) still answers, then goes on up
            with self._lock:
                waiters, self._waiters = self._waiters, []
                self._pending = False
            kind = "error" if "error" in fields else "reply"
            for comm, rid in waiters:
                self._answer(comm, message(kind, id=rid, **fields))
