"""The Ctrl-C code that reads opcodes and frames runs only on the Pythons it was checked on.

``kerasmagic.interrupts.watch.RUNNING`` is the seam: set to a Python it was not checked
on, loading the extension says so in one line and leaves lost interrupts to Python, in a real
shell (and, in ``tests/test_kernelguard.py``, in a real kernel).
"""

from __future__ import annotations

import logging
import sys

import pytest
from IPython.core.interactiveshell import InteractiveShell
from shared_cells import INTERRUPT_IN_GC_CALLBACK

from kerasmagic.compat import registry
from kerasmagic.interrupts import watch


def test_this_python_is_one_the_frame_code_was_checked_on() -> None:
    assert watch.unchecked() is None
    assert sys.version_info[:2] in watch.CHECKED


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # Python's own
def test_another_python_gets_one_line_and_python_s_own_behaviour(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, ip: InteractiveShell
) -> None:
    ip.run_line_magic("unload_ext", "kerasmagic")
    pythons_hook = sys.unraisablehook
    monkeypatch.setattr(watch, "RUNNING", ("cpython", (3, 14)))
    monkeypatch.setattr(registry, "_said", set())  # as in a new process: nothing said yet
    try:
        with caplog.at_level(logging.WARNING, logger="kerasmagic.compat"):
            ip.run_line_magic("load_ext", "kerasmagic")
            ip.run_line_magic("unload_ext", "kerasmagic")
            ip.run_line_magic("load_ext", "kerasmagic")  # told once per process
        (line,) = [r.getMessage() for r in caplog.records]
        assert line.startswith("kerasmagic: on cpython 3.14 a Ctrl-C that a library swallows")
        assert "checked on CPython 3.11 to 3.13 only" in line and "\n" not in line
        assert sys.unraisablehook is pythons_hook  # no lost-interrupt hook
        result = ip.run_cell(INTERRUPT_IN_GC_CALLBACK, store_history=True)
        assert result.success and ip.user_ns["reached"] is True  # dropped, as Python drops it
    finally:
        ip.run_line_magic("unload_ext", "kerasmagic")
        monkeypatch.undo()
        ip.run_line_magic("load_ext", "kerasmagic")
    result = ip.run_cell(INTERRUPT_IN_GC_CALLBACK, store_history=True)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)  # checked here: raised again


@pytest.mark.parametrize("running", [("pypy", (3, 11)), ("cpython", (3, 10))])
def test_other_implementations_and_versions_are_unchecked(
    monkeypatch: pytest.MonkeyPatch, running: tuple[str, tuple[int, int]]
) -> None:
    monkeypatch.setattr(watch, "RUNNING", running)
    line = watch.unchecked()
    assert line is not None and f"on {running[0]} " in line
