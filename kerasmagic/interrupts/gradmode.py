"""Turn PyTorch's gradients back on when a failed cell left them off (a loaded part).

``torch.no_grad().__enter__`` switches gradients off and only ``__exit__`` switches them on
again; a Ctrl-C that lands in between (inside ``__enter__``, after the switch: Keras's optimizer
step and variable assignment enter ``no_grad`` on every batch) skips ``__exit__``. Gradients then
stay off for the thread, and every later ``fit`` fails with "element 0 of tensors does not
require grad" until a restart. So a cell that started with gradients on and ended in an error
with them off gets them back, with one line saying so. A cell that succeeds keeps what it set:
``torch.set_grad_enabled(False)`` on purpose is left alone.
"""

from __future__ import annotations

from typing import Any

from kerasmagic.backends.torch import loaded_torch
from kerasmagic.shellstate import ShellState

RESTORED = (
    "kerasmagic: the error stopped PyTorch inside torch.no_grad(), which left gradients off; "
    "they are on again, as before the cell"
)


class GradGuard:
    """Remember PyTorch's grad mode before each cell; put it back after a cell that failed."""

    def __init__(self) -> None:
        self.before: bool | None = None

    def pre_run_cell(self, info: Any) -> None:
        torch = loaded_torch()
        self.before = bool(torch.is_grad_enabled()) if torch is not None else None

    def post_run_cell(self, result: Any) -> None:
        before, self.before = self.before, None
        torch = loaded_torch()
        if torch is None or not before or getattr(result, "error_in_exec", None) is None:
            return
        if not torch.is_grad_enabled():
            torch.set_grad_enabled(True)
            print(RESTORED)


def load(state: ShellState) -> GradGuard:
    """Register the guard's two hooks."""
    guard = GradGuard()
    state.shell.events.register("pre_run_cell", guard.pre_run_cell)
    state.shell.events.register("post_run_cell", guard.post_run_cell)
    return guard


def unload(state: ShellState, guard: GradGuard) -> None:
    """Remove the hooks."""
    state.shell.events.unregister("pre_run_cell", guard.pre_run_cell)
    state.shell.events.unregister("post_run_cell", guard.post_run_cell)
