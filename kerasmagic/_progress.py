"""One progress line for ``kerasmagic demo``: redrawn in place on a terminal, plain lines in a pipe.

On a terminal the line is rewritten with ``\\r`` every second (so the clock moves while TensorFlow
imports) and whenever a model finishes. When the stream is not a terminal (``| tee``, CI logs)
nothing is redrawn: one line when a step starts and one when it ends, no ``\\r`` in the output.
"""

from __future__ import annotations

import shutil
import threading
import time
from typing import TextIO

BAR_WIDTH = 20


def bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """Return an ASCII bar such as ``[#######.............]`` for ``done`` of ``total``."""
    filled = 0 if total <= 0 else min(width, done * width // total)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def remaining_s(done: int, total: int, elapsed_s: float, first_s: float) -> float | None:
    """Estimate the seconds left from the pace since the first model (which pays the imports)."""
    if done < 2 or done >= total:
        return None
    pace = (elapsed_s - first_s) / (done - 1)
    return pace * (total - done)


class StepProgress:
    """Show the progress of one step of ``total`` units (models) under a ``label``."""

    def __init__(self, stream: TextIO, label: str, total: int, unit: str = "models") -> None:
        self.stream, self.label, self.total, self.unit = stream, label, total, unit
        self.live = stream.isatty()
        self.done = 0
        self._start = time.monotonic()
        self._first_s = 0.0
        self._width = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> StepProgress:
        if self.live:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        else:
            self.stream.write(f"{self.label}: started\n")
            self.stream.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        elapsed = time.monotonic() - self._start
        ok = exc[0] is None
        end = f"{self.done}/{self.total} {self.unit} in {elapsed:.0f} s" if ok else "stopped"
        with self._lock:
            if self.live:
                self._draw(f"{self.label}: {end}", final=True)
            else:
                self.stream.write(f"{self.label}: {end}\n")
            self.stream.flush()

    def update(self, done: int) -> None:
        """Record that ``done`` units are finished, and redraw on a terminal."""
        with self._lock:
            if self.done == 0 and done > 0:
                self._first_s = time.monotonic() - self._start
            self.done = done
            if self.live:
                self._draw(self.line(_columns()))

    def line(self, columns: int = 80) -> str:
        """Return the progress line as it stands now, within ``columns``.

        The label says what runs, so it is kept whole while a status with the counts and the
        estimate fits beside it (a shorter bar, then none, then no clock); only on a terminal
        too narrow for that is the label cut, beside the full status.
        """
        statuses = self._statuses(time.monotonic() - self._start)
        for status in statuses:
            if len(self.label) + 2 + len(status) <= columns - 1:
                return f"{self.label}  {status}"
        status = statuses[0]
        room = max(columns - 1 - len(status) - 2, 8)
        return f"{self.label[: room - 3]}...  {status}"

    def _statuses(self, elapsed: float) -> list[str]:
        """Return the status part of the line, from the fullest to the shortest."""
        clock = f"{elapsed:.0f} s"
        if self.done == 0:
            return [f"starting (importing TensorFlow)  {clock}", f"starting  {clock}"]
        left = remaining_s(self.done, self.total, elapsed, self._first_s)
        end = clock if left is None else f"{clock}, ~{left:.0f} s left"
        counts = f"{self.done}/{self.total} {self.unit}"
        return [
            f"{bar(self.done, self.total)} {counts}  {end}",
            f"{bar(self.done, self.total, BAR_WIDTH // 2)} {counts}  {end}",
            f"{counts}  {end}",
            f"{counts}  {clock}" if left is None else f"{counts}, ~{left:.0f} s left",
        ]

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self._draw(self.line(_columns()))

    def _draw(self, text: str, final: bool = False) -> None:
        text = text[: _columns() - 1]
        pad = " " * max(0, self._width - len(text))
        self.stream.write("\r" + text + pad + ("\n" if final else ""))
        self.stream.flush()
        self._width = 0 if final else len(text)


def _columns() -> int:
    """Return the terminal's width (80 when it cannot be told)."""
    return shutil.get_terminal_size((80, 24)).columns
