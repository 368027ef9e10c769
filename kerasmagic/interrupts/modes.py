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
around ``fit``) succeeds, and leaves them all the same.
"""

from __future__ import annotations

import sys
from typing import Any

from kerasmagic.backends.tensorflow.mode import (
    Mode,
    drop_stale_switches,
    read_mode,
    restore_eager,
)
from kerasmagic.backends.torch import loaded_torch
from kerasmagic.compat.reaches import works
from kerasmagic.shellstate import ShellState

RESTORED = (
    "kerasmagic: the error stopped PyTorch inside torch.no_grad(), which left gradients off; "
    "they are on again, as before the cell"
)
RESTORED_EAGER = (
    "kerasmagic: the error stopped TensorFlow as it left graph mode, which left it there; "
    "eager execution is on again, as before the cell"
)
RESTORED_SWITCHES = (
    "kerasmagic: the interrupt stopped TensorFlow as it entered or left a graph, which left "
    "{n} entr{ies} on its stack of context switches; removed, as before the cell"
)


class ModeGuard:
    """Remember the modes before each cell; put them back after a cell that failed."""

    def __init__(self) -> None:
        self.grad: bool | None = None
        self.tf: Mode | None = None

    def pre_run_cell(self, info: Any) -> None:
        torch = loaded_torch()
        self.grad = bool(torch.is_grad_enabled()) if torch is not None else None
        tf_ok = "tensorflow" not in sys.modules or works("tf.modes")  # moved: said by compat
        self.tf = read_mode() if tf_ok else None

    def post_run_cell(self, result: Any) -> None:
        grad, tf, self.grad, self.tf = self.grad, self.tf, None, None
        dropped = drop_stale_switches(tf)
        if dropped:
            print(RESTORED_SWITCHES.format(n=dropped, ies="y" if dropped == 1 else "ies"))
        if getattr(result, "error_in_exec", None) is None:
            return
        torch = loaded_torch()
        if torch is not None and grad and not torch.is_grad_enabled():
            torch.set_grad_enabled(True)
            print(RESTORED)
        if tf is not None and restore_eager(tf):
            print(RESTORED_EAGER)


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
