"""One schema for the sidebar protocol: the frontend's data types are generated from the Python
dataclasses, and what real objects put on the wire is exactly what the schema declares."""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Iterator

import pytest
from conftest import run
from fake_nvml import FakeGpu, make_pynvml
from IPython.core.interactiveshell import InteractiveShell

from kerasmagic.cleanup import last_report
from kerasmagic.cleanup.holders import live_models
from kerasmagic.live import get_monitor
from kerasmagic.oom.explain import report as explain_oom
from kerasmagic.probes import largest_variables, nvml
from kerasmagic.snapshot import take_snapshot

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "labextension"))
from wire import WIRE, fields, typescript  # noqa: E402  (labextension/wire.py, a build script)

WIRE_TS = ROOT / "labextension" / "src" / "wire.ts"


def test_the_committed_typescript_types_are_the_generated_ones() -> None:
    """The hand-written types had drifted (no 'stale' GPU status, no process_note, backends or
    keras_backend): run `python labextension/wire.py > labextension/src/wire.ts`."""
    assert WIRE_TS.read_text() == typescript()


def test_protocol_ts_declares_no_data_type_by_hand() -> None:
    protocol = (ROOT / "labextension" / "src" / "protocol.ts").read_text()
    for _, name in WIRE:
        assert f"interface {name} " not in protocol, name


def _declared(cls: type) -> tuple[set[str], set[str]]:
    """Return the fields always sent and the ones only newer kernels or the comm add."""
    names = list(fields(cls))
    return {n for n in names if not n.endswith("?")}, {n[:-1] for n in names if n.endswith("?")}


def _check(obj: object, data: dict[str, object]) -> None:
    required, optional = _declared(type(obj))
    assert required <= set(data), (type(obj).__name__, required - set(data))
    assert set(data) <= required | optional, (type(obj).__name__, set(data) - required)
    json.dumps(data)  # and it goes through JSON


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No GPU here: NVML's reading of one through the fake ``pynvml`` (tests/fake_nvml.py)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = make_pynvml([FakeGpu("NVIDIA H200", "GPU-aaaa", 141 * 2**30, 2**30, [])])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml.shutdown()
    yield
    nvml.shutdown()


def _tf_oom() -> BaseException:
    import tensorflow as tf

    message = (
        "OOM when allocating tensor with shape[35,1000,1000] and type float on "
        "/job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu"
    )
    return tf.errors.ResourceExhaustedError(None, None, message)


def test_what_real_objects_send_is_what_the_schema_declares(
    kip: InteractiveShell, one_gpu: None
) -> None:
    run(kip, "model = build()\nmodel.fit(x, y, epochs=1, verbose=0)\nbuild()")
    run(kip, "%%fresh_model -q\nmodel = build()")
    monitor = get_monitor(kip)
    assert monitor is not None
    record = monitor.history()[-1]
    report, verdict = last_report(kip), monitor.verdict()
    assert report is not None
    snap = record.end
    backend = snap.backend
    assert backend is not None and backend.name == "tensorflow" and backend.devices
    found = [
        (record, record.to_dict()),
        (snap, snap.to_dict()),
        (record.delta, record.delta.to_dict()),
        (snap.ram, snap.to_dict()["ram"]),
        (snap.gpu, snap.to_dict()["gpu"]),
        (backend, snap.to_dict()["backends"][0]),
        (backend.devices[0], snap.to_dict()["backends"][0]["devices"][0]),
        (snap.keras, snap.to_dict()["keras"]),
        (verdict, verdict.to_dict()),
        (report, report.to_dict()),
    ]
    models, variables = live_models(kip.user_ns), largest_variables(kip.user_ns)
    found += [(models[0], vars(models[0])), (variables[0], vars(variables[0]))]
    oom = explain_oom(kip, _tf_oom())  # TF's own error, as its allocator words it
    assert oom is not None
    found.append((oom.facts, oom.facts.to_dict()))
    gpu = take_snapshot()
    found.append((gpu.gpu.devices[0], gpu.to_dict()["gpu"]["devices"][0]))
    found.append((gpu.headline, gpu.to_dict()["headline"]))
    for obj, data in found:
        _check(obj, data)
    assert {type(obj) for obj, _ in found} == {cls for cls, _ in WIRE}  # every type checked
