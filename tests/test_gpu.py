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
import json, kerasmagic.backends as c
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
    from kerasmagic.backends import reset_peaks

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


# JAX and PyTorch each in a fresh process (a process has one Keras backend; JAX's allocator
# settings only count before it starts). Each prints one JSON line, or "skip: why".
TORCH_GPU = """
import json, os
os.environ["KERAS_BACKEND"] = "torch"
import torch
if not torch.cuda.is_available():
    raise SystemExit(print("skip: no CUDA build of PyTorch here"))
import kerasmagic
from kerasmagic.backends import get
t = torch.ones((64, 1024, 1024), device="cuda")  # 256 MiB
held = get("torch").read().devices[0]
del t
kerasmagic.reset()
after = get("torch").read().devices[0]
figures = [held.in_use_bytes, held.reserved_bytes, after.in_use_bytes, after.reserved_bytes]
print(json.dumps(figures))
"""

JAX_GPU = """
import json, os
os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
import jax, jax.numpy as jnp
if not [d for d in jax.devices() if d.platform == "gpu"]:
    raise SystemExit(print("skip: no CUDA build of JAX here"))
import kerasmagic
from kerasmagic.backends import get
a = jnp.ones((64, 1024, 1024), dtype=jnp.float32).block_until_ready()  # 256 MiB
held = get("jax").read().devices[0].in_use_bytes
del a
kerasmagic.reset()
print(json.dumps([held, get("jax").read().devices[0].in_use_bytes]))
"""


def _in_child(code: str) -> list[int]:
    """Run ``code`` in a fresh Python; return its JSON figures (skip the test if it says so)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode == 0 and last.startswith("skip:"):
        pytest.skip(last)
    assert done.returncode == 0, done.stderr[-2000:]
    figures: list[int] = json.loads(last)
    return figures


def test_torch_allocator_on_gpu_and_empty_cache() -> None:
    pytest.importorskip("torch")
    held, reserved, after, reserved_after = _in_child(TORCH_GPU)
    assert held >= 256 * 2**20 and reserved >= held
    assert after < 2**20, "the tensor's memory is still allocated after the cleanup"
    assert reserved_after < reserved, "empty_cache() did not hand the cached blocks back"


def test_jax_allocator_on_gpu_and_freeing() -> None:
    pytest.importorskip("jax")
    held, after = _in_child(JAX_GPU)
    assert held >= 256 * 2**20
    assert after < held - 200 * 2**20
