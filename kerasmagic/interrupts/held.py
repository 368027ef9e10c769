"""Hold Ctrl-C while kerasmagic's own work runs, then hand it to the user's cell.

A ``KeyboardInterrupt`` raised inside a finalizer or weakref callback during ``gc.collect()``
is printed as "Exception ignored" and lost, and one raised in an IPython event hook is shown as
"Error in callback". So SIGINT is recorded, not raised, while cleanup or a hook runs; afterwards
the interrupt is delivered where the user expects it: the cell stops with ``KeyboardInterrupt``.
"""

from __future__ import annotations

import _signal
import ast
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from kerasmagic.interrupts.ownframes import shown_plain

HOLDS = "__kerasmagic_holds_sigint__"  # marks a SIGINT handler that records (it holds Ctrl-C)


def holds(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``handler`` as one that records SIGINT: a hold entered under it is not needed."""
    setattr(handler, HOLDS, True)
    return handler


class held_interrupts:
    """Record SIGINT instead of raising it for the block (main thread only; elsewhere no-op).

    ``pending`` says whether one arrived; ``deliver()`` then hands it to the handler it was
    held from. Under a hold already in place (an outer ``held_interrupts``, the kernel guard's
    recorder) it does nothing: that one holds it and gives it to the cell. Uses ``_signal``
    directly: ``signal.signal`` converts handlers to enums, 20x slower, and this runs twice
    per cell.
    """

    def __init__(self) -> None:
        self.pending = False
        self.handler: Any = None

    def __enter__(self) -> held_interrupts:
        if threading.current_thread() is not threading.main_thread():
            return self
        previous = _signal.getsignal(_signal.SIGINT)
        if callable(previous) and not getattr(previous, HOLDS, False):  # SIG_IGN, SIG_DFL:
            self.handler = previous  # nothing Python-level to hold
            _signal.signal(_signal.SIGINT, self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handler is not None:
            _signal.signal(_signal.SIGINT, self.handler)

    @holds
    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.pending = True

    def deliver(self) -> None:
        """Give a held SIGINT to the handler it was held from (Python's default raises)."""
        if self.pending:
            self.pending = False
            try:
                if callable(self.handler):
                    self.handler(_signal.SIGINT, None)
                else:
                    raise KeyboardInterrupt
            except KeyboardInterrupt as error:
                shown_plain(error)  # shown without this frame and the magic's
                raise


class CellStopper(ast.NodeTransformer):
    """An AST transformer that turns the cell about to run into ``raise KeyboardInterrupt``
    when ``stop()`` says a Ctrl-C was held before it; with ``once`` it leaves after one cell."""

    def __init__(self, shell: Any, stop: Callable[[], bool], once: bool = False) -> None:
        self._shell = shell
        self._stop = stop
        self.once = once

    def visit(self, node: ast.AST) -> ast.AST:
        __tracebackhide__ = True  # read by IPython's traceback formatter
        if self.once and self in self._shell.ast_transformers:
            self._shell.ast_transformers.remove(self)
        if not self._stop() or not isinstance(node, ast.Module):
            return node
        stop = ast.parse("raise KeyboardInterrupt")
        return ast.copy_location(ast.Module(body=stop.body, type_ignores=[]), node)


def interrupt_next_cell(shell: Any) -> None:
    """Make the cell about to run stop at once with ``KeyboardInterrupt`` (a held Ctrl-C)."""
    transformers = getattr(shell, "ast_transformers", None)
    if isinstance(transformers, list) and not any(
        isinstance(t, CellStopper) and t.once for t in transformers
    ):
        transformers.insert(0, CellStopper(shell, lambda: True, once=True))


def interrupt_finished_cell(shell: Any, result: Any) -> None:
    """Mark a cell that ended while Ctrl-C was held as interrupted, as IPython would show it."""
    if getattr(result, "error_in_exec", True) is None and hasattr(result, "error_in_exec"):
        error = KeyboardInterrupt()
        result.error_in_exec = error
        shell.showtraceback((KeyboardInterrupt, error, None))
