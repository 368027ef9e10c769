"""Real-GPU checks: run only where ``nvidia-smi -L`` lists a GPU (skipped in CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import run
from IPython.core.interactiveshell import InteractiveShell

from kerasmagic.probes import nvml

pytestmark = pytest.mark.gpu


def test_nvml_reads_every_visible_gpu() -> None:
    nvml.shutdown()
    info = nvml.read_gpus(timeout_s=30)  # nvmlInit alone may take longer than the deadline
    assert info.status == "ok", info.message
    for device in info.devices:
        assert device.total_bytes > 2**30 and 0 <= device.used_bytes <= device.total_bytes
        assert device.uuid.startswith(("GPU-", "MIG-"))
        if device.process_used_bytes is None:  # containers list host PIDs: say so
            assert device.process_note and "\n" not in device.process_note
    readings = [nvml.read_gpus() for _ in range(20)]  # the deadline a cell's hooks use
    assert [r.status for r in readings] == ["ok"] * 20, readings[-1].message


def test_nvml_restarts_after_a_users_own_shutdown() -> None:
    import pynvml

    nvml.shutdown()
    assert nvml.read_gpus(timeout_s=30).status == "ok"
    while True:  # what a user's cell does, until NVML is really down
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError_Uninitialized:
            break
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    info = nvml.read_gpus(timeout_s=30)
    assert info.status == "ok", info.message
    assert info.devices and info.devices[0].total_bytes > 2**30
    assert int(pynvml.nvmlDeviceGetCount()) >= 1  # NVML is up again for the user, too


GROWTH = """
import json, kerasmagic.backends.tensorflow.config as c
first = c.configure_gpus(growth=True)
import tensorflow as tf
tf.ones((1024, 1024))  # starts the runtime
print(json.dumps([first, c.configure_gpus(growth=True)]))
"""


def test_growth_before_and_after_the_runtime_starts() -> None:
    out = subprocess.run(
        [sys.executable, "-c", GROWTH],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        check=True,
    )
    first, second = json.loads(out.stdout.strip().splitlines()[-1])
    assert first.startswith("memory growth on")
    assert second.startswith("too late")


def test_allocator_figures_and_freeing_on_gpu(kip: InteractiveShell) -> None:
    from kerasmagic.backends.tensorflow.alloc import read_tf

    run(kip, "big = build(4096)\nbig.fit(x, y, verbose=0)")
    in_use = read_tf().devices[0].current_bytes
    assert in_use > 4096 * 20 * 4
    run(kip, "%%fresh_model -q --all\nz = 1")
    assert read_tf().devices[0].current_bytes < in_use
    from kerasmagic.backends.tensorflow.alloc import reset_peaks

    assert reset_peaks() and read_tf().devices[0].peak_bytes <= in_use


def test_gpu_mem_shows_this_kernel(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, "t = tf.ones((256, 1024, 1024))")  # 1 GiB on the GPU
    capsys.readouterr()
    kip.run_line_magic("gpu_mem", "--json")
    data = json.loads(capsys.readouterr().out)
    assert data["gpu"]["status"] == "ok"
    assert data["tf"]["devices"][0]["current_bytes"] >= 2**30
    mine = data["gpu"]["devices"][0]["process_used_bytes"]
    assert mine is None or mine >= 2**30  # None: NVML lists host PIDs (containers)
