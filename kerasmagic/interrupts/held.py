"""Hold Ctrl-C while kerasmagic's own work runs, then hand it to the user's cell; and show an
error kerasmagic raises or passes on without kerasmagic's frames.

A ``KeyboardInterrupt`` raised inside a finalizer or weakref callback during ``gc.collect()``
is printed as "Exception ignored" and lost, and one raised in an IPython event hook is shown as
"Error in callback". So SIGINT is recorded, not raised, while cleanup or a hook runs; afterwards
the interrupt is delivered where the user expects it: the cell stops with ``KeyboardInterrupt``.

A ``KeyboardInterrupt`` raised by the kernel guard's SIGINT handler, by the trace function that
raises a lost one again, by the one that raises one a library dropped, or handed over after
kerasmagic held it through its own work (``%%fresh_model``'s cleanup), carries the frames of
that code as its innermost entries, and IPython always shows the innermost frame, hidden or
not. Such an interrupt renders itself (``_render_traceback_``, IPython's hook for exceptions
that format their own traceback): its traceback is cut after the last frame that is neither
kerasmagic's nor, below one of kerasmagic's, IPython's call of a magic, then formatted by the
shell. The notebook shows the user's line last, as ipykernel's own handler (a C function)
leaves it.

An error a ``%%fresh_model`` cell raises passed through IPython's call of the magic and
kerasmagic's runner; it renders from the cell's own frame on, as the same error in a plain cell
does (IPython 8 hides the frames between but shows the magic's call line, IPython 7 shows all).
"""

from __future__ import annotations

import _signal
import ast
import contextlib
import functools
import os
import threading
import traceback
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from kerasmagic.compat.registry import works

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # kerasmagic/


class Recorder:
    """Records SIGINT instead of raising it (``_record``: under it, another hold is not needed)."""

    pending = False  # a Ctrl-C was recorded

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.pending = True


class held_interrupts(Recorder):
    """Record SIGINT instead of raising it for the block (main thread only; elsewhere no-op).

    ``pending`` says whether one arrived; ``deliver()`` then hands it to the handler it was
    held from. Under a hold already in place (an outer ``held_interrupts``, the kernel guard's
    recorder) it does nothing: that one holds it and gives it to the cell. Uses ``_signal``
    directly: ``signal.signal`` converts handlers to enums, 20x slower, and this runs twice
    per cell.
    """

    handler: Any = None

    def __enter__(self) -> held_interrupts:
        if threading.current_thread() is not threading.main_thread() or not works("cpython.signal"):
            return self  # (moved: said once, by compat; Ctrl-C raises as Python's own)
        previous = _signal.getsignal(_signal.SIGINT)
        held = getattr(previous, "__func__", None) is Recorder._record  # a hold's recorder
        if callable(previous) and not held:  # SIG_IGN, SIG_DFL: nothing Python-level to hold
            self.handler = previous
            _signal.signal(_signal.SIGINT, self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handler is not None:
            _signal.signal(_signal.SIGINT, self.handler)

    def deliver(self) -> None:
        """Give a held SIGINT to the handler it was held from (Python's default raises)."""
        if self.pending:
            self.pending = False
            try:
                self.handler(_signal.SIGINT, None)
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
        return ast.parse("raise KeyboardInterrupt")


def interrupt_next_cell(shell: Any) -> None:
    """Make the cell about to run stop at once with ``KeyboardInterrupt`` (a held Ctrl-C)."""
    if not works("ipython.transformers", shell):  # moved: said once, by compat; the cell runs
        return
    if not any(isinstance(t, CellStopper) and t.once for t in shell.ast_transformers):
        shell.ast_transformers.insert(0, CellStopper(shell, lambda: True, once=True))


def interrupt_finished_cell(shell: Any, result: Any) -> None:
    """Mark a cell that ended while Ctrl-C was held as interrupted, as IPython would show it."""
    if getattr(result, "error_in_exec", True) is None:
        error = KeyboardInterrupt()
        result.error_in_exec = error
        shell.showtraceback((KeyboardInterrupt, error, None))


def _in(folder: str, tb: TracebackType) -> bool:
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(folder + os.sep)


def _render(error: BaseException, cell: str | None) -> list[str]:
    """Return IPython's rendering of ``error``: from the first frame of the code in file
    ``cell`` on, when its traceback holds one (the cell's own frame), and without its innermost
    entries that are kerasmagic's and then IPython's (its magic dispatch above ours)."""
    import IPython
    from IPython.core.getipython import get_ipython

    entries, tb = [], error.__traceback__
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    files = [entry.tb_frame.f_code.co_filename for entry in entries]
    offset = None
    if cell in files:
        entries, offset = entries[files.index(cell) :], 0
    ipython, keep = os.path.dirname(os.path.abspath(IPython.__file__)), len(entries)
    while keep > 1 and _in(PACKAGE, entries[keep - 1]):
        keep -= 1
    while len(entries) > keep > 1 and _in(ipython, entries[keep - 1]):
        keep -= 1
    if keep < len(entries):
        entries[keep - 1].tb_next = None  # at least one entry kept
    tb = entries[0] if entries else None
    shell: Any = get_ipython()
    if shell is None or not works("ipython.traceback", shell):  # Python's own format
        return traceback.format_exception(type(error), error, tb)
    formatter = shell.InteractiveTB
    return list(formatter.structured_traceback(type(error), error, tb, tb_offset=offset))


def shown_plain(error: BaseException, cell: str | None = None) -> BaseException:
    """Return ``error``, made to show in IPython without kerasmagic's frames at its end and,
    given the file of a ``%%fresh_model`` cell's code, from that cell's frame on, as the same
    error in a plain cell shows (not from IPython's call of the magic)."""
    if "_render_traceback_" in dir(type(error)) or not works("ipython.render_hook"):
        return error  # renders itself (an isolated cell's error), or IPython no longer asks
    with contextlib.suppress(TypeError):  # an exception type without a __dict__: as it is
        vars(error)["_render_traceback_"] = functools.partial(_render, error, cell)
    return error


class plain_interrupts:  # a context manager, named as held_interrupts is
    """A Ctrl-C that stops kerasmagic's own work in a magic (``%gpu_mem --deep`` scans every
    object) shows as one at the magic's line, without kerasmagic's frames or what they ran."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            raise shown_plain(KeyboardInterrupt()) from None
