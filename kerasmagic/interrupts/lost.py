"""Re-raise a Ctrl-C that Python would drop because it landed in a finalizer or gc callback.

An interrupt raised while a ``__del__``, a weakref callback or a gc callback runs (JAX registers
one; TensorFlow and Keras keep weakref callbacks) cannot propagate: Python hands it to
``sys.unraisablehook``, which prints "Exception ignored" and drops it, and the cell runs on to
its end. While the extension is loaded, kerasmagic's hook raises it again in the code that was
interrupted: the frame that was running when the callback started gets ``KeyboardInterrupt``
where Python would have raised a Ctrl-C that had not met a callback (``delivery.py``): never
where Python itself does not, such as between a ``with`` block's end and its ``__exit__``. The
one engine that follows a Ctrl-C (``swallowed.InterruptWatch``) raises it there and follows it
out of that frame, so a library's bare ``except:`` around the code cannot drop it again; when the
kernel guard is already following that interrupt, its watch does so over all the cell's frames.
Callbacks still to run in the
same collection are left alone (their frames are new ones, not traced). Re-arming the signal
instead would raise inside this hook, or inside the next callback, and be lost again.

With a tracer in place (a debugger, coverage) the interrupt is shown and dropped as Python
does; every other unraisable exception goes to the hook that was there before.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any

from kerasmagic.interrupts.ownframes import shown_plain
from kerasmagic.interrupts.pyversions import frames_checked
from kerasmagic.interrupts.swallowed import InterruptWatch, following
from kerasmagic.shellstate import ShellState


def raise_lost(frame: FrameType) -> None:
    """Raise ``KeyboardInterrupt`` in ``frame`` where Python would raise a Ctrl-C next
    (``delivery.py``), and follow it out of ``frame`` (``swallowed.InterruptWatch``): a bare
    ``except:`` there cannot drop it again; a generator that yields hands it to its consumer."""
    InterruptWatch(set()).arm_lost(frame, shown_plain(KeyboardInterrupt()))


def interrupted_frame(unraisable: Any) -> FrameType | None:
    """Return the frame that was running when the callback that lost the Ctrl-C was called.

    The callback's own frame is the outermost of the exception's traceback (kept alive by it),
    and its caller is the interrupted frame, whatever hooks wrap this one.
    """
    tb = getattr(unraisable, "exc_traceback", None)
    frame = getattr(tb, "tb_frame", None)
    return getattr(frame, "f_back", None)


class RedeliverInterrupts:
    """A ``sys.unraisablehook`` that re-raises a lost Ctrl-C and passes the rest on."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.active = True
        self.redelivered = 0

    def __call__(self, unraisable: Any) -> None:
        exc_type = getattr(unraisable, "exc_type", None)
        is_interrupt = isinstance(exc_type, type) and issubclass(exc_type, KeyboardInterrupt)
        watch = following() if self.active and is_interrupt else None
        if watch is not None and watch.redeliver(interrupted_frame(unraisable)):
            self.redelivered += 1  # raised in the code the callback left, still followed
            return
        if (
            self.active
            and is_interrupt
            and threading.current_thread() is threading.main_thread()
            and sys.gettrace() is None
        ):
            interrupted = interrupted_frame(unraisable)
            if interrupted is None and sys.unraisablehook is self:
                interrupted = sys._getframe(1)  # lost in C code: the Python code running it
            if interrupted is not None:
                self.redelivered += 1
                raise_lost(interrupted)
                return
        self.previous(unraisable)


_hook: RedeliverInterrupts | None = None  # one per process: sys.unraisablehook is
_shells: set[int] = set()  # shells that loaded the extension: the hook stays while any does


def load(state: ShellState) -> None:
    """Put the hook in place (once per process, whatever number of shells load the extension),
    on the Pythons its frame reading was checked on."""
    global _hook
    if not frames_checked():
        return
    _shells.add(id(state.shell))
    if _hook is None:
        _hook = RedeliverInterrupts(sys.unraisablehook)
        sys.unraisablehook = _hook


def unload(state: ShellState, handle: None) -> None:
    """Restore the previous hook; if another hook wrapped ours since, ours passes everything on."""
    global _hook
    _shells.discard(id(state.shell))
    if _hook is None or _shells:
        return
    if sys.unraisablehook is _hook:
        sys.unraisablehook = _hook.previous
    _hook.active = False
    _hook = None
