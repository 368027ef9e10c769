"""Re-raise a Ctrl-C that Python would drop because it landed in a finalizer or gc callback.

An interrupt raised while a ``__del__``, a weakref callback or a gc callback runs (JAX registers
one; TensorFlow and Keras keep weakref callbacks) cannot propagate: Python hands it to
``sys.unraisablehook``, which prints "Exception ignored" and drops it, and the cell runs on to
its end. While the extension is loaded, kerasmagic's hook raises it again in the code that was
interrupted: the frame that was running when the callback started gets ``KeyboardInterrupt``
where Python would have raised a Ctrl-C that had not met a callback (``delivery.py``), through
a one-shot trace function on that frame alone (``sys.settrace``): never where Python itself does
not, such as between a ``with`` block's end and its ``__exit__``. When the kernel guard is following
that interrupt (``swallowed.py``), it raises it there itself and goes on following it: a
library's bare ``except:`` around the code cannot drop it then. Callbacks still to run in the
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

from kerasmagic.interrupts.delivery import Pending, want_opcodes, yielding
from kerasmagic.interrupts.ownframes import shown_plain
from kerasmagic.interrupts.pyversions import frames_checked
from kerasmagic.interrupts.swallowed import following
from kerasmagic.shellstate import ShellState


class RaiseInFrame:
    """Raise ``KeyboardInterrupt`` in ``frame`` once, where Python would raise a Ctrl-C next
    (``delivery.py``): at a loop's jump back, after a call returns, at the start of a Python
    function it calls, or as it returns; a generator that yields hands it to its consumer.

    Only ``frame`` is traced: frames that start meanwhile (callbacks still to run in the same
    instruction) are not. Each frame's own trace settings are put back first, so a debugger
    used later in it still works.
    """

    def __init__(self, frame: FrameType) -> None:
        self._frame: FrameType | None = None
        self._follow(frame)
        sys.settrace(self._new_frame)  # tracing on: the frame's own f_trace is called

    def _follow(self, frame: FrameType) -> None:
        self._frame, self._pending = frame, Pending.at(frame)
        self._saved = (frame.f_trace, frame.f_trace_lines, frame.f_trace_opcodes)
        frame.f_trace_lines = False
        frame.f_trace = self._local
        want_opcodes(frame, self._new_frame)

    def _let_go(self) -> None:
        frame, self._frame = self._frame, None
        if frame is not None:
            frame.f_trace, frame.f_trace_lines, frame.f_trace_opcodes = self._saved

    def _new_frame(self, frame: FrameType, event: str, arg: object) -> Any:
        __tracebackhide__ = True
        target = self._frame
        if target is None:
            return None
        if frame is target:
            return self._local  # a generator resumed: its events are still wanted
        if frame.f_back is target and self._pending.due_in_callee(target):
            self._raise()  # a call into Python code: its start, as Python's own check
        return None  # other frames are not traced

    def _local(self, frame: FrameType, event: str, arg: object) -> Any:
        __tracebackhide__ = True  # read by IPython's traceback formatter
        if frame is not self._frame:
            return None
        if event == "opcode":
            if self._pending.due(frame):
                self._raise()
        elif event == "return" and yielding(frame) and frame.f_back is not None:
            own = self._saved[0]
            self._let_go()  # a generator yielding: its consumer takes it on
            self._follow(frame.f_back)
            return own  # what CPython keeps as the generator's trace function
        elif event == "return":
            self._raise()  # returning: the caller gets it, as after its call returned
        return self._local

    def _raise(self) -> None:
        __tracebackhide__ = True
        if sys.gettrace() == self._new_frame:  # a debugger set since keeps its tracer
            sys.settrace(None)
        self._let_go()
        raise shown_plain(KeyboardInterrupt())


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
                RaiseInFrame(interrupted)
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
