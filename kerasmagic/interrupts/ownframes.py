"""Show an error of a ``%%fresh_model`` cell as a plain cell's, and an interrupt kerasmagic
raises without kerasmagic's frames at the end of its traceback.

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

import contextlib
import functools
import os
import traceback
from types import TracebackType
from typing import Any

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # kerasmagic/


def _in(folder: str, tb: TracebackType) -> bool:
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(folder + os.sep)


def cut_own_frames(tb: TracebackType | None, ipython: str = "") -> None:
    """Cut the innermost entries of ``tb`` that are kerasmagic's, and then those in ``ipython``
    (IPython's folder: its magic dispatch above ours), keeping at least one entry."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    keep = len(entries)
    while keep > 1 and _in(PACKAGE, entries[keep - 1]):
        keep -= 1
    while ipython and len(entries) > keep > 1 and _in(ipython, entries[keep - 1]):
        keep -= 1
    if keep < len(entries):
        entries[keep - 1].tb_next = None


def _from_cell(tb: TracebackType | None, cell: str) -> TracebackType | None:
    """Return the entry of ``tb`` at the first frame of the code in file ``cell``, or None."""
    while tb is not None and tb.tb_frame.f_code.co_filename != cell:
        tb = tb.tb_next
    return tb


def _in_chain(tb: TracebackType | None, entry: TracebackType) -> bool:
    while tb is not None and tb is not entry:
        tb = tb.tb_next
    return tb is entry


def _render(error: BaseException, start: TracebackType | None) -> list[str]:
    """Return IPython's rendering of ``error`` with kerasmagic's frames cut off its end and,
    from ``start`` on when its traceback still holds that entry (the cell's own frame)."""
    import IPython
    from IPython.core.getipython import get_ipython

    tb, offset = error.__traceback__, None
    if start is not None and _in_chain(tb, start):
        tb, offset = start, 0
    cut_own_frames(tb, os.path.dirname(os.path.abspath(IPython.__file__)))
    shell: Any = get_ipython()
    if shell is None:  # rendered outside a shell: Python's own format
        return traceback.format_exception(type(error), error, tb)
    formatter = shell.InteractiveTB
    return list(formatter.structured_traceback(type(error), error, tb, tb_offset=offset))


def shown_plain(error: BaseException, cell: str | None = None) -> BaseException:
    """Return ``error``, made to show in IPython without kerasmagic's frames at its end and,
    given the file of a ``%%fresh_model`` cell's code, from that cell's frame on, as the same
    error in a plain cell shows (not from IPython's call of the magic)."""
    if "_render_traceback_" in dir(type(error)):  # renders itself (an isolated cell's error)
        return error
    start = None if cell is None else _from_cell(error.__traceback__, cell)
    with contextlib.suppress(TypeError):  # an exception type without a __dict__: as it is
        vars(error)["_render_traceback_"] = functools.partial(_render, error, start)
    return error
