"""A Ctrl-C lost in a finalizer is raised again where Python would deliver one, not sooner."""

from __future__ import annotations

import sys

import pytest

from kerasmagic.interrupts.lost import RaiseInFrame


class _LosesOne:
    """A finalizer that lost a Ctrl-C: the frame that dropped the last reference gets it."""

    def __del__(self) -> None:
        RaiseInFrame(sys._getframe(1))


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
