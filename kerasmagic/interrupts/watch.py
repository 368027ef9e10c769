"""Raise again a Ctrl-C that a library swallowed or Python lost: one engine, ``InterruptWatch``.

Swallowed: TensorFlow's ``DType.min`` and ``DType.max`` (read whenever Keras casts a random seed,
so in every model build) try ``finfo`` inside a bare ``except:``: a Ctrl-C landing there is
caught, and either dropped, the cell running on to its end, or turned into ``TypeError: Cannot
find maximum value``. TensorFlow and Keras hold some 60 more bare ``except:``.

While a cell runs in a kernel with kerasmagic loaded, a ``KeyboardInterrupt`` raised by SIGINT
is followed until it leaves the cell: the frames on the stack when it was raised are traced
(their lines, returns and exceptions, nothing else). If one of them turns it into another
exception in code that is not the user's, the interrupt is raised instead. If one goes on
without it (a bare ``except:`` or ``except BaseException:`` dropped it), it is raised again in
that frame at the next point where Python itself delivers a Ctrl-C (see "Where" below): after a
call returns, at a loop's jump back, or as the frame returns. Never at the code a frame runs
on its way out of a ``with`` or into a ``finally``: raising there would skip the ``__exit__``
or the ``finally`` (TensorFlow's context stacks then break: "Exiting device scope without
proper scope nesting"). Code of the user's (a cell, a function defined in one, a module outside
the installed packages) that catches it is left alone, and so is a library's ``except
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

Lost: an interrupt raised while a ``__del__``, a weakref callback or a gc callback runs (JAX
registers one; TensorFlow and Keras keep weakref callbacks) cannot propagate: Python hands it to
``sys.unraisablehook``, which prints "Exception ignored" and drops it, and the cell runs on to
its end. While the extension is loaded, kerasmagic's hook (``RedeliverInterrupts``, the
``lost_interrupts`` part) raises it again in the code that was interrupted: the frame that was
running when the callback started gets ``KeyboardInterrupt`` where Python would have raised a
Ctrl-C that had not met a callback: never where Python itself does not, such as between a
``with`` block's end and its ``__exit__``. The same ``InterruptWatch`` raises it there and
follows it out of that frame, so a library's bare ``except:`` around the code cannot drop it
again; when the kernel guard is already following that interrupt, its watch does so over all
the cell's frames. Callbacks still to run in the same collection are left alone (their frames
are new ones, not traced). Re-arming the signal instead would raise inside this hook, or inside
the next callback, and be lost again. With a tracer in place (a debugger, coverage) the
interrupt is shown and dropped as Python does; every other unraisable exception goes to the
hook that was there before.

Where Python itself raises a pending Ctrl-C (``Pending``), so that a re-raised one lands nowhere
else. CPython checks for signals at a function's start (``RESUME``, also when a generator
resumes), at a loop's jump back and after a call returns, and raises there with the position of
that instruction: the ``try`` or ``with`` that covers it handles it. A trace function can only
raise at the *next* instruction, which may lie outside that cover (``return f()`` inside a
``with``: the next instruction runs after ``__exit__``'s protection ends, and raising there
skips it). So:

- a jump back is raised at (its own opcode event, before it runs);
- a call that returned is raised after, when the next instruction has the same handler;
- a call into Python code is raised at the callee's start (``call`` event), as ``RESUME`` does,
  in a frame the Ctrl-C came to (not one that dropped it and went on: that one may be on its
  way out of a ``with`` already, calling the ``__exit__``);
- a frame's return hands it to the caller, as the caller's call returning would.

And only under the protection the frame had when the Ctrl-C came (the same ``try`` or ``with``
handles it): once the frame has left that block, not in its ``__exit__`` or ``finally`` (Python
would have raised inside the block, and run them), only after, or at the frame's return. Never
before a call into C code either: ``finally: lock.release()`` must release first.

The Pythons this was checked on (``CHECKED``): it reads the opcode each frame is at and traces
a frame opcode by opcode, which change with every CPython minor version. It was tested on
CPython 3.11, 3.12 and 3.13 (tests/test_kernelguard.py, tests/test_trust.py). On any other
Python it stays off, and loading the extension says so in one line: such interrupts are then
left to Python and ipykernel, as without kerasmagic. Holding Ctrl-C around kerasmagic's own work
and the kernel's code (``held``, ``guard``) uses only signal handlers and stays on.
"""

from __future__ import annotations

import dis
import linecache
import sys
import threading
import weakref
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

from kerasmagic.compat.registry import say_once, works
from kerasmagic.imports import library_file
from kerasmagic.interrupts.held import shown_plain
from kerasmagic.shellstate import ShellState

CHECKED = ((3, 11), (3, 12), (3, 13))
RUNNING = (sys.implementation.name, sys.version_info[:2])  # the seam tests change


def unchecked() -> str | None:
    """Return the line that says what is off on this Python, or None where all is checked."""
    implementation, version = RUNNING
    if implementation == "cpython" and version in CHECKED:
        return None
    newest = ".".join(map(str, CHECKED[-1]))
    return (
        f"kerasmagic: on {implementation} {'.'.join(map(str, version))} a Ctrl-C that a library "
        "swallows or a callback loses is left to Python (raising it again reads opcodes and "
        f"frames, checked on CPython 3.11 to {newest} only)"
    )


def frames_checked() -> bool:
    """Return whether the opcode- and frame-reading code may run; say once if it may not (the
    Python's line, or the registry's of a reach that moved)."""
    line = unchecked()
    if line is not None:
        say_once([line])
        return False
    return works("cpython.bytecode") and works("cpython.frames")


def _ops(*names: str) -> set[int]:
    """Return the opcodes of ``names`` this Python has (3.11 to 3.13 differ)."""
    return {dis.opmap[n] for n in names if n in dis.opmap}


RETURNS = _ops("RETURN_VALUE", "RETURN_CONST")
CALLS = _ops("CALL", "CALL_KW", "CALL_FUNCTION_EX")  # Python checks for signals once they return
JUMPS_BACK = _ops(  # every loop's end: Python checks for signals as it jumps back
    "JUMP_BACKWARD",
    *(f"POP_JUMP_BACKWARD_IF_{test}" for test in ("TRUE", "FALSE", "NONE", "NOT_NONE")),  # 3.11
)
YIELD, RESUME = dis.opmap["YIELD_VALUE"], dis.opmap["RESUME"]
EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
HANDLER_ENTRY = dis.opmap["PUSH_EXC_INFO"]  # the exception not yet in exc_info
MAX_RAISES = 20  # a library retrying in a loop around a bare except: give up, never hang
Handler = tuple[int, int] | None  # an exception handler's target and stack depth; None: none
_tables: weakref.WeakKeyDictionary[CodeType, list[Any]] = weakref.WeakKeyDictionary()


def opcode(frame: FrameType, offset: int | None = None) -> int:
    """Return the opcode at ``offset`` (the frame's last instruction by default), past any
    ``EXTENDED_ARG`` prefix (Python 3.11 reports a prefixed instruction at the prefix)."""
    code = frame.f_code.co_code
    at = frame.f_lasti if offset is None else offset
    while 0 <= at < len(code) and code[at] == EXTENDED_ARG:
        at += 2
    return code[at] if 0 <= at < len(code) else -1


def yielding(frame: FrameType) -> bool:
    """Return whether a ``return`` event of ``frame`` is a yield (3.13 reports it at the
    ``RESUME`` after the ``YIELD_VALUE``)."""
    op = opcode(frame)
    return op == YIELD or (op == RESUME and opcode(frame, frame.f_lasti - 2) == YIELD)


def protection(frame: FrameType, offset: int | None = None) -> Handler:
    """Return what would handle an exception at ``offset`` (the frame's last instruction)."""
    code, at = frame.f_code, frame.f_lasti if offset is None else offset
    if code not in _tables:
        _tables[code] = list(dis._parse_exception_table(code))  # type: ignore[attr-defined]
    for entry in _tables[code]:
        if entry.start <= at < entry.end:
            return entry.target, entry.depth
    return None


@dataclass
class Pending:
    """A Ctrl-C waiting in one frame for a point where Python would raise it."""

    last: int  # the frame's last instruction seen
    origin: int  # the instruction it was in when the Ctrl-C came
    home: Handler  # the protection it had then
    starts: bool  # a Python function it calls may get it at its start

    def due(self, frame: FrameType) -> bool:
        """At an opcode event of the frame: return whether to raise it now, as Python would:
        after a call or at a jump back, under the protection the frame had when it came."""
        last, self.last = self.last, frame.f_lasti
        if frame.f_lasti == last or protection(frame) != self.home:
            return False  # the line and opcode events of one instruction; an exit or a finally
        if opcode(frame) in JUMPS_BACK:
            return True
        return opcode(frame, last) in CALLS and protection(frame, last) == self.home

    def due_in_callee(self, caller: FrameType) -> bool:
        """At the start of a Python function ``caller`` calls: return whether to raise it there."""
        return self.starts and caller.f_lasti != self.origin and protection(caller) == self.home


def _library(frame: FrameType) -> bool:
    """Return whether ``frame`` runs code of an installed package or the standard library."""
    return library_file(frame.f_code.co_filename)


def _names_interrupt(frame: FrameType) -> bool:
    """Return whether the frame's line is an ``except`` clause naming ``KeyboardInterrupt``
    (IPython's ``!cmd``, a sweep returning what finished): a library catching it on purpose."""
    if frame.f_lineno is None:  # code Python added (a ``finally``'s copy): no line to read
        return False
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return line.startswith("except") and "KeyboardInterrupt" in line


def _replaced(error: BaseException) -> bool:
    """Return whether ``error`` is pybind11's for an exception that a Ctrl-C replaced as it was
    made (in its ``__init__``, as TensorFlow's C++ raised it): only its words say so, as it keeps
    no ``__context__``."""
    words = error.args[0] if isinstance(error, RuntimeError) and error.args else None
    return isinstance(words, str) and "REPLACED BY KeyboardInterrupt" in words


class InterruptWatch:
    """Follows one ``KeyboardInterrupt`` through the frames it was raised in."""

    def __init__(self, stop_at: set[CodeType], enabled: bool = True) -> None:
        self._stop_at = stop_at  # IPython's run_code: the cell's error handling, where it ends
        self._enabled = enabled  # off on a Python its opcode reading was not checked on
        self._clear()

    def _clear(self) -> None:
        """Follow nothing."""
        self._error: BaseException | None = None
        self._watched: dict[FrameType, tuple[Any, bool, bool]] = {}  # frame -> its trace settings
        self._caught: dict[FrameType, bool] = {}  # in an except block for it -> names it
        self._pending: dict[FrameType, Pending] = {}  # went on without it, or lost it again
        self._profiled = False  # the profile function that revives tracing is in place
        self._raised_at: tuple[FrameType, int] | None = None  # where it was last raised again
        self._outermost: FrameType | None = None
        self._once = False  # a lost Ctrl-C in the user's own frame: raised, then let go
        self._raised = 0

    def arm(self, frame: FrameType | None, error: BaseException) -> None:
        """Follow ``error``, about to be raised in ``frame``, up to the cell's runner."""
        self.disarm()
        frames: list[FrameType] = []
        while frame is not None and frame.f_code not in self._stop_at:
            frames.append(frame)
            frame = frame.f_back
        if frame is not None and frames and sys.gettrace() is None and self._enabled:
            self._start(error, frames)  # else not in a cell, a debugger traces, or off

    def arm_lost(self, frame: FrameType, error: BaseException) -> None:
        """Raise ``error``, a Ctrl-C that a finalizer or gc callback set off by ``frame`` lost
        (no watch was following it), in ``frame`` where Python would deliver one next, and
        follow it out of ``frame`` as ``arm`` does; not if a debugger traces or this is off."""
        self.disarm()
        if sys.gettrace() is None and self._enabled:
            self._start(error, [frame])
            self._once = not _library(frame)  # what the user's code does with it is theirs
            self._pend(frame, starts=True)

    def _start(self, error: BaseException, frames: list[FrameType]) -> None:
        """Trace ``frames`` (innermost first) for ``error`` up to the last of them."""
        self._error, self._outermost = error, frames[-1]
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
        self._clear()

    def redeliver(self, frame: FrameType | None) -> bool:
        """Raise the interrupt in ``frame`` where Python would deliver a Ctrl-C next, still
        followed (a finalizer or gc callback that ``frame`` set off lost it); return False,
        disarmed, if ``frame`` is not one of the followed frames."""
        if self._error is not None and frame is not None:
            self._revive(frame, "redeliver", None)  # tracing off since a raise: on again
        if self._error is None or frame is None or frame not in self._watched:
            self.disarm()
            return False
        self._caught.pop(frame, None)  # lost afresh: whatever caught it before has not seen this
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
        # it was raised at a return (no event for it), can have run untraced (any other unwind
        # is a profile event at once): one of the user's that had it then counts as having
        # caught it, so what it does next is its own choice.
        running: set[FrameType] = set()
        caller: FrameType | None = sys._getframe(1)
        while caller is not None:
            running.add(caller)
            caller = caller.f_back
        untraced: set[FrameType | None] = set()
        if self._raised_at is not None:
            raised, offset = self._raised_at
            untraced = {raised, raised.f_back} if opcode(raised, offset) in RETURNS else {raised}
        for watched in list(self._watched):
            if watched not in running:
                self._forget(watched)
                if self._error is None:
                    return  # nothing left to follow: disarmed
                continue
            if watched in untraced and not _library(watched):
                self._caught.setdefault(watched, False)
            if watched.f_trace is None:  # cleared by CPython in the frame that raised
                watched.f_trace = self._local
        sys.settrace(self._new_frame)
        if event == "return" and frame in self._watched:
            self._local(frame, event, arg)

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
                (value.__context__ is error or _replaced(value))
                and not isinstance(value, KeyboardInterrupt)  # ipykernel's "Interrupted by user"
                and _library(frame)
            ):
                self._raise_again(frame)  # turned into another exception: the interrupt instead
        elif event in ("line", "opcode"):
            if frame in self._pending:
                if self._pending[frame].due(frame):
                    self._raise_again(frame)  # dropped, it runs on: raised where Python would
            elif sys.exc_info()[1] is error:  # caught here: see what this frame does with it
                self._caught[frame] = self._caught.get(frame, False) or _names_interrupt(frame)
            elif opcode(frame) != HANDLER_ENTRY and self._stays(frame):  # else still raised
                self._pend(frame)  # went on without it
        elif event == "return" and frame in self._pending and yielding(frame):
            return self._hand_over(frame)
        elif event == "return":
            unwinding = self._raised_at == (frame, frame.f_lasti)  # raised again at its return
            if opcode(frame) in RETURNS and not unwinding:
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
        own = self._drop(generator)
        generator.f_trace, generator.f_trace_lines, generator.f_trace_opcodes = own
        if consumer is None:
            self.disarm()
            return own[0]
        if consumer not in self._watched:
            self._watch(consumer)
        if self._outermost is generator:
            self._outermost = consumer
        self._once = self._once and not _library(consumer)
        self._pend(consumer, starts=True)
        return own[0]

    def _stays(self, frame: FrameType) -> bool:
        """Return whether the interrupt must go on from ``frame`` (not the user's own catch)."""
        if frame in self._caught and (self._caught[frame] or not _library(frame)):
            self.disarm()  # caught on purpose: the user's code, or `except KeyboardInterrupt`
            return False
        return True

    def _pend(self, frame: FrameType, starts: bool = False) -> None:
        """Raise it in ``frame`` at the next point where Python raises a Ctrl-C (``Pending``);
        ``starts=False`` for a frame that went on without it, maybe on its way out of a
        ``with``, calling the ``__exit__``."""
        self._pending[frame] = Pending(frame.f_lasti, frame.f_lasti, protection(frame), starts)
        frame.f_trace_opcodes = True
        # On 3.12 that takes effect only when tracing is switched on afterwards (CPython
        # gh-103615; setting the tracer again changes nothing once the interpreter's events are
        # on: a second follow in the same process saw no opcode events), so off and on.
        # ``==``: a bound method is a new object each time it is read.
        if sys.version_info[:2] == (3, 12) and sys.gettrace() == self._new_frame:
            sys.settrace(None)
            sys.settrace(self._new_frame)

    def _drop(self, frame: FrameType) -> Any:
        """Stop following ``frame``; return its own trace settings."""
        self._caught.pop(frame, None)
        self._pending.pop(frame, None)
        return self._watched.pop(frame, None)

    def _forget(self, frame: FrameType) -> None:
        self._drop(frame)
        frame.f_trace = None
        if not self._watched:
            self.disarm()  # no frame left to follow it through

    def _raise_again(self, frame: FrameType) -> None:
        __tracebackhide__ = True
        error = self._error
        self._raised_at = (frame, frame.f_lasti)
        self._raised += 1
        if error is None or self._raised > MAX_RAISES:
            self.disarm()
            return
        if self._once:
            self.disarm()  # nothing of a library's left to drop it: untraced from here
            raise error
        self._caught.clear()
        self._pending.clear()
        raise error  # CPython switches tracing off: _revive switches it on again


def following() -> InterruptWatch | None:
    """Return the watch following an interrupt in this thread, if any."""
    for hook in (sys.gettrace(), sys.getprofile()):  # the tracer is off just after a raise
        watch = getattr(hook, "__self__", None)
        if isinstance(watch, InterruptWatch):
            return watch
    return None


def raise_lost(frame: FrameType) -> None:
    """Raise ``KeyboardInterrupt`` in ``frame`` where Python would raise a Ctrl-C next
    (``Pending``), and follow it out of ``frame`` (``InterruptWatch``): a bare
    ``except:`` there cannot drop it again; a generator that yields hands it to its consumer."""
    InterruptWatch(set()).arm_lost(frame, shown_plain(KeyboardInterrupt()))


class RedeliverInterrupts:
    """A ``sys.unraisablehook`` that re-raises a lost Ctrl-C and passes the rest on."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.active = True

    def __call__(self, unraisable: Any) -> None:
        kind = unraisable.exc_type
        if self.active and isinstance(kind, type) and issubclass(kind, KeyboardInterrupt):
            # The callback's own frame is the outermost of the traceback (kept alive by it), and
            # its caller the frame that was running when it was called, whatever hooks wrap this.
            tb = unraisable.exc_traceback
            frame = None if tb is None else tb.tb_frame.f_back
            watch = following()
            if watch is not None and watch.redeliver(frame):
                return  # raised in the code the callback left, still followed
            if threading.current_thread() is threading.main_thread() and sys.gettrace() is None:
                if frame is None and sys.unraisablehook is self:
                    frame = sys._getframe(1)  # lost in C code: the Python code running it
                if frame is not None:
                    raise_lost(frame)
                    return
        self.previous(unraisable)


_hook: RedeliverInterrupts | None = None  # one per process: sys.unraisablehook is
_shells: set[int] = set()  # shells that loaded the extension: the hook stays while any does


def load(state: ShellState) -> None:
    """The ``lost_interrupts`` part: put the hook in place (once per process, whatever number of
    shells load the extension), on the Pythons its frame reading was checked on."""
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
