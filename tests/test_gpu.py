"""Real-GPU checks: run only where ``nvidia-smi -L`` lists a GPU (skipped in CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import kernel_run, kernel_value, real_kernel, run
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
    from kerasmagic.backends.tensorflow.runtime import read_tf

    run(kip, "big = build(4096)\nbig.fit(x, y, verbose=0)")
    in_use = read_tf()[0].in_use_bytes
    assert in_use > 4096 * 20 * 4
    run(kip, "%%fresh_model -q --all\nz = 1")
    assert read_tf()[0].in_use_bytes < in_use
    from kerasmagic.backends import reset_peaks

    assert reset_peaks() and read_tf()[0].peak_bytes <= in_use


def test_gpu_mem_shows_this_kernel(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, "t = tf.ones((256, 1024, 1024))")  # 1 GiB on the GPU
    capsys.readouterr()
    kip.run_line_magic("gpu_mem", "--json")
    data = json.loads(capsys.readouterr().out)
    assert data["gpu"]["status"] == "ok"
    (tf,) = [b for b in data["backends"] if b["name"] == "tensorflow"]
    assert tf["devices"][0]["in_use_bytes"] >= 2**30
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


# -- out of memory on a real GPU: explained, and the size that fitted fits again --------------
CAP_MB = 2048  # each backend capped at 2 GB, so an OOM is cheap on any GPU


def _total_mb() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(out.stdout.strip().splitlines()[0])


MODELS = """
import numpy as np, keras
x = np.random.default_rng(0).random((8192, 1024), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 10, 8192)
def build(width):
    m = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(width, activation="relu"),
                          keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)])
    m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m
"""
FITS = "%%fresh_model -q\nm = build(2048)\nm.fit(x, y, batch_size=512, epochs=1, verbose=0)"
TOO_BIG = {  # each runs out of the 2 GB: in fit (Adam's slots), in predict, while building
    "fit": "%%fresh_model -q\nm = build(16384)\nm.fit(x, y, batch_size=512, epochs=1, verbose=0)",
    "predict": "%%fresh_model -q\nm = build(8192)\n"
    "m.predict(np.zeros((65536, 1024), np.float32), batch_size=65536, verbose=0)",
    "build": "%%fresh_model -q\nm = build(32768)",
}
# backend: (set-up before Keras, the allocator's bytes in use, the device, the block's words)
GPU_BACKENDS = {
    "tensorflow": (
        f"%gpu_mem --limit {CAP_MB}\nimport tensorflow as tf",
        "tf.config.experimental.get_memory_info('GPU:0')['current']",
        "GPU:0 (TensorFlow)",
        "limit 2.0 GB (TensorFlow's memory_limit)",  # the cap, not the GPU's total
    ),
    "torch": (
        "import torch\ntorch.cuda.set_per_process_memory_fraction("
        f"{CAP_MB} * 2**20 / torch.cuda.get_device_properties(0).total_memory)",
        "torch.cuda.memory_allocated(0)",
        "cuda:0 (PyTorch)",
        "limit 2.0 GB",
    ),
    "jax": (
        "import jax",
        "jax.devices()[0].memory_stats()['bytes_in_use']",
        "gpu:0 (JAX)",
        "limit 2.0 GB",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(GPU_BACKENDS))
def test_a_real_oom_on_each_backend_is_explained_and_the_size_that_fitted_fits_again(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip(backend)
    setup, in_use, device, limit = GPU_BACKENDS[backend]
    if backend == "jax":  # XLA's cap is a fraction of the GPU, read as JAX starts
        monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{CAP_MB / _total_mb():.4f}")
    with real_kernel(str(tmp_path), backend=backend) as (_, client):
        content, text = kernel_run(client, setup + MODELS)
        assert content["status"] == "ok", text
        assert kernel_run(client, FITS, 300)[0]["status"] == "ok"
        fitted = kernel_value(client, in_use)
        for step, cell in TOO_BIG.items():
            content, text = kernel_run(client, cell, timeout_s=300)
            assert content["status"] == "error", f"{step}: {text}"
            assert f"kerasmagic: out of memory on {device}" in text, f"{step}: {text}"
            assert limit in text and "remedy" in text, f"{step}: {text}"
            content, text = kernel_run(client, FITS, timeout_s=300)
            assert content["status"] == "ok", f"after {step}: {text}"  # no restart needed
            back = kernel_value(client, in_use)
            assert abs(back - fitted) <= fitted / 10, f"after {step}: {back} vs {fitted}"


LIMIT_FROM_CAP = """
import json, kerasmagic.backends as c
said = c.configure_gpus(limit_mb=1536)
import tensorflow as tf
from kerasmagic.oom.batch import device_meter
from kerasmagic.backends.oom import device_limit
from kerasmagic.probes import read_gpus
limit = device_limit("tensorflow", "GPU:0", read_gpus().devices)
tf.ones((1024, 1024))  # starts the runtime: the cap stays the limit
meter = device_meter()
print(json.dumps([said, limit.bytes, limit.source, meter.limit_bytes, meter.limit_source]))
"""


def test_tensorflows_gpu_limit_is_its_memory_limit_not_the_gpus_total() -> None:
    out = subprocess.run(
        [sys.executable, "-c", LIMIT_FROM_CAP],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        check=True,
    )
    said, limit, source, meter, meter_source = json.loads(out.stdout.strip().splitlines()[-1])
    assert said.startswith("memory capped at 1536 MB")
    assert limit == meter == 1536 * 2**20
    assert source == meter_source == "TensorFlow's memory_limit"


@pytest.mark.slow
def test_a_fits_peak_is_predicted_within_a_tenth_on_a_gpu(tmp_path: Path) -> None:
    """Issue 38's table on GPU:0 (exact to the byte there): every kind, three batches."""
    bench = Path(__file__).parent.parent / "benchmarks" / "predict.py"
    env = {**os.environ, "KERASMAGIC_RESULTS": str(tmp_path)}
    batches = ["--batches", "128", "256", "512"]
    subprocess.run([sys.executable, str(bench), *batches], check=True, timeout=1800, env=env)
    table = json.loads((tmp_path / "predict.json").read_text())
    assert {row["device"] for row in table["rows"]} == {"GPU:0"}
    assert table["error"]["median_abs"] <= 0.10, table
    assert table["error"]["within_10_percent"] >= 0.8 * table["cases"], table
