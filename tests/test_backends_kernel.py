"""Each Keras backend in its own real kernel (the backend is fixed when Keras is imported)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from jupyter_client.manager import KernelManager

pytestmark = pytest.mark.slow

SETUP = """
%load_ext kerasmagic
import json, numpy as np, keras, kerasmagic
from kerasmagic.snapshot import take_snapshot
x = np.random.default_rng(0).random((256, 20), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 2, 256)
def build():
    inputs = keras.Input((20,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    model.compile(keras.optimizers.Adam(), keras.losses.SparseCategoricalCrossentropy(True))
    return model
"""
CELL = "%%fresh_model -q\nmodel = build()\nhistory = model.fit(x, y, epochs=1, verbose=0)"
FIGURES = (
    "b = take_snapshot().backend\n"
    "print(json.dumps([model.layers[1].name, None if b is None else dict(b.caches)]))"
)
RUNS = 4


class Kernel:
    """A real ipykernel started with ``KERAS_BACKEND`` set; ``run`` returns stdout, raises on
    an error reply."""

    def __init__(self, backend: str, cwd: str) -> None:
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=cwd, env=env)
        self.client = self.km.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str, timeout_s: float = 180) -> str:
        msg_id = self.client.execute(code)
        out: list[str] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg: dict[str, Any] = self.client.get_iopub_msg(timeout=timeout_s)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "error":
                raise AssertionError("\n".join(content["traceback"]))
            if kind == "stream":
                out.append(content["text"])
            elif kind in ("display_data", "execute_result"):
                out.append(content["data"].get("text/plain", ""))
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(out)
        raise TimeoutError(code)

    def close(self) -> None:
        self.client.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture
def kernel(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Kernel]:
    if request.param != "numpy":
        pytest.importorskip(request.param)
    k = Kernel(request.param, str(tmp_path))
    try:
        k.run(SETUP)
        yield k
    finally:
        k.close()


def rerun(kernel: Kernel) -> list[tuple[str, dict[str, int]]]:
    """Re-run the model cell under %%fresh_model; return layer name and caches after each."""
    figures = []
    for _ in range(RUNS):
        kernel.run(CELL)
        name, caches = json.loads(kernel.run(FIGURES).strip().splitlines()[-1])
        figures.append((name, caches))
    return figures


def assert_cannot_predict(kernel: Kernel, why: str) -> None:
    """Know before fit where the backend keeps no peak: one line saying so; the fit runs."""
    shown = kernel.run("p = kerasmagic.predict_fit(build(), x, y, batch_size=64)\nprint(p.fits)")
    said = " ".join(shown.split())
    assert said == f"kerasmagic: cannot predict on this backend here: {why} None"
    loop = "ran = 0\nfor fold in range(3):\n    h = build().fit(x, y, verbose=0)\n    ran += 1"
    shown = kernel.run(f"%%fresh_model --predict -q\n{loop}")
    assert shown.count("kerasmagic: cannot predict on this backend here") == 1, shown  # once
    assert kernel.run("print(ran, len(h.history['loss']))").strip() == "3 1"  # the fits ran


def assert_no_traceback(shown: str) -> None:
    assert "Traceback" not in shown and "Error" not in shown, shown


@pytest.mark.parametrize("kernel", ["jax"], indirect=True)
def test_jax_kernel_stays_flat_and_shows_jax(kernel: Kernel) -> None:
    figures = rerun(kernel)
    assert [name for name, _ in figures] == ["dense"] * RUNS
    caches = [c for _, c in figures]
    assert caches[0]["live_arrays"] > 0 and caches[0]["compiled"] > 0
    assert all(c == caches[1] for c in caches[1:]), caches  # live arrays, bytes, executables
    cleared = kernel.run("kerasmagic.reset(); print(take_snapshot().backend.caches['compiled'])")
    assert cleared.strip().splitlines()[-1] == "0"  # jax.clear_caches() ran
    shown = kernel.run("%gpu_mem")
    assert "JAX" in shown and " on CPU, Keras's backend" in shown and "live arrays" in shown
    assert "TensorFlow not imported" not in shown
    late = kernel.run("%gpu_mem --growth --reset-peak --json")
    assert "JAX runs on the CPU in this kernel: no GPU memory to configure" in late
    assert_no_traceback(late)
    data = json.loads(late[late.index("{") :])
    assert data["keras_backend"] == "jax" and data["backends"][0]["name"] == "jax"
    widget = kernel.run(
        "from kerasmagic.views.widget import LiveWidget\nfrom kerasmagic.live import get_monitor\n"
        "w = LiveWidget(get_monitor(get_ipython()))\nprint(w.backend, '|', w.part('figures'))"
    )
    assert (
        widget.startswith("jax |") and "live arrays" in widget and "custom gradients" not in widget
    )
    assert_cannot_predict(kernel, "JAX keeps no allocator figures on the CPU")


@pytest.mark.parametrize("kernel", ["torch"], indirect=True)
def test_torch_kernel_resets_names_and_shows_torch(kernel: Kernel) -> None:
    assert [name for name, _ in rerun(kernel)] == ["dense"] * RUNS
    shown = kernel.run("%gpu_mem --growth --reset-peak")
    assert "no CUDA GPU visible to PyTorch" in shown
    assert "PyTorch" in shown and " on CPU, Keras's backend" in shown
    assert "TensorFlow not imported" not in shown
    assert_no_traceback(shown)
    assert_cannot_predict(kernel, "PyTorch keeps no allocator figures on the CPU")


@pytest.mark.parametrize("kernel", ["numpy"], indirect=True)
def test_unsupported_backend_says_so_in_one_line(kernel: Kernel) -> None:
    for _ in range(2):
        kernel.run("%%fresh_model -q\nmodel = build()")
    assert kernel.run("print(model.layers[1].name)").strip() == "dense"
    shown = kernel.run("%gpu_mem --growth")
    lines = [line for line in shown.splitlines() if "'numpy' is not supported" in line]
    assert len(lines) == 2, shown  # the --growth answer and the table's Backend row
    assert_no_traceback(shown)
