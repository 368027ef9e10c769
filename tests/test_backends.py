"""Backends: snapshot fields, rendering, configuration routing, fakes only at the GPU seam."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import json
import os
import subprocess
import sys
import types
from typing import Any

import pytest

from kerasmagic.backends import BackendDevice, BackendInfo
from kerasmagic.backends import jax as jax_backend
from kerasmagic.backends import torch as torch_backend
from kerasmagic.compat import registry
from kerasmagic.probes import GpuInfo, KerasInfo, RamInfo
from kerasmagic.snapshot import MemorySnapshot, diff
from kerasmagic.views.render import snapshot_rows

GB = 2**30


def snap(*backends: BackendInfo, keras_backend: str | None = "jax") -> MemorySnapshot:
    return MemorySnapshot(
        time_s=1.0,
        pid=1,
        ram=RamInfo(GB, None, 8 * GB, 4 * GB),
        gpu=GpuInfo("no_driver", "no NVIDIA driver", ()),
        keras=KerasInfo(True, 3, 1),
        keras_backend=keras_backend,
        backends=backends,
    )


JAX_GPU = BackendInfo(
    "jax",
    "0.10.2",
    True,
    "gpu",
    (BackendDevice("gpu:0", GB, 2 * GB, 100 * GB),),
    {"live_arrays": 16, "live_array_bytes": 2248, "compiled": 13},
    (jax_backend.PREALLOCATED,),
)


def text(s: MemorySnapshot) -> str:
    return "\n".join(f"{label}: {value}" for label, value in snapshot_rows(s))


def test_snapshot_with_backends_round_trips_and_old_dicts_load() -> None:
    new = snap(JAX_GPU)
    assert MemorySnapshot.from_dict(json.loads(new.to_json())) == new
    old = new.to_dict()
    del old["backends"], old["keras_backend"]
    assert MemorySnapshot.from_dict(old) == dataclasses.replace(
        new, backends=(), keras_backend=None
    )


def test_delta_covers_the_keras_backends_figures() -> None:
    grown = dataclasses.replace(
        JAX_GPU,
        devices=(BackendDevice("gpu:0", 3 * GB),),
        caches={"live_arrays": 20, "live_array_bytes": 2248, "compiled": 13},
    )
    delta = diff(snap(JAX_GPU), snap(grown))
    assert delta.backend_bytes == 2 * GB
    assert delta.backend_caches == {"live_arrays": 4, "live_array_bytes": 0, "compiled": 0}
    assert diff(snap(), snap(grown)).backend_caches == {}


def test_jax_on_a_preallocated_gpu_is_shown_and_explained() -> None:
    shown = text(snap(JAX_GPU))
    assert "jax 0.10.2 on GPU, Keras's backend" in shown
    assert "JAX gpu:0: in use 1.0 GB, peak 2.0 GB, limit 100.0 GB" in shown
    assert "16 live arrays (2.2 KB), 13 compiled executables" in shown
    assert "NVML's figure is the pool, not the model" in shown
    assert "TensorFlow" not in shown


def test_unsupported_backend_is_one_line() -> None:
    shown = text(snap(keras_backend="numpy"))
    assert "Backend: the Keras backend 'numpy' is not supported by kerasmagic" in shown
    assert "TensorFlow not imported" not in shown and "TF allocator" not in shown


def test_nothing_imported_keeps_the_tensorflow_rows() -> None:
    assert "TF allocator: TensorFlow not imported" in text(snap(keras_backend=None))


def test_preallocation_follows_xlas_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(jax_backend.PREALLOCATE, raising=False)
    monkeypatch.delenv(jax_backend.ALLOCATOR, raising=False)
    assert jax_backend.preallocating()
    monkeypatch.setenv(jax_backend.PREALLOCATE, "false")
    assert not jax_backend.preallocating()
    monkeypatch.setenv(jax_backend.PREALLOCATE, "true")
    monkeypatch.setenv(jax_backend.ALLOCATOR, "platform")
    assert not jax_backend.preallocating()


class FakeCuda:
    """``torch.cuda`` on one 80 GB GPU: the seam PyTorch's allocator figures come through."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def memory_allocated(self, i: int) -> int:
        return GB

    def memory_reserved(self, i: int) -> int:
        return 3 * GB

    def max_memory_allocated(self, i: int) -> int:
        return 2 * GB

    def get_device_properties(self, i: int) -> Any:
        return types.SimpleNamespace(total_memory=80 * GB)

    def __getattr__(self, name: str) -> Any:  # empty_cache, ipc_collect, reset_peak_..., ...
        return lambda *args: self.calls.append(f"{name}{args}")


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    if "torch" in sys.modules:
        pytest.skip("the real PyTorch is imported in this process")
    fake = FakeCuda()
    module = types.ModuleType("torch")
    module.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    module.__version__ = "2.13.0"  # type: ignore[attr-defined]
    module.cuda = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", module)
    return fake


def test_torch_reads_resets_and_caps_the_cuda_allocator(cuda: FakeCuda) -> None:
    info = torch_backend.read()
    assert info.platform == "gpu"
    assert info.devices == (BackendDevice("cuda:0", GB, 2 * GB, 80 * GB, 3 * GB, kind="gpu"),)
    assert "reserved 3.0 GB" in text(snap(info, keras_backend="torch"))
    assert torch_backend.reset() == []  # before the cleanup's collection: nothing to hand back
    assert torch_backend.release() == ["torch.cuda.empty_cache"]  # after it
    assert torch_backend.reset_peaks() == ["cuda:0"]
    assert "memory capped at 8192 MB for 1 GPU(s)" in torch_backend.configure(False, 8192)
    assert cuda.calls == [
        "get_per_process_memory_fraction(0,)",  # read(): a fraction the user set is the limit
        "empty_cache()",
        "ipc_collect()",
        "reset_peak_memory_stats(0,)",
        "set_per_process_memory_fraction(0.1, 0)",
    ]


def python(code: str, **env: str) -> Any:
    """Run ``code`` in a fresh interpreter; return the JSON it printed last."""
    full = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env}
    done = subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


JAX_CONFIG = """
import json, os, sys
from kerasmagic.backends import configure_gpus
first = configure_gpus(growth=True)
imported = "jax" in sys.modules
preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")
import jax.numpy as jnp
jnp.ones(1).block_until_ready()
print(json.dumps([first, imported, preallocate, configure_gpus(growth=True),
                  configure_gpus(limit_mb=100)]))
"""


@pytest.mark.slow
def test_jax_settings_before_and_after_jax_starts() -> None:
    pytest.importorskip("jax")
    first, imported, preallocate, late, cap = python(JAX_CONFIG, KERAS_BACKEND="jax")
    assert first.startswith("XLA_PYTHON_CLIENT_PREALLOCATE=false set for JAX")
    assert not imported and preallocate == "false"
    assert late == "JAX runs on the CPU in this kernel: no GPU memory to configure"
    assert cap.startswith("no GPU to cap for JAX")


LEGACY = """
import json, tensorflow as tf
from kerasmagic.probes import name_counter
from kerasmagic.cleanup import reset_backend
layers = [tf.keras.layers.Dense(2) for _ in range(3)]
grown = name_counter()
reset_backend()
name = tf.keras.layers.Dense(2).name
print(json.dumps([type(layers[0]).__module__, grown, name_counter(), name]))
"""


@pytest.mark.slow
def test_legacy_tf_keras_name_counter_is_read_and_reset() -> None:
    pytest.importorskip("tf_keras")
    module, grown, after, name = python(LEGACY, TF_USE_LEGACY_KERAS="1")
    assert module.startswith("tf_keras.")
    assert grown >= 3 and after < 3 and name == "dense"  # clear_session names one of its own


def test_a_backend_whose_read_fails_is_said_once_not_read_as_not_available(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``attempt`` swallowed every exception around a whole read: a kerasmagic bug looked like
    a backend with no figures. Now the site says so, once."""
    import kerasmagic.backends as backends

    def broken_read() -> BackendInfo:
        raise KeyError("a bug in kerasmagic's reader")

    monkeypatch.setattr(torch_backend, "in_use", lambda: True)
    monkeypatch.setattr(torch_backend, "read", broken_read)
    monkeypatch.setattr(registry, "_said", set())  # as in a new process: nothing said yet
    with caplog.at_level("WARNING"):
        first, second = backends.read_active(), backends.read_active()
    assert all(info.name != "torch" for info in (*first, *second))
    said = [r for r in caplog.records if "torch.read failed" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is not None  # once, with the traceback
