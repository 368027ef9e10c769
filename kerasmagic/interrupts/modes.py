"""Put back the modes a failed cell left switched on the main thread (a loaded part).

A library switches a mode for the length of a ``with`` block and only the block's exit switches
it back; a Ctrl-C that lands in between skips the exit, and the mode stays switched for the
thread until a restart:

- PyTorch: ``torch.no_grad().__enter__`` switches gradients off (Keras's optimizer step and
  variable assignment enter it on every batch); with them left off, every later ``fit`` fails
  with "element 0 of tensors does not require grad".
- TensorFlow: tracing a ``tf.function`` (``fit``'s first call) runs in graph mode; left there,
  every later ``fit`` fails with "`tf.data.Dataset` only supports Python-style iteration in
  eager mode" (``backends/tensorflow/mode.py``); and TensorFlow's stack of context switches
  keeps the entry of a graph block whose entry or exit was interrupted.

So a cell that started in the default mode and ended in an error with it switched gets it
back, with one line saying so. A cell that succeeds keeps what it set:
``torch.set_grad_enabled(False)`` on purpose is left alone. Stale context switches are dropped
after any cell, with one line: a cell that catches the Ctrl-C (``except KeyboardInterrupt``
around ``fit``) succeeds, and leaves them all the same. Each backend reads and puts back its
own (``Backend.modes``: ``backends/torch.py``, ``backends/tensorflow/__init__.py``).
"""

from __future__ import annotations

import functools
from typing import Any

from kerasmagic.backends import NAMES, attempt, get
from kerasmagic.shellstate import ShellState


class ModeGuard:
    """Remember each backend's modes before each cell (``Backend.modes``); after it, let each
    put back what a cell that failed left switched, and print what it did."""

    def __init__(self) -> None:
        self.modes = [(name, m) for name in NAMES if (m := get(name).modes) is not None]
        self.before: dict[str, object] = {}

    def pre_run_cell(self, info: Any) -> None:
        self.before = {name: attempt(m.read, None, f"{name}.modes") for name, m in self.modes}

    def post_run_cell(self, result: Any) -> None:
        before, self.before = self.before, {}
        failed = getattr(result, "error_in_exec", None) is not None
        for name, m in self.modes:
            put_back = functools.partial(m.put_back, before.get(name), failed)
            said: list[str] = attempt(put_back, [], f"{name}.modes")
            for line in said:
                print(line)


def load(state: ShellState) -> ModeGuard:
    """Register the guard's two hooks."""
    guard = ModeGuard()
    state.shell.events.register("pre_run_cell", guard.pre_run_cell)
    state.shell.events.register("post_run_cell", guard.post_run_cell)
    return guard


def unload(state: ShellState, guard: ModeGuard) -> None:
    """Remove the hooks."""
    state.shell.events.unregister("pre_run_cell", guard.pre_run_cell)
    state.shell.events.unregister("post_run_cell", guard.post_run_cell)
