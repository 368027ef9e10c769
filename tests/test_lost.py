"""A Ctrl-C lost in a finalizer is raised again where Python would deliver one, not sooner."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from kerasmagic.interrupts.watch import raise_lost


class _LosesOne:
    """A finalizer that lost a Ctrl-C: the frame that dropped the last reference gets it."""

    def __del__(self) -> None:
        raise_lost(sys._getframe(1))


def _runs_on(log: list[str]) -> None:
    lost = _LosesOne()
    del lost  # the finalizer runs inside this instruction: Python checks no signals after it
    step = "after the call"
    log.append(step)  # ... but after a call returns: raised here
    log.append("never")


def _returns(log: list[str]) -> str:
    lost = _LosesOne()
    del lost
    return "returned"  # no call left: raised as the frame returns


def test_a_lost_ctrl_c_waits_for_the_next_point_python_would_deliver_it() -> None:
    log: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        _runs_on(log)
    assert log == ["after the call"]
    assert sys.gettrace() is None


def test_a_lost_ctrl_c_is_raised_as_the_frame_returns_when_nothing_is_called() -> None:
    with pytest.raises(KeyboardInterrupt):
        _returns([])
    assert sys.gettrace() is None


class _Block:
    """A ``with`` block that logs its exit."""

    def __init__(self, log: list[object]) -> None:
        self.log = log

    def __enter__(self) -> None:
        self.log.append("enter")

    def __exit__(self, *exc: object) -> None:
        self.log.append("exit")


def _return_inside_with(log: list[object]) -> None:
    lost = [_LosesOne()]
    with _Block(log):
        return lost.clear()  # the finalizer runs in this C call; the with still exits


def _return_inside_try(log: list[object]) -> None:
    lost = [_LosesOne()]
    try:
        return lost.clear()
    finally:
        log.append("finally")


def _calls_python(log: list[object]) -> None:
    lost = _LosesOne()
    del lost
    _work(log)  # Python raises a pending Ctrl-C as this starts
    log.append("never")


def _work(log: list[object]) -> None:
    log.append("work ran")


def _yields(log: list[object]) -> Iterator[int]:
    with _Block(log):
        lost = _LosesOne()
        del lost
        yield 1  # no call before it: the consumer takes the interrupt on
        yield 2


@pytest.mark.parametrize("body", [_return_inside_with, _return_inside_try])
def test_a_lost_ctrl_c_never_skips_an_exit_or_a_finally(body: Any) -> None:
    log: list[object] = []
    with pytest.raises(KeyboardInterrupt):
        body(log)
    assert log in (["enter", "exit"], ["finally"])
    assert sys.gettrace() is None


def test_a_lost_ctrl_c_is_raised_as_a_python_function_starts() -> None:
    log: list[object] = []
    with pytest.raises(KeyboardInterrupt):
        _calls_python(log)
    assert log == []


def test_a_lost_ctrl_c_in_a_generator_stops_its_consumer_and_the_generator_exits() -> None:
    log: list[object] = []
    with pytest.raises(KeyboardInterrupt):
        for value in _yields(log):
            log.append(value)
    assert log == ["enter", 1, "exit"]
    assert sys.gettrace() is None


_LIBRARY = """
def swallows(log, make):
    try:
        lost = make()
        del lost  # the finalizer loses the Ctrl-C here
        log.append("after the call")  # raised once this call returns
    except:  # a library's bare except drops it, as TensorFlow's DType.max does
        log.append("caught")
    log.append("went on")  # raised again once this call returns
    log.append("never")
    return "done"
"""


def test_a_lost_ctrl_c_dropped_again_by_a_librarys_bare_except_is_raised_again() -> None:
    """The frame that lost it is followed as the kernel guard follows one: a bare ``except:``
    in library code (a file outside the user's, here ``<library>``) cannot drop it."""
    scope: dict[str, Any] = {}
    exec(compile(_LIBRARY, "<library>", "exec"), scope)
    log: list[object] = []
    with pytest.raises(KeyboardInterrupt):
        scope["swallows"](log, _LosesOne)
    assert log == ["after the call", "caught", "went on"]
    assert sys.gettrace() is None and sys.getprofile() is None


def test_every_lost_ctrl_c_of_a_session_is_raised_at_its_point() -> None:
    """The second follow in one process gets its opcode events too (Python 3.12 gave them only
    to the first until tracing was switched off and on: ``InterruptWatch._pend``)."""
    for _ in range(3):
        log: list[str] = []
        with pytest.raises(KeyboardInterrupt):
            _runs_on(log)
        assert log == ["after the call"]
    assert sys.gettrace() is None and sys.getprofile() is None
