"""Shared fixtures: a real in-process IPython shell and tiny real Keras models."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import faultcounts
import pytest
from IPython.core.interactiveshell import InteractiveShell
from jupyter_client.manager import KernelManager

# Started in the background without job control (``nohup cmd &`` in a script), this process
# inherits SIGINT ignored: Python then installs no Ctrl-C handler, and neither do the kernels and
# children the tests start, so every Ctrl-C test would see nothing happen. Ctrl-C as a user has it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Skip ``@pytest.mark.gpu`` tests on machines without an NVIDIA GPU."""
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip)


def pytest_sessionfinish(session: Any) -> None:
    """In a pytest-xdist worker: hand the fault-and-fuzz counts to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if isinstance(output, dict):
        output["faultcounts"] = dict(faultcounts.COUNTS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """The controller (``pytest -n 2``): add each worker's counts to the summary's."""
    for name, count in getattr(node, "workeroutput", {}).get("faultcounts", {}).items():
        faultcounts.COUNTS[name] = faultcounts.COUNTS.get(name, 0) + count


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the fault-and-fuzz suite's counts (``faultcounts``) when any fault test ran."""
    line = faultcounts.summary()
    if line is not None:
        terminalreporter.write_sep("-", "fault-and-fuzz suite")
        terminalreporter.write_line(line)


@pytest.fixture
def ip() -> Iterator[InteractiveShell]:
    """A real IPython shell with kerasmagic loaded, a clean namespace, unloaded afterwards."""
    shell = InteractiveShell.instance()
    # An earlier test's error: its traceback's frames lead back to that test's frame and locals.
    for stored in ("last_type", "last_value", "last_traceback", "last_exc"):
        setattr(sys, stored, None)
    shell.last_execution_result = None
    if hasattr(shell.InteractiveTB, "tb"):  # IPython's formatter keeps the last one it showed
        shell.InteractiveTB.tb = None
    if hasattr(shell.SyntaxTB, "last_syntax_error"):  # IPython keeps the last SyntaxError
        shell.SyntaxTB.last_syntax_error = None
    shell.run_line_magic("reset", "-f")
    shell.history_manager.reset()  # type: ignore[union-attr]
    shell.execution_count = 1
    shell.run_line_magic("load_ext", "kerasmagic")
    yield shell
    shell.run_line_magic("unload_ext", "kerasmagic")
    shell.run_line_magic("reset", "-f")


SETUP = """
import numpy as np, keras, tensorflow as tf
x = np.random.default_rng(0).random((256, 20), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 2, 256)
def build(units=8):
    m = keras.Sequential([keras.Input((20,)), keras.layers.Dense(units, activation="relu"),
                          keras.layers.Dense(2)])
    m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m
"""


def names_cell(text: str, number: int, line: int) -> bool:
    """Return whether a shown traceback or syntax error points at line ``line`` of cell
    ``In[number]``, in the form this IPython writes it: ``Cell In[2], line 3`` (IPython 8+),
    or ``"<ipython-input-2-...>", line 3`` and ``----> 3`` (IPython 7)."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    if f"Cell In[{number}], line {line}" in plain:
        return True
    named = f"<ipython-input-{number}-" in plain
    return named and (f", line {line}" in plain or re.search(rf"-+> {line} ", plain) is not None)


def run(shell: InteractiveShell, code: str) -> Any:
    """Run a cell as a user would (stored in history, Out[] filled); raise what it raised."""
    result = shell.run_cell(code, store_history=True)
    if result.error_before_exec is not None:
        raise result.error_before_exec
    if result.error_in_exec is not None:
        raise result.error_in_exec
    return result.result


@pytest.fixture
def kip(ip: InteractiveShell) -> InteractiveShell:
    """The ``ip`` shell with Keras, data ``x``/``y`` and ``build()`` defined.

    Skipped only in a run told it has no TensorFlow (``KERASMAGIC_TESTS_WITHOUT_TF=1``: CI's
    runs on Pythons the main venv is not, for the code that does not need it).
    """
    if os.environ.get("KERASMAGIC_TESTS_WITHOUT_TF") == "1":
        pytest.skip("needs Keras and TensorFlow; this run is without them")
    run(ip, SETUP)
    return ip


@contextmanager
def real_kernel(
    cwd: str, backend: str = "tensorflow", load: bool = True
) -> Iterator[tuple[KernelManager, Any]]:
    """A real ipykernel in ``cwd`` on Keras ``backend``, kerasmagic loaded unless told; shut down
    after."""
    km = KernelManager(kernel_name="python3")
    # A kernel that crashes prints where (Python's faulthandler), into the test's captured stderr.
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONFAULTHANDLER": "1"}
    km.start_kernel(cwd=cwd, env=env)
    client = km.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        if load:
            client.execute_interactive("%load_ext kerasmagic", timeout=60)
        yield km, client
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)


def kernel_run(
    client: Any, code: str, timeout_s: float = 120, on_busy: Any = None, stop_on_error: bool = True
) -> tuple[dict[str, Any], str]:
    """Run ``code``; return the execute reply's content and everything the cell printed.

    ipykernel 6.x aborts a request that arrives before it has stopped aborting after the
    previous request's error (a window that closes on its next loop turn; on a busy machine a
    test's next cell can land in it). An aborted request never ran, so it is sent again; a
    test sees "aborted" only if that keeps happening. ``stop_on_error=False`` opens no window.
    """
    for _ in range(ABORTED_RETRIES):
        content, text = _run(client, code, timeout_s, on_busy, stop_on_error)
        if content.get("status") != "aborted":
            break
        time.sleep(0.1)
    return content, text


ABORTED_RETRIES = 3


def _run(
    client: Any, code: str, timeout_s: float, on_busy: Any, stop_on_error: bool
) -> tuple[dict[str, Any], str]:
    msg_id = client.execute(code, stop_on_error=stop_on_error)
    text, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            msg = client.get_iopub_msg(timeout=timeout_s)
        except queue.Empty:
            said = stuck(client)
            raise AssertionError(f"the kernel sent nothing for {timeout_s:.0f} s: {said}") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "execute_input" and on_busy is not None:
            on_busy()
        elif kind == "stream":
            text.append(content["text"])
        elif kind == "error":
            text.append("\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            break
    reply = client.get_shell_msg(timeout=timeout_s)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = client.get_shell_msg(timeout=timeout_s)
    return reply["content"], "".join(text)


def stuck(client: Any) -> str:
    """Say why a kernel went quiet: its exit code, or what each of its threads is running (py-spy,
    when this machine lets it read another process)."""
    km = getattr(client, "parent", None)
    process = getattr(getattr(km, "provisioner", None), "process", None)
    if process is None:
        return "no kernel process to look at"
    if process.poll() is not None:
        return f"the kernel exited with code {process.returncode}"
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        return "the kernel is alive (no py-spy here to show its stacks)"
    try:
        dump = subprocess.run(
            [spy, "dump", "--pid", str(process.pid)], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as error:
        return f"the kernel is alive; py-spy failed: {error}"
    return f"the kernel is alive and running:\n{dump.stdout}{dump.stderr}"


def kernel_value(client: Any, expr: str) -> Any:
    """Return ``expr`` evaluated in the kernel, through JSON."""
    content, text = kernel_run(client, f"import json as _j; print(_j.dumps({expr}))")
    assert content["status"] == "ok", text
    return json.loads(text.strip().splitlines()[-1])
