"""Show an interrupt kerasmagic raises without kerasmagic's frames at the end of its traceback.

A ``KeyboardInterrupt`` raised by the kernel guard's SIGINT handler, by the trace function that
raises a lost one again, or by the one that raises one a library dropped, carries the frames of
that code as its innermost entries, and IPython always shows the innermost frame, hidden or not.
Such an interrupt renders itself (``_render_traceback_``, IPython's hook for exceptions that
format their own traceback): its traceback is cut at the last frame that is not kerasmagic's
interrupt code, then formatted by the shell, so the notebook shows the user's line last, as
ipykernel's own handler (a C function) leaves it.
"""

from __future__ import annotations

import functools
import os
from types import TracebackType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def cut_own_frames(tb: TracebackType | None) -> None:
    """Cut ``tb`` before its first entry in kerasmagic's interrupt code (they come last)."""
    while tb is not None and tb.tb_next is not None:
        if os.path.dirname(tb.tb_next.tb_frame.f_code.co_filename) == HERE:
            tb.tb_next = None
            return
        tb = tb.tb_next


def _render(error: BaseException) -> list[str]:
    """Return IPython's rendering of ``error`` with kerasmagic's interrupt frames cut off."""
    from IPython.core.getipython import get_ipython

    cut_own_frames(error.__traceback__)
    shell: Any = get_ipython()
    formatter = shell.InteractiveTB
    return list(formatter.structured_traceback(type(error), error, error.__traceback__))


def shown_plain(error: BaseException) -> BaseException:
    """Return ``error``, made to show in IPython without kerasmagic's interrupt frames."""
    vars(error)["_render_traceback_"] = functools.partial(_render, error)
    return error
