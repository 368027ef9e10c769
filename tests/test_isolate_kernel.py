"""``%%fresh_model --isolate`` in a real Jupyter kernel: live output, kernel death, no TF import."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import real_kernel
from jupyter_client.manager import KernelManager

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KernelManager, Any]]:
    """A real ipykernel with kerasmagic loaded; shut down afterwards."""
    with real_kernel(str(tmp_path_factory.mktemp("kernel"))) as (km, client):
        yield km, client


def execute(client: Any, code: str, timeout_s: float = 60) -> list[tuple[float, dict[str, Any]]]:
    """Run ``code``; return its iopub messages with their arrival times, up to idle."""
    msg_id = client.execute(code)
    messages = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = client.get_iopub_msg(timeout=timeout_s)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append((time.monotonic(), msg))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return messages
    raise TimeoutError(code)


def streamed(messages: list[tuple[float, dict[str, Any]]], name: str = "stdout") -> str:
    return "".join(
        m["content"]["text"]
        for _, m in messages
        if m["msg_type"] == "stream" and m["content"]["name"] == name
    )


def test_output_streams_live_while_the_cell_runs(kernel: tuple[KernelManager, Any]) -> None:
    _, client = kernel
    cell = (
        "%%fresh_model --isolate\nimport sys, time\n"
        "print('first', flush=True)\nsys.stdout.write('step 1\\rstep 2\\n')\n"
        "time.sleep(3)\nprint('second')"
    )
    messages = execute(client, cell)
    first = next(t for t, m in messages if "first" in m["content"].get("text", ""))
    idle = messages[-1][0]
    assert idle - first > 2, "output should arrive while the child still runs"
    assert "step 1\rstep 2\n" in streamed(messages)
    assert "second" in streamed(messages)


def test_kernel_never_imports_tensorflow(kernel: tuple[KernelManager, Any]) -> None:
    _, client = kernel
    cell = (
        "%%fresh_model --isolate -q --outputs three\n"
        "import tensorflow as tf\nthree = int(tf.constant(3))"
    )
    imported = execute(client, cell, timeout_s=120)
    for noise in ("oneDNN", "cpu_feature_guard", "absl::InitializeLog"):  # TF's C++ log lines
        assert noise not in streamed(imported, "stderr")
    messages = execute(client, "import sys; print(three, 'tensorflow' in sys.modules)")
    assert streamed(messages).strip() == "3 False"


def test_child_dies_with_the_kernel(tmp_path: Path) -> None:
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path))
    client = km.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        pids = tmp_path / "pids"
        execute(client, "%load_ext kerasmagic\nimport os\nkernel_pid = os.getpid()")
        client.execute(  # not waited for: the kernel is killed while it runs
            "%%fresh_model --isolate --inputs kernel_pid\nimport os, time\n"
            f"open({str(pids)!r}, 'w').write(f'{{kernel_pid}} {{os.getpid()}}')\n"
            "time.sleep(60)"
        )
        deadline = time.monotonic() + 30
        while not pids.exists() or len(pids.read_text().split()) < 2:
            assert time.monotonic() < deadline, "the isolated child never started"
            time.sleep(0.1)
        kernel_pid, child_pid = map(int, pids.read_text().split())
        child = psutil.Process(child_pid)
        os.kill(kernel_pid, signal.SIGKILL)
        psutil.wait_procs([child], timeout=10)
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)
