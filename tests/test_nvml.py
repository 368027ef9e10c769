"""The NVML probe against an injected fake ``pynvml``: multi-GPU, visibility, PIDs, errors,
re-initialisation, per-field degradation and the deadline that keeps a hung driver off cells."""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import time
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fake_nvml import (
    FakeGpu,
    NVMLError,
    NVMLError_LibraryNotFound,
    NVMLError_NotSupported,
    make_pynvml,
)
from IPython.core.interactiveshell import InteractiveShell

from kerasmagic.probes import nvml
from kerasmagic.snapshot import MemorySnapshot, take_snapshot
from kerasmagic.views.render import snapshot_rows

GB = 1024**3


@pytest.fixture(autouse=True)
def fresh_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml.shutdown()
    yield
    nvml.shutdown()


def two_gpus() -> list[FakeGpu]:
    me = os.getpid()
    return [
        FakeGpu("NVIDIA H200", "GPU-aaaa-0000", 141 * GB, 10 * GB, [(me, 3 * GB), (me, 1 * GB)]),
        FakeGpu("NVIDIA H200", "GPU-bbbb-1111", 141 * GB, 2 * GB, []),
    ]


def inject(monkeypatch: pytest.MonkeyPatch, module: object) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", module)


def test_two_gpus_with_this_process_share(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_pynvml(two_gpus())
    inject(monkeypatch, fake)
    info = nvml.read_gpus()
    assert info.status == "ok" and info.message is None
    assert [d.uuid for d in info.devices] == ["GPU-aaaa-0000", "GPU-bbbb-1111"]
    assert info.devices[0].name == "NVIDIA H200"  # bytes decoded
    assert info.devices[0].used_bytes == 10 * GB
    assert info.devices[0].process_used_bytes == 4 * GB  # two contexts of this PID summed
    assert info.devices[1].process_used_bytes == 0
    nvml.read_gpus()
    assert fake.state["init"] == 1  # initialised once, lazily


def test_cuda_visible_devices_order_and_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    inject(monkeypatch, make_pynvml(two_gpus()))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert [(d.cuda_index, d.nvml_index) for d in nvml.read_gpus().devices] == [(0, 1), (1, 0)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb")
    assert [d.uuid for d in nvml.read_gpus().devices] == ["GPU-bbbb-1111"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,7,1")  # CUDA stops at the invalid entry
    assert [d.nvml_index for d in nvml.read_gpus().devices] == [0]


def test_all_gpus_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    inject(monkeypatch, make_pynvml(two_gpus()))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    info = nvml.read_gpus()
    assert info.status == "hidden" and info.devices == ()
    assert "CUDA_VISIBLE_DEVICES" in (info.message or "")


def test_driver_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    inject(monkeypatch, make_pynvml([]))
    assert nvml.read_gpus().status == "no_gpu"


def test_pid_from_another_namespace_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    # In a container NVML lists host PIDs: none is ours and none exists here.
    gpu = FakeGpu("A100", "GPU-cccc", 80 * GB, 5 * GB, [(4_000_000, 5 * GB)])
    inject(monkeypatch, make_pynvml([gpu]))
    device = nvml.read_gpus().devices[0]
    assert device.process_used_bytes is None
    assert device.used_bytes == 5 * GB


def test_usage_not_reported_by_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu("T4", "GPU-dddd", 16 * GB, 1 * GB, [(os.getpid(), None)])
    inject(monkeypatch, make_pynvml([gpu]))
    assert nvml.read_gpus().devices[0].process_used_bytes is None


def test_no_driver_is_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_pynvml([], init_error=NVMLError_LibraryNotFound("NVML Shared Library Not Found"))
    inject(monkeypatch, fake)
    info = nvml.read_gpus()
    assert info.status == "no_driver"
    assert info.message == "no NVIDIA GPU"  # what a person needs, not NVML's words
    calls = []
    monkeypatch.setattr(fake, "nvmlInit", lambda: calls.append(1))
    assert nvml.read_gpus() == info and calls == []  # not re-probed on every sample


def test_a_driver_that_does_not_start_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_pynvml([], init_error=NVMLError("Driver Not Loaded"))
    inject(monkeypatch, fake)
    info = nvml.read_gpus()
    assert info.status == "no_driver"
    said = "no NVIDIA GPU in use: the NVIDIA driver did not start (Driver Not Loaded)"
    assert info.message == said


def test_nvml_error_while_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    inject(monkeypatch, make_pynvml(two_gpus(), memory_error=NVMLError("GPU is lost")))
    info = nvml.read_gpus()
    assert info.status == "error" and info.devices == ()
    assert info.message == "NVML error: GPU is lost"


def test_pynvml_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    info = nvml.read_gpus()
    assert info.status == "no_driver" and "not installed" in (info.message or "")


def test_shutdown_at_exit_and_reinit(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_pynvml(two_gpus())
    inject(monkeypatch, fake)
    nvml.read_gpus()
    nvml.shutdown()
    assert fake.state["shutdown"] == 1
    nvml.read_gpus()
    assert fake.state["init"] == 2


def test_rendered_rows_show_each_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    inject(monkeypatch, make_pynvml(two_gpus()))
    rows = dict(snapshot_rows(take_snapshot()))
    assert rows["GPU 0"] == "NVIDIA H200: 10.0 GB / 141.0 GB used, this kernel 4.0 GB"
    assert rows["GPU 1"].endswith("this kernel 0 B")


def test_snapshot_totals_prefer_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    inject(monkeypatch, make_pynvml(two_gpus()))
    assert take_snapshot().gpu_used_bytes == 4 * GB


def test_static_device_facts_are_read_once_per_session(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_pynvml(two_gpus())
    calls: list[object] = []
    get_name = fake.nvmlDeviceGetName
    monkeypatch.setattr(fake, "nvmlDeviceGetName", lambda h: calls.append(h) or get_name(h))
    inject(monkeypatch, fake)
    for _ in range(3):  # what the sampler does every 0.5 s
        assert [d.name for d in nvml.read_gpus().devices] == ["NVIDIA H200", "NVIDIA H200"]
    assert len(calls) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # a new visibility is resolved again
    assert [d.uuid for d in nvml.read_gpus().devices] == ["GPU-bbbb-1111"]
    assert len(calls) == 3


# -- recovery, degradation and deadlines ---------------------------------------------------
def test_reinit_after_a_users_own_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_pynvml(two_gpus())
    inject(monkeypatch, fake)
    assert nvml.read_gpus().status == "ok"
    fake.nvmlShutdown()  # what a user's cell does; NVML's count drops to zero
    info = nvml.read_gpus()
    assert info.status == "ok" and [d.used_bytes for d in info.devices] == [10 * GB, 2 * GB]
    assert fake.state["init"] == 2  # re-initialised once


def test_failed_reinit_is_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_pynvml(two_gpus())
    inject(monkeypatch, fake)
    nvml.read_gpus()
    fake.nvmlShutdown()
    fake.state["init_error"] = NVMLError("Driver Not Loaded")
    info = nvml.read_gpus()
    assert info.status == "error" and info.devices == ()
    assert info.message is not None and info.message.startswith("not available")
    assert "Driver Not Loaded" in info.message and "\n" not in info.message
    fake.state["init_error"] = None  # the driver is back: the next reading recovers
    assert nvml.read_gpus().status == "ok"


def test_per_process_query_not_supported_keeps_device_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = make_pynvml(two_gpus())
    fake.state["procs_error"] = NVMLError_NotSupported()  # WSL2, vGPU
    inject(monkeypatch, fake)
    info = nvml.read_gpus()
    assert info.status == "ok"
    assert [(d.used_bytes, d.total_bytes) for d in info.devices] == [
        (10 * GB, 141 * GB),
        (2 * GB, 141 * GB),
    ]
    assert all(d.process_used_bytes is None for d in info.devices)
    note = info.devices[0].process_note or ""
    assert note.startswith("not available") and "Not Supported" in note
    assert info.used_bytes == 12 * GB  # falls back to what the devices report
    rows = dict(snapshot_rows(take_snapshot()))
    assert rows["GPU 0"] == f"NVIDIA H200: 10.0 GB / 141.0 GB used, this kernel {note}"


def test_per_process_note_round_trips_through_json(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_pynvml(two_gpus())
    fake.state["procs_error"] = NVMLError_NotSupported()
    inject(monkeypatch, fake)
    snap = take_snapshot()
    assert snap.gpu.devices[0].process_note
    assert MemorySnapshot.from_dict(json.loads(snap.to_json())) == snap


def test_container_pids_say_why_the_share_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu("A100", "GPU-cccc", 80 * GB, 5 * GB, [(4_000_000, 5 * GB)])
    inject(monkeypatch, make_pynvml([gpu]))
    assert "another PID namespace" in (nvml.read_gpus().devices[0].process_note or "")


@pytest.fixture
def fake() -> Iterator[types.ModuleType]:
    """Two fake GPUs whose memory call can be made to hang; released after the test."""
    module = make_pynvml(two_gpus())
    yield module
    module.state["release"].set()


def test_hung_nvml_returns_the_last_reading_marked_stale(
    monkeypatch: pytest.MonkeyPatch, fake: types.ModuleType
) -> None:
    inject(monkeypatch, fake)
    good = nvml.read_gpus()
    fake.state["hang_s"] = 2.0
    calls = fake.state["memory_calls"]
    start = time.perf_counter()
    stale = [nvml.read_gpus() for _ in range(3)]
    assert time.perf_counter() - start < 1.5  # three reads, none waits for the 2 s call
    assert all(s.status == "stale" and s.devices == good.devices for s in stale)
    assert "did not answer within" in (stale[0].message or "")
    assert fake.state["memory_calls"] == calls + 1  # never a second call while one hangs
    fake.state["hang_s"] = 0.0
    fake.state["release"].set()
    nvml.wait_idle(5.0)
    assert nvml.read_gpus().status == "ok"


def test_hung_nvml_without_any_reading_is_not_available(
    monkeypatch: pytest.MonkeyPatch, fake: types.ModuleType
) -> None:
    fake.state["hang_s"] = 2.0
    inject(monkeypatch, fake)
    info = nvml.read_gpus()
    assert info.status == "error" and info.devices == ()
    assert (info.message or "").startswith("not available: NVML did not answer within")


def test_hung_nvml_never_stalls_a_cell(
    monkeypatch: pytest.MonkeyPatch,
    fake: types.ModuleType,
    ip: InteractiveShell,
    capsys: pytest.CaptureFixture[str],
) -> None:
    inject(monkeypatch, fake)
    nvml.shutdown()  # drop whatever the sampler read before the fake was in place
    ip.run_cell("warm = 1")
    fake.state["hang_s"] = 2.0
    for _ in range(3):
        start = time.perf_counter()
        ip.run_cell("x = 1")  # pre_run_cell and post_run_cell hooks read NVML
        assert time.perf_counter() - start < 1.0
    capsys.readouterr()
    ip.run_line_magic("gpu_mem", "")
    out = capsys.readouterr().out
    assert "NVIDIA H200" in out and "NVML did not answer within" in out


def test_deprecated_pynvml_package_warning_is_not_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The deprecated ``pynvml`` package installs a meta-path finder that warns on import.
    message = "The pynvml package is deprecated. Please install nvidia-ml-py instead."
    module = make_pynvml(two_gpus())

    class DeprecatedPynvml(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        calls = 0

        def find_spec(self, name: str, path: object, target: object = None) -> Any:
            if name != "pynvml":
                return None
            DeprecatedPynvml.calls += 1
            warnings.warn(message, FutureWarning, stacklevel=2)
            return importlib.util.spec_from_loader(name, self)

        def create_module(self, spec: Any) -> types.ModuleType:
            return module

        def exec_module(self, module: types.ModuleType) -> None:
            return None

    inject(monkeypatch, module)
    monkeypatch.delitem(sys.modules, "pynvml")  # restored (then removed) after the test
    monkeypatch.setattr(sys, "meta_path", [DeprecatedPynvml(), *sys.meta_path])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        filters = list(warnings.filters)
        assert nvml.read_gpus().status == "ok"
        assert warnings.filters == filters  # suppressed around the import only
        warnings.warn("a user's own warning still shows", UserWarning, stacklevel=1)
    assert DeprecatedPynvml.calls == 1
    assert [str(w.message) for w in seen] == ["a user's own warning still shows"]


def drop(name: str) -> Callable[[types.ModuleType], None]:
    return lambda module: delattr(module, name)


@pytest.mark.parametrize(
    ("status", "words", "spoil"),
    [
        (
            "no_driver",
            "libnvidia-ml.so.1",
            lambda m: setattr(
                m, "nvmlInit", _raise(OSError("libnvidia-ml.so.1: cannot open shared object file"))
            ),
        ),
        ("error", "nvidia-ml-py", drop("nvmlInit")),
        ("error", "nvidia-ml-py", drop("nvmlDeviceGetMemoryInfo")),
        (
            "error",
            "GPU is lost",
            lambda m: setattr(m, "nvmlDeviceGetMemoryInfo", _raise(NVMLError("GPU is lost"))),
        ),
        (
            "error",
            "RuntimeError: driver says\\nno",
            lambda m: setattr(m, "nvmlDeviceGetCount", _raise(RuntimeError("driver says\nno"))),
        ),
        ("error", "KeyError", lambda m: setattr(m, "nvmlDeviceGetCount", _raise(KeyError()))),
    ],
    ids=["no-libnvidia-ml", "no-nvmlInit", "no-memory-call", "gpu-lost", "two-lines", "no-text"],
)
def test_any_nvml_failure_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
    status: str,
    words: str,
    spoil: Callable[[types.ModuleType], None],
) -> None:
    module = make_pynvml(two_gpus())
    spoil(module)
    inject(monkeypatch, module)
    info = nvml.read_gpus()
    assert info.status == status and info.devices == ()
    message = info.message or ""
    assert words.replace("\\n", " ") in message and "\n" not in message


def test_binding_without_process_query_keeps_device_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = make_pynvml(two_gpus())
    del module.nvmlDeviceGetComputeRunningProcesses
    inject(monkeypatch, module)
    info = nvml.read_gpus()
    assert info.status == "ok" and info.devices[0].used_bytes == 10 * GB
    assert "nvmlDeviceGetComputeRunningProcesses" in (info.devices[0].process_note or "")


def _raise(exc: BaseException) -> Callable[..., Any]:
    def fail(*args: object) -> Any:
        raise exc

    return fail


def _nvml_threads() -> int:
    import threading

    return sum(t.name == "kerasmagic-nvml" for t in threading.enumerate())


def test_unload_ends_the_reading_thread_and_a_reading_starts_it_again(
    monkeypatch: pytest.MonkeyPatch, ip: InteractiveShell
) -> None:
    inject(monkeypatch, make_pynvml(two_gpus()))
    # Loading started the live sampler, which may have read the real pynvml (no driver here)
    # before the fake was put in: forget that reading.
    nvml.shutdown()
    assert nvml.read_gpus().status == "ok"
    assert _nvml_threads() == 1
    ip.run_line_magic("unload_ext", "kerasmagic")
    assert _nvml_threads() == 0
    ip.run_line_magic("load_ext", "kerasmagic")
    assert nvml.read_gpus().status == "ok"
    assert _nvml_threads() == 1
