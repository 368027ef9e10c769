"""Run a compiled ``%%fresh_model`` cell in the user namespace, as IPython runs a plain cell.

Code IPython compiles around every ``%%fresh_model`` call is new each time, and TensorFlow's
eager runtime keeps the innermost ~25 Python frames of ops keyed by code object (see
``cells.compiler``). So a cell runs below a fixed stack of padding frames that pushes
IPython's fresh frames out of the captured window. A cell that awaits at top level runs on
the shell's loop.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from types import CodeType
from typing import Any

from kerasmagic.cells.compiler import CompiledCell
from kerasmagic.interrupts.ownframes import shown_plain

PADDING_FRAMES = 32  # deeper than the frames TensorFlow captures from an eager op


def run(shell: Any, cell: CompiledCell, after: Callable[[], None]) -> Any:
    """Run ``cell``, then ``after()`` (also on error); return the value the cell shows.

    A cell that awaits runs on the shell's event loop: returned as a coroutine to await when
    a loop already runs this code (an awaiting cell, or ipykernel), else run through
    ``shell.loop_runner``, as IPython runs an awaiting plain cell.
    """
    __tracebackhide__ = True  # read by IPython's traceback formatter
    glob, loc = shell.user_global_ns, shell.user_ns
    if cell.is_async:
        coro = _run_async(cell, glob, loc, after)
        return coro if loop_running() else shell.loop_runner(coro)
    try:
        value = run_padded(_run_sync, cell, glob, loc)
    except BaseException as error:
        _from_cell(error, cell)
        raise
    finally:
        after()
    return None if cell.silenced else value


def _from_cell(error: BaseException, cell: CompiledCell) -> None:
    """Make ``error`` show from the cell's frame on, as in a plain cell (SystemExit, which
    IPython shows as one line, excepted)."""
    if not isinstance(error, SystemExit):
        shown_plain(error, cell.filename)


def loop_running() -> bool:
    """Whether an event loop runs this code (an awaiting cell, or ipykernel's)."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _make_pad(inner: Callable[..., Any], index: int) -> Callable[..., Any]:
    def pad(fn: Callable[..., Any], *args: Any) -> Any:
        __tracebackhide__ = True  # read by IPython's traceback formatter
        return inner(fn, *args)

    # A code object of its own per level: IPython then hides all of them as one line instead of
    # listing a run of "similar frames"; they are made once, so TF's cache sees the same keys.
    pad.__code__ = pad.__code__.replace(co_name=f"pad{index}", co_qualname=f"pad{index}")
    return pad


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    __tracebackhide__ = True
    return fn(*args)


_padded: Callable[..., Any] = _call
for _index in range(PADDING_FRAMES):
    _padded = _make_pad(_padded, _index)


def run_padded(fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` below ``PADDING_FRAMES`` fixed frames (hidden in IPython tracebacks)."""
    __tracebackhide__ = True
    return _padded(fn, *args)


def _run_sync(cell: CompiledCell, glob: dict[str, Any], loc: Any) -> Any:
    __tracebackhide__ = True
    eval(cell.body, glob, loc)
    return None if cell.last is None else eval(cell.last, glob, loc)


async def _run_async(
    cell: CompiledCell, glob: dict[str, Any], loc: Any, after: Callable[[], None]
) -> Any:
    __tracebackhide__ = True
    try:
        await _run_code(cell.body, glob, loc)
        value = None if cell.last is None else await _run_code(cell.last, glob, loc)
    except BaseException as error:
        _from_cell(error, cell)
        raise
    finally:
        after()
    return None if cell.silenced else value


async def _run_code(code: CodeType, glob: dict[str, Any], loc: Any) -> Any:
    """Evaluate ``code``, awaiting it if it was compiled as a coroutine (a value is not)."""
    __tracebackhide__ = True
    value = eval(code, glob, loc)
    if code.co_flags & inspect.CO_COROUTINE:
        coro: Coroutine[Any, Any, Any] = value
        return await coro
    return value


RUNNERS: tuple[Callable[..., Any], ...] = (_run_sync, _run_code)  # a cell's frame's caller
