"""Where Python itself raises a pending Ctrl-C, so that a re-raised one lands nowhere else.

CPython checks for signals at a function's start (``RESUME``, also when a generator resumes),
at a loop's jump back and after a call returns, and raises there with the position of that
instruction: the ``try`` or ``with`` that covers it handles it. A trace function can only raise
at the *next* instruction, which may lie outside that cover (``return f()`` inside a ``with``:
the next instruction runs after ``__exit__``'s protection ends, and raising there skips it). So:

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
"""

from __future__ import annotations

import dis
import sys
import weakref
from dataclasses import dataclass
from types import CodeType, FrameType

RETURNS = {dis.opmap[n] for n in ("RETURN_VALUE", "RETURN_CONST") if n in dis.opmap}
_YIELD = dis.opmap["YIELD_VALUE"]
_RESUME = dis.opmap.get("RESUME", -1)
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
# Calls: Python checks for signals once they return.
_CALLS = {
    dis.opmap[n]
    for n in (
        "CALL",
        "CALL_KW",
        "CALL_FUNCTION",
        "CALL_FUNCTION_KW",
        "CALL_FUNCTION_EX",
        "CALL_METHOD",
    )
    if n in dis.opmap
}
# Jumps back (every loop's end): Python checks for signals as they jump.
_JUMPS_BACK = {
    dis.opmap[n]
    for n in (
        "JUMP_BACKWARD",
        "JUMP_ABSOLUTE",
        "POP_JUMP_BACKWARD_IF_FALSE",
        "POP_JUMP_BACKWARD_IF_TRUE",
        "POP_JUMP_BACKWARD_IF_NONE",
        "POP_JUMP_BACKWARD_IF_NOT_NONE",
    )
    if n in dis.opmap
}
Handler = tuple[int, int] | None  # an exception handler's target and stack depth; None: none
_handlers: weakref.WeakKeyDictionary[CodeType, tuple[tuple[int, int, int, int], ...]] = (
    weakref.WeakKeyDictionary()
)


def opcode(frame: FrameType, offset: int | None = None) -> int:
    """Return the opcode at ``offset`` (the frame's last instruction by default), past any
    ``EXTENDED_ARG`` prefix (Python 3.11 reports a prefixed instruction at the prefix)."""
    code = frame.f_code.co_code
    at = frame.f_lasti if offset is None else offset
    while 0 <= at < len(code) and code[at] == _EXTENDED_ARG:
        at += 2
    return code[at] if 0 <= at < len(code) else -1


def yielding(frame: FrameType) -> bool:
    """Return whether a ``return`` event of ``frame`` is a yield (3.13 reports it at the
    ``RESUME`` after the ``YIELD_VALUE``)."""
    op = opcode(frame)
    return op == _YIELD or (op == _RESUME and opcode(frame, frame.f_lasti - 2) == _YIELD)


def _handler(code: CodeType, offset: int) -> Handler:
    """Return the exception handler (target, stack depth) covering ``offset``, if any."""
    table = _handlers.get(code)
    if table is None:
        parse = getattr(dis, "_parse_exception_table", None)  # 3.11 to 3.13 have it
        entries = parse(code) if parse is not None else []
        table = tuple((e.start, e.end, e.target, e.depth) for e in entries)
        _handlers[code] = table
    for start, end, target, depth in table:
        if start <= offset < end:
            return target, depth
    return None


def protection(frame: FrameType, offset: int | None = None) -> Handler:
    """Return what would handle an exception at ``offset`` (the frame's last instruction)."""
    return _handler(frame.f_code, frame.f_lasti if offset is None else offset)


def raise_here(frame: FrameType, last: int, home: Handler) -> bool:
    """Return whether a Ctrl-C pending since ``frame`` ran the instruction at ``last`` may be
    raised now, at the frame's current instruction (its opcode event), as Python would: after a
    call or at a jump back, under ``home``, the protection the frame had when it came."""
    now = frame.f_lasti
    if now == last or protection(frame) != home:
        return False  # the line and opcode events of one instruction; an exit or a finally
    if opcode(frame) in _JUMPS_BACK:
        return True
    return opcode(frame, last) in _CALLS and protection(frame, last) == home


@dataclass
class Pending:
    """A Ctrl-C waiting in one frame for a point where Python would raise it."""

    last: int  # the frame's last instruction seen
    origin: int  # the instruction it was in when the Ctrl-C came
    home: Handler  # the protection it had then
    starts: bool  # a Python function it calls may get it at its start

    @classmethod
    def at(cls, frame: FrameType, starts: bool = True) -> Pending:
        """Wait in ``frame`` from its current instruction; ``starts=False`` for a frame that
        went on without it, maybe on its way out of a ``with``, calling the ``__exit__``."""
        return cls(frame.f_lasti, frame.f_lasti, protection(frame), starts)

    def due(self, frame: FrameType) -> bool:
        """At an opcode event of the frame: return whether to raise it now."""
        last, self.last = self.last, frame.f_lasti
        return raise_here(frame, last, self.home)

    def due_in_callee(self, caller: FrameType) -> bool:
        """At the start of a Python function ``caller`` calls: return whether to raise it there."""
        return self.starts and caller.f_lasti != self.origin and protection(caller) == self.home


def want_opcodes(frame: FrameType, tracer: object) -> None:
    """Have ``frame`` report each instruction to its trace function. On 3.12 that takes effect
    only when tracing is switched on afterwards (CPython gh-103615), and setting the tracer
    again changes nothing once the interpreter's events are on (a second follow in the same
    process saw no opcode events), so ``tracer`` is switched off and on. ``==``: a bound
    method is a new object each time it is read."""
    frame.f_trace_opcodes = True
    if sys.version_info[:2] == (3, 12) and sys.gettrace() == tracer:
        sys.settrace(None)
        sys.settrace(tracer)  # type: ignore[arg-type]
