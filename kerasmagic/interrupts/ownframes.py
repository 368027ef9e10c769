"""Show an interrupt kerasmagic raises without kerasmagic's frames at the end of its traceback.

A ``KeyboardInterrupt`` raised by the kernel guard's SIGINT handler, by the trace function that
raises a lost one again, by the one that raises one a library dropped, or handed over after
kerasmagic held it through its own work (``%%fresh_model``'s cleanup), carries the frames of
that code as its innermost entries, and IPython always shows the innermost frame, hidden or
not. Such an interrupt renders itself (``_render_traceback_``, IPython's hook for exceptions
that format their own traceback): its traceback is cut after the last frame that is neither
kerasmagic's nor, below one of kerasmagic's, IPython's call of a magic, then formatted by the
shell. The notebook shows the user's line last, as ipykernel's own handler (a C function)
leaves it.
"""

from __future__ import annotations

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


def _render(error: BaseException) -> list[str]:
    """Return IPython's rendering of ``error`` with kerasmagic's frames cut off its end."""
    import IPython
    from IPython.core.getipython import get_ipython

    cut_own_frames(error.__traceback__, os.path.dirname(os.path.abspath(IPython.__file__)))
    shell: Any = get_ipython()
    if shell is None:  # rendered outside a shell: Python's own format
        return traceback.format_exception(type(error), error, error.__traceback__)
    formatter = shell.InteractiveTB
    return list(formatter.structured_traceback(type(error), error, error.__traceback__))


def shown_plain(error: BaseException) -> BaseException:
    """Return ``error``, made to show in IPython without kerasmagic's frames at its end."""
    vars(error)["_render_traceback_"] = functools.partial(_render, error)
    return error
