"""Hold Ctrl-C while kerasmagic's own work runs, then hand it to the user's cell.

A ``KeyboardInterrupt`` raised inside a finalizer or weakref callback during ``gc.collect()``
is printed as "Exception ignored" and lost, and one raised in an IPython event hook is shown as
"Error in callback". So SIGINT is recorded, not raised, while cleanup or a hook runs; afterwards
the interrupt is delivered where the user expects it: the cell stops with ``KeyboardInterrupt``.
"""

from __future__ import annotations

import ast
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any


@dataclass
class Held:
    """Whether a SIGINT arrived while it was held, and the handler it was held from."""

    pending: bool = False
    handler: Any = None

    def deliver(self) -> None:
        """Give a held SIGINT to the handler it was held from (Python's default raises)."""
        if self.pending:
            self.pending = False
            if callable(self.handler):
                self.handler(signal.SIGINT, None)
            else:
                raise KeyboardInterrupt


@contextmanager
def held_interrupts() -> Iterator[Held]:
    """Record SIGINT instead of raising it for the block (main thread only; elsewhere no-op)."""
    held = Held()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):
        yield held  # SIG_IGN or SIG_DFL: nothing Python-level to hold
        return
    held.handler = previous

    def record(signum: int, frame: FrameType | None) -> None:
        held.pending = True

    signal.signal(signal.SIGINT, record)
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, previous)


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
