"""Raise a Ctrl-C again when library code below the cell swallows it.

TensorFlow's ``DType.min`` and ``DType.max`` (read whenever Keras casts a random seed, so in
every model build) try ``finfo`` inside a bare ``except:``: a Ctrl-C landing there is caught,
and either dropped, the cell running on to its end, or turned into ``TypeError: Cannot find
maximum value``. TensorFlow and Keras hold some 60 more bare ``except:``.

While a cell runs in a kernel with kerasmagic loaded, a ``KeyboardInterrupt`` raised by SIGINT
is followed until it leaves the cell: the frames on the stack when it was raised are traced
(their lines, returns and exceptions, nothing else). If one of them turns it into another
exception in code that is not the user's, the interrupt is raised instead. If one goes on
without it (a bare ``except:`` or ``except BaseException:`` dropped it), it is raised again in
that frame at the next point where Python itself delivers a Ctrl-C (``delivery.py``): after a
call returns, at a loop's jump back, or as the frame returns. Never at the code a frame runs
on its way out of a ``with`` or into a ``finally``: raising there would skip the ``__exit__``
or the ``finally`` (TensorFlow's context stacks then break: "Exiting device scope without
proper scope nesting"). Code of the user's (a cell, a function defined in one, a module outside the
installed packages) that catches it is left alone, and so is a library's ``except
KeyboardInterrupt:`` (IPython's ``!cmd`` stops the command and goes on, as it does without
kerasmagic). With a debugger or coverage tracing the kernel, nothing is followed.

Raising from a trace function switches tracing off (CPython does so for any tracer that raises),
so while the interrupt is followed a profile function (``sys.setprofile``, called at every call
and return) switches it on again, for the library frames still running: an interrupt raised
again and caught by a second bare ``except:`` further up is followed as well, and the user's
code that catches it then keeps it (the frames that may have run untraced in between are known:
the one it was raised in, and its caller when it was raised at a return). Under a profiler that
uses ``sys.setprofile`` (``%prun`` on Python 3.11; from 3.12 cProfile uses ``sys.monitoring``
and both run) it is followed up to the first raise only.
"""

from __future__ import annotations

import dis
import linecache
import sys
from types import CodeType, FrameType
from typing import Any

from kerasmagic.interrupts.delivery import RETURNS, Pending, opcode, want_opcodes, yielding
from kerasmagic.origin import library_file

_HANDLER_ENTRY = dis.opmap.get("PUSH_EXC_INFO", -1)  # 3.11+: exception not yet in exc_info
MAX_RAISES = 20  # a library retrying in a loop around a bare except: give up, never hang


def is_library(code: CodeType) -> bool:
    """Return whether ``code`` belongs to an installed package or the standard library."""
    return library_file(code.co_filename)


def _names_interrupt(frame: FrameType) -> bool:
    """Return whether the frame's line is an ``except`` clause naming ``KeyboardInterrupt``
    (IPython's ``!cmd``, a sweep returning what finished): a library catching it on purpose."""
    if frame.f_lineno is None:  # code Python added (a ``finally``'s copy): no line to read
        return False
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return line.startswith("except") and "KeyboardInterrupt" in line


class InterruptWatch:
    """Follows one ``KeyboardInterrupt`` through the frames it was raised in."""

    def __init__(self, stop_at: set[CodeType], enabled: bool = True) -> None:
        self._stop_at = stop_at  # IPython's run_code: the cell's error handling, where it ends
        self._enabled = enabled  # off on a Python its opcode reading was not checked on
        self._error: BaseException | None = None
        self._watched: dict[FrameType, tuple[Any, bool, bool]] = {}  # frame -> its trace settings
        self._handling: set[FrameType] = set()  # frames running an except block for it
        self._deliberate: set[FrameType] = set()  # ... one that names KeyboardInterrupt
        self._pending: dict[FrameType, Pending] = {}  # went on without it, or lost it again
        self._profiled = False  # the profile function that revives tracing is in place
        self._raised_at: tuple[FrameType, int] | None = None  # where it was last raised again
        self._outermost: FrameType | None = None
        self._once = False  # a lost Ctrl-C in the user's own frame: raised, then let go
        self.raised_again = 0

    def arm(self, frame: FrameType | None, error: BaseException) -> None:
        """Follow ``error``, about to be raised in ``frame``, up to the cell's runner."""
        self.disarm()
        frames: list[FrameType] = []
        while frame is not None and frame.f_code not in self._stop_at:
            frames.append(frame)
            frame = frame.f_back
        if frame is None or not frames or sys.gettrace() is not None or not self._enabled:
            return  # not inside a cell, a debugger traces, or off: raise as Python does
        self._start(error, frames)

    def arm_lost(self, frame: FrameType, error: BaseException) -> bool:
        """Raise ``error``, a Ctrl-C that a finalizer or gc callback set off by ``frame`` lost
        (no watch was following it), in ``frame`` where Python would deliver one next, and
        follow it out of ``frame`` as ``arm`` does; return False (nothing done) if a debugger
        traces or this watch is off."""
        self.disarm()
        if sys.gettrace() is not None or not self._enabled:
            return False
        self._start(error, [frame])
        self._once = not is_library(frame.f_code)  # what the user's code does with it is theirs
        self._pend(frame, starts=True)
        return True

    def _start(self, error: BaseException, frames: list[FrameType]) -> None:
        """Trace ``frames`` (innermost first) for ``error`` up to the last of them."""
        self._error, self._outermost, self.raised_again = error, frames[-1], 0
        for watched in frames:
            self._watch(watched)
        sys.settrace(self._new_frame)  # tracing on: the watched frames' own f_trace is called
        self._profiled = sys.getprofile() is None  # else a profiler's: leave it alone
        if self._profiled:
            sys.setprofile(self._revive)

    def _watch(self, frame: FrameType) -> None:
        self._watched[frame] = (frame.f_trace, frame.f_trace_lines, frame.f_trace_opcodes)
        frame.f_trace_lines, frame.f_trace_opcodes = True, False
        frame.f_trace = self._local

    def disarm(self) -> None:
        """Stop following: frames get their trace settings back, the tracer goes."""
        if self._error is None:
            return
        if sys.gettrace() == self._new_frame:
            sys.settrace(None)
        if sys.getprofile() == self._revive:
            sys.setprofile(None)
        for frame, (trace, lines, opcodes) in self._watched.items():
            frame.f_trace, frame.f_trace_lines, frame.f_trace_opcodes = trace, lines, opcodes
        self._watched.clear()
        self._handling.clear()
        self._deliberate.clear()
        self._pending.clear()
        self._error = self._outermost = self._raised_at = None
        self._profiled = self._once = False

    def redeliver(self, frame: FrameType | None) -> bool:
        """Raise the interrupt in ``frame`` where Python would deliver a Ctrl-C next, still
        followed (a finalizer or gc callback that ``frame`` set off lost it); return False,
        disarmed, if ``frame`` is not one of the followed frames."""
        if self._error is not None and frame is not None:
            self._revive(frame, "redeliver", None)  # tracing off since a raise: on again
        if self._error is None or frame is None or frame not in self._watched:
            self.disarm()
            return False
        self._handling.discard(frame)  # lost afresh: whatever caught it before has not seen this
        self._deliberate.discard(frame)
        self._pend(frame, starts=True)
        return True

    def _new_frame(self, frame: FrameType, event: str, arg: object) -> Any:
        __tracebackhide__ = True
        if frame in self._watched:
            return self._local  # a followed generator resumed: still followed
        caller = frame.f_back
        pending = self._pending.get(caller) if caller is not None else None
        if caller is not None and pending is not None and pending.due_in_callee(caller):
            self._raise_again(frame)  # a call into Python code: its start, as Python's check
        return None  # frames called from now on are not traced

    def _revive(self, frame: FrameType, event: str, arg: Any) -> None:
        """Profile function while following: after a raise switched tracing off, switch it on
        again at the next call or return (and give a watched frame's return to the tracer)."""
        __tracebackhide__ = True
        if self._error is None or sys.gettrace() is not None:
            return
        # Frames gone since are forgotten. Only the frame it was raised in, and its caller when
        # it was raised at a return, can have run untraced (any other unwind is a profile
        # event at once): one of the user's that had it then counts as having caught it, so
        # what it does next is its own choice.
        running: set[FrameType] = set()
        caller: FrameType | None = sys._getframe(1)
        while caller is not None:
            running.add(caller)
            caller = caller.f_back
        untraced = self._untraced()
        for watched in list(self._watched):
            if watched not in running:
                self._forget(watched)
                if self._error is None:
                    return  # nothing left to follow: disarmed
                continue
            if watched in untraced and not is_library(watched.f_code):
                self._handling.add(watched)
            if watched.f_trace is None:  # cleared by CPython in the frame that raised
                watched.f_trace = self._local
        sys.settrace(self._new_frame)
        if event == "return" and frame in self._watched:
            self._local(frame, event, arg)

    def _untraced(self) -> set[FrameType]:
        """Return the frames that may have run while tracing was off since the last raise."""
        if self._raised_at is None:
            return set()
        frame, offset = self._raised_at
        if opcode(frame, offset) in RETURNS and frame.f_back is not None:
            return {frame, frame.f_back}  # its caller got it without an event
        return {frame}

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        __tracebackhide__ = True  # read by IPython's traceback formatter
        error = self._error
        if error is None or frame not in self._watched:
            return None
        if self._profiled and sys.getprofile() is None:  # a raise from it switched it off
            sys.setprofile(self._revive)
        if event == "exception":
            value = arg[1]
            if value is error:
                self._pending.pop(frame, None)  # on its way out again
            elif (
                value.__context__ is error
                and not isinstance(value, KeyboardInterrupt)  # ipykernel's "Interrupted by user"
                and is_library(frame.f_code)
            ):
                self._raise_again(frame)  # turned into another exception: the interrupt instead
        elif event in ("line", "opcode"):
            if frame in self._pending:
                self._step(frame)
            elif sys.exc_info()[1] is error:
                self._handling.add(frame)  # caught here: see what this frame does with it
                if _names_interrupt(frame):
                    self._deliberate.add(frame)
            elif opcode(frame) != _HANDLER_ENTRY:  # else entering a handler, still raised
                self._went_on_without_it(frame)
        elif event == "return" and frame in self._pending and yielding(frame):
            return self._hand_over(frame)
        elif event == "return":
            op = opcode(frame)
            unwinding = self._raised_at == (frame, frame.f_lasti)  # raised again at its return
            if op in RETURNS and not unwinding:
                if self._stays(frame):
                    self._raise_again(frame)  # returns as if nothing happened: the caller gets it
            elif frame is self._outermost:
                self.disarm()  # it left the cell: IPython shows it
            elif not yielding(frame):  # unwinding (a yield leaves it as it is)
                self._forget(frame)
        return self._local

    def _hand_over(self, generator: FrameType) -> Any:
        """A generator yields with the interrupt still pending in it (no point on its way to
        the ``yield`` where Python raises one): its consumer takes it on, as Python would raise
        it there after the generator's resumption returned. Return the generator's own trace
        function, which CPython keeps as the suspended frame's."""
        consumer = generator.f_back
        own = self._watched.pop(generator)
        self._pending.pop(generator, None)
        self._handling.discard(generator)
        self._deliberate.discard(generator)
        generator.f_trace, generator.f_trace_lines, generator.f_trace_opcodes = own
        if consumer is None:
            self.disarm()
            return own[0]
        if consumer not in self._watched:
            self._watch(consumer)
        if self._outermost is generator:
            self._outermost = consumer
        self._once = self._once and not is_library(consumer.f_code)
        self._pend(consumer, starts=True)
        return own[0]

    def _stays(self, frame: FrameType) -> bool:
        """Return whether the interrupt must go on from ``frame`` (not the user's own catch)."""
        if frame in self._handling and (frame in self._deliberate or not is_library(frame.f_code)):
            self.disarm()  # caught on purpose: the user's code, or `except KeyboardInterrupt`
            return False
        return True

    def _went_on_without_it(self, frame: FrameType) -> None:
        if self._stays(frame):
            self._pend(frame)

    def _pend(self, frame: FrameType, starts: bool = False) -> None:
        """Raise it in ``frame`` at the next point where Python raises a Ctrl-C (``Pending``)."""
        self._pending[frame] = Pending.at(frame, starts)
        want_opcodes(frame, self._new_frame)

    def _step(self, frame: FrameType) -> None:
        """A frame that dropped the interrupt runs on: raise it where Python would deliver one."""
        __tracebackhide__ = True
        if self._pending[frame].due(frame):
            self._raise_again(frame)

    def _forget(self, frame: FrameType) -> None:
        self._watched.pop(frame, None)
        self._handling.discard(frame)
        self._deliberate.discard(frame)
        self._pending.pop(frame, None)
        frame.f_trace = None
        if not self._watched:
            self.disarm()  # no frame left to follow it through

    def _raise_again(self, frame: FrameType) -> None:
        __tracebackhide__ = True
        error = self._error
        self._raised_at = (frame, frame.f_lasti)
        self.raised_again += 1
        if error is None or self.raised_again > MAX_RAISES:
            self.disarm()
            return
        if self._once:
            self.disarm()  # nothing of a library's left to drop it: untraced from here
            raise error
        self._handling.clear()
        self._pending.clear()
        raise error  # CPython switches tracing off: _revive switches it on again


def following() -> InterruptWatch | None:
    """Return the watch following an interrupt in this thread, if any."""
    for hook in (sys.gettrace(), sys.getprofile()):  # the tracer is off just after a raise
        watch = getattr(hook, "__self__", None)
        if isinstance(watch, InterruptWatch):
            return watch
    return None
