"""What one isolated run ended with, and the exceptions that carry it into the kernel."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "error", "crashed", "timeout", "interrupted"]

_SIGNAL_WORDS = {
    signal.SIGKILL: "likely out of memory (the OOM killer) or killed from outside",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGABRT: "aborted (a C++ check failed, or abort())",
    signal.SIGBUS: "bus error",
    signal.SIGTERM: "terminated",
}


def describe_exit(code: int) -> str:
    """Return an exit status in words: ``killed by SIGKILL — likely out of memory ...``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"killed by signal {-code}"
        words = _SIGNAL_WORDS.get(signal.Signals(-code))
        return f"killed by {name}" + (f" — {words}" if words else "")
    return f"exited with code {code} before returning a result"


@dataclass
class Outcome:
    """How a run ended; ``error`` is the child's traceback or the crash in words."""

    status: Status
    value: Any = None
    error: str | None = None
    error_type: str | None = None
    exitcode: int | None = None
    pid: int | None = None
    elapsed_s: float = 0.0
    output: str = ""
    killed: list[str] = field(default_factory=list)  # "sleep (pid 12)": what had to be killed
    error_message: str | None = None  # the child's ``str(exception)``
    oom: dict[str, Any] | None = None  # the child's allocator figures at an out-of-memory error

    @property
    def ok(self) -> bool:
        """Return True if the run returned a value."""
        return self.status == "ok"


@dataclass
class Trial(Outcome):
    """One trial of a sweep: its position, its configuration and how it ended."""

    index: int = 0
    config: Any = None


class IsolatedError(RuntimeError):
    """The isolated code raised; IPython shows the child's own traceback."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.error or outcome.status)
        self.outcome = outcome

    def _render_traceback_(self) -> list[str]:
        """Return the child's traceback lines (IPython calls this instead of its own)."""
        head = f"[isolated process {self.outcome.pid}]"
        return [head, *(self.outcome.error or self.outcome.status).rstrip("\n").splitlines()]


class IsolatedCrash(IsolatedError):
    """The isolated process died (signal, ``os._exit``) without returning a result."""


class IsolatedTimeout(IsolatedError, TimeoutError):
    """The isolated process ran past its timeout and was killed with its children."""


def unwrap(outcome: Outcome) -> Any:
    """Return the value of a successful outcome; raise the matching error otherwise."""
    if outcome.status == "ok":
        return outcome.value
    if outcome.status == "timeout":
        raise IsolatedTimeout(outcome)
    if outcome.status == "crashed":
        raise IsolatedCrash(outcome)
    if outcome.status == "interrupted":
        raise KeyboardInterrupt
    raise IsolatedError(outcome)
