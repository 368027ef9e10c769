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


def frame_locals(
    label: str, tb: pytypes.TracebackType, namespace: Mapping[str, Any]
) -> Iterator[tuple[str, Any]]:
    """Yield ``("sys.last_traceback (fn: name)", value)`` for the locals a traceback keeps.

    A cell's own frame is skipped: its locals are the user namespace itself.
    """
    walker: pytypes.TracebackType | None = tb
    while walker is not None:
        frame = walker.tb_frame
        if frame.f_locals is not namespace:
            for name, value in list(frame.f_locals.items()):
                yield f"{label} ({frame.f_code.co_name}: {name})", value
        walker = walker.tb_next


def clear_frames(tb: pytypes.TracebackType) -> None:
    """Drop the locals of every finished frame of ``tb`` (the error text stays for ``%tb``)."""
    walker: pytypes.TracebackType | None = tb
    while walker is not None:
        frame = walker.tb_frame
        with contextlib.suppress(RuntimeError):  # a frame still running stays as it is
            frame.clear()
        if frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            _ = frame.f_locals  # Python 3.11 keeps a stale locals dict until re-synced
        walker = walker.tb_next
