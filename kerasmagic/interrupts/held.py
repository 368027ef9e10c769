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
from types import FrameType
from typing import Any

from kerasmagic.interrupts.ownframes import shown_plain


class held_interrupts:
    """Record SIGINT instead of raising it for the block (main thread only; elsewhere no-op).

    ``pending`` says whether one arrived; ``deliver()`` then hands it to the handler it was
    held from. Uses ``_signal`` directly: ``signal.signal`` converts handlers to enums, 20x
    slower, and this runs twice per cell.
    """

    def __init__(self) -> None:
        self.pending = False
        self.handler: Any = None

    def __enter__(self) -> held_interrupts:
        if threading.current_thread() is not threading.main_thread():
            return self
        previous = _signal.getsignal(_signal.SIGINT)
        if callable(previous):  # SIG_IGN or SIG_DFL: nothing Python-level to hold
            self.handler = previous
            _signal.signal(_signal.SIGINT, self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handler is not None:
            _signal.signal(_signal.SIGINT, self.handler)

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


class _RaiseInterrupt(ast.NodeTransformer):
    """Replace the next cell's code with ``raise KeyboardInterrupt``, once, then leave."""

    def __init__(self, shell: Any) -> None:
        self._shell = shell

    def visit(self, node: ast.AST) -> ast.AST:
        transformers = self._shell.ast_transformers
        if self in transformers:
            transformers.remove(self)
        if not isinstance(node, ast.Module):
            return node
        stop = ast.parse("raise KeyboardInterrupt")
        return ast.copy_location(ast.Module(body=stop.body, type_ignores=[]), node)


def interrupt_next_cell(shell: Any) -> None:
    """Make the cell about to run stop at once with ``KeyboardInterrupt`` (a held Ctrl-C)."""
    transformers = getattr(shell, "ast_transformers", None)
    if isinstance(transformers, list) and not any(
        isinstance(t, _RaiseInterrupt) for t in transformers
    ):
        transformers.insert(0, _RaiseInterrupt(shell))


def interrupt_finished_cell(shell: Any, result: Any) -> None:
    """Mark a cell that ended while Ctrl-C was held as interrupted, as IPython would show it."""
    if getattr(result, "error_in_exec", True) is None and hasattr(result, "error_in_exec"):
        error = KeyboardInterrupt()
        result.error_in_exec = error
        shell.showtraceback((KeyboardInterrupt, error, None))
