"""Stored tracebacks (``sys.last_*``): the locals they keep alive, and letting those go."""

from __future__ import annotations

import contextlib
import inspect
import sys
import types as pytypes
from collections.abc import Iterator, Mapping
from typing import Any


def stored_tracebacks() -> Iterator[tuple[str, pytypes.TracebackType]]:
    """Yield ``("sys.last_...", traceback)`` for each stored error and the errors it chains."""
    seen: set[int] = set()  # errors (and tracebacks) already followed
    yielded: set[int] = set()  # tracebacks already yielded: one error has up to three names
    for attr in ("last_traceback", "last_value", "last_exc"):
        obj = getattr(sys, attr, None)
        while obj is not None and id(obj) not in seen:
            seen.add(id(obj))
            tb = (
                obj
                if isinstance(obj, pytypes.TracebackType)
                else getattr(obj, "__traceback__", None)
            )
            if tb is not None and id(tb) not in yielded:
                yielded.add(id(tb))
                yield f"sys.{attr}", tb
            obj = getattr(obj, "__context__", None) if isinstance(obj, BaseException) else None


_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
MAX_CALLERS = 1000


def _cell_boundaries() -> set[pytypes.CodeType]:
    """Return IPython's ``run_code``: a failed cell's frames end below it."""
    shell = getattr(sys.modules.get("IPython.core.interactiveshell"), "InteractiveShell", None)
    code = getattr(getattr(shell, "run_code", None), "__code__", None)
    return {code} if code is not None else set()


def kept_frames(tb: pytypes.TracebackType) -> Iterator[pytypes.FrameType]:
    """Yield the frames ``tb`` keeps alive: its own, and the callers each of them links to.

    A library that rewrites tracebacks (Keras filters its own frames out) leaves those frames
    out of ``tb`` but not dead: the frames still in it reach them through ``f_back``, with the
    model in their locals. The walk up stops at the cell's runner, at a generator or coroutine
    (a long-lived one, such as the kernel's dispatch loop, must never be finalized) and after
    ``MAX_CALLERS`` frames.
    """
    stops = _cell_boundaries()
    seen: set[int] = set()
    walker: pytypes.TracebackType | None = tb
    while walker is not None:
        frame: pytypes.FrameType | None = walker.tb_frame
        own = True
        for _ in range(MAX_CALLERS):
            if frame is None or id(frame) in seen:
                break
            if not own and (frame.f_code in stops or frame.f_code.co_flags & _SUSPENDABLE):
                break
            seen.add(id(frame))
            yield frame
            frame, own = frame.f_back, False
        walker = walker.tb_next


def frame_locals(
    label: str, tb: pytypes.TracebackType, namespace: Mapping[str, Any]
) -> Iterator[tuple[str, Any]]:
    """Yield ``("sys.last_traceback (fn: name)", value)`` for the locals a traceback keeps.

    A cell's own frame is skipped (its locals are the user namespace itself), and so is the
    namespace wherever a runner's frame holds it, as a local or in its ``*args``: its names are
    looked at as names, not once more for every frame that passed it on.
    """
    for frame in kept_frames(tb):
        if frame.f_locals is namespace:
            continue
        for name, value in list(frame.f_locals.items()):
            where = f"{label} ({frame.f_code.co_name}: {name})"
            if value is namespace:
                continue
            if type(value) is tuple and any(item is namespace for item in value):
                yield from (
                    (f"{where}[{i}]", item) for i, item in enumerate(value) if item is not namespace
                )
            else:
                yield where, value


def clear_frames(tb: pytypes.TracebackType) -> None:
    """Drop the locals of every finished frame ``tb`` keeps (the error text stays for ``%tb``)."""
    for frame in list(kept_frames(tb)):
        with contextlib.suppress(RuntimeError):  # a frame still running stays as it is
            frame.clear()
        if frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            _ = frame.f_locals  # Python 3.11 keeps a stale locals dict until re-synced


def drop_stored_errors(shell: Any | None) -> bool:
    """Forget the stored error: ``sys.last_*``, the shell's last result's error and the
    traceback IPython's formatter keeps; return whether there was one.

    Its frames keep the functions they ran even with their locals dropped, and an error while
    TensorFlow traced ``fit`` ran a function Keras made for that model alone.
    """
    found = False
    for attr in ("last_type", "last_value", "last_traceback", "last_exc"):
        if getattr(sys, attr, None) is not None:
            found = True
            setattr(sys, attr, None)
    result: Any = getattr(shell, "last_execution_result", None)
    if getattr(result, "error_in_exec", None) is not None:
        result.error_in_exec = None
    formatter: Any = getattr(shell, "InteractiveTB", None)
    if getattr(formatter, "tb", None) is not None:
        formatter.tb = None  # IPython's own "lingering reference" (ultratb's words)
    return found
