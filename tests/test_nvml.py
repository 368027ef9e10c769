"""The NVML probe against an injected fake ``pynvml``: multi-GPU, visibility, PIDs, errors."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from fake_nvml import FakeGpu, NVMLError, NVMLError_LibraryNotFound, make_pynvml

from kerasmagic.probes import nvml
from kerasmagic.render import snapshot_rows
from kerasmagic.snapshot import take_snapshot

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
    assert "NVML Shared Library Not Found" in (info.message or "")
    calls = []
    monkeypatch.setattr(fake, "nvmlInit", lambda: calls.append(1))
    assert nvml.read_gpus() == info and calls == []  # not re-probed on every sample


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
