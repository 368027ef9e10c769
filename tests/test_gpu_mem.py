"""``%gpu_mem``: the table, JSON, the deep scan of live models and who holds them, GPU flags."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest
from conftest import HAS_GPU, run
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from kerasmagic.snapshot import SCHEMA_VERSION

pytestmark = pytest.mark.skipif(HAS_GPU, reason="these check the CPU-only answers")


def tf_entry(data: dict[str, Any]) -> dict[str, Any]:
    """Return TensorFlow's entry of a ``%gpu_mem --json`` snapshot's backends."""
    (tf,) = [b for b in data["backends"] if b["name"] == "tensorflow"]
    return tf


def test_table_without_gpu(kip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    run(kip, "model = build()")
    capsys.readouterr()
    kip.run_line_magic("gpu_mem", "")
    out = capsys.readouterr().out
    assert f"kernel pid {os.getpid()}" in out
    assert "GPU" in out and "no NVIDIA GPU" in out
    assert "CPU:0 (CPU) tensors in use" in out
    assert "1 live model named in the notebook" in out


def test_cpu_allocator_is_read_to_the_byte(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CPU device's BFC allocator (oneDNN's default) is read exactly, and its peak reset."""
    import tensorflow as tf

    run(kip, "model = build()\nmodel.fit(x, y, verbose=0);")
    capsys.readouterr()
    kip.run_line_magic("gpu_mem", "--json")
    (cpu,) = tf_entry(json.loads(capsys.readouterr().out))["devices"]
    assert cpu["name"] == "CPU:0" and cpu["kind"] == "cpu"
    assert cpu["in_use_bytes"] == tf.config.experimental.get_memory_info("CPU:0")["current"]
    before = cpu["in_use_bytes"]
    run(kip, "big = tf.zeros((1000, 1000))")  # 4,000,000 bytes
    kip.run_line_magic("gpu_mem", "--json --reset-peak")
    out = capsys.readouterr().out
    assert "peak reset on CPU:0" in out
    (cpu,) = tf_entry(json.loads(out[out.index("{") :]))["devices"]
    # BFC counts the chunk it hands out: the request rounded up, and a free chunk it chose not
    # to split (up to twice the request), so the step is exact but not always 4,000,000.
    assert 4_000_000 <= cpu["in_use_bytes"] - before <= 8_000_000
    assert cpu["peak_bytes"] == cpu["in_use_bytes"]  # just reset


def test_cpu_without_allocator_statistics_says_so(tmp_path: pathlib.Path) -> None:
    """With oneDNN off TensorFlow keeps no CPU statistics: one line says why, nothing breaks."""
    code = (
        "import tensorflow as tf\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance(); ip.run_line_magic('load_ext', 'kerasmagic')\n"
        "tf.zeros((10, 10)); ip.run_line_magic('gpu_mem', '--reset-peak')\n"
    )
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "no allocator statistics on this TensorFlow's devices" in out.stdout
    assert "no allocator peak to reset" in out.stdout


def test_json_is_the_snapshot(kip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    run(kip, "model = build()\nmodel.fit(x, y, verbose=0);")
    capsys.readouterr()
    kip.run_line_magic("gpu_mem", "--json")
    data = json.loads(capsys.readouterr().out)
    assert data["version"] == SCHEMA_VERSION and data["pid"] == os.getpid()
    assert data["ram"]["rss_bytes"] > 100 * 2**20
    assert "tf" not in data and "graph" not in data, "TensorFlow's figures are sent once"
    tf = tf_entry(data)
    assert tf["platform"] == "cpu", "imported and started"
    assert [(d["name"], d["kind"]) for d in tf["devices"]] == [("CPU:0", "cpu")]
    assert tf["caches"]["custom_gradients"] >= 2 and tf["caches"]["functions"] > 0
    assert data["keras"]["live_models"] == 1 and data["keras"]["name_counter"] >= 3


def test_deep_scan_names_every_holder(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, "h = build().fit(x, y, verbose=0)")
    run(kip, "results = [build()]")
    run(kip, "build()")  # Out[n]
    n = kip.execution_count - 1
    capsys.readouterr()
    kip.run_line_magic("gpu_mem", "--deep --json")
    models = json.loads(capsys.readouterr().out)["models"]
    holders = sorted(", ".join(m["holders"]) for m in models)
    assert any("h.model" in h for h in holders)
    assert any("results[0]" in h for h in holders)
    assert any(f"Out[{n}]" in h for h in holders)
    assert all(m["type"] == "Sequential" for m in models) and len(models) == 3  # no inner model
    sizes = {m["size_bytes"] for m in models}
    weights = (20 * 8 + 8 + 8 * 2 + 2) * 4
    assert any(weights <= s < weights + 64 for s in sizes)  # unfitted: weights + optimizer scalars
    assert any(s >= 3 * weights for s in sizes)  # fitted with Adam: + two slots per weight


def test_live_models_from_python_names_the_shells_holders(kip: InteractiveShell) -> None:
    """``kerasmagic.live_models()`` in a notebook reads the notebook's names, like ``reset()``;
    it used to see none and call every holder "a dict outside the namespace"."""
    run(kip, "import kerasmagic\nmodel = build()\nmodels = kerasmagic.live_models()")
    assert [m.holders for m in kip.user_ns["models"]] == [("model",)]


def test_deep_scan_names_holders_deep_in_the_namespace(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, "log = {'exp': {'runs': [{'history': build().fit(x, y, verbose=0)}]}}")
    run(
        kip,
        "class Box:\n    pass\nbox = Box()\nbox.inner = {'m': [build()]}\npred = build().predict",
    )
    capsys.readouterr()
    kip.run_line_magic("gpu_mem", "--deep --json")
    models = json.loads(capsys.readouterr().out)["models"]
    holders = {h: m["freeable"] for m in models for h in m["holders"]}
    assert holders == {
        "log['exp']['runs'][0]['history'].model": True,  # Free memory cuts the link
        "box.inner['m'][0]": False,
        "pred.__self__": False,
    }


def _deep_scan_after_a_failure(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str], setup: str, failing: str
) -> str:
    run(kip, setup)
    kip.run_cell(failing, store_history=True)
    capsys.readouterr()
    kip.run_line_magic("gpu_mem", "--deep")
    return capsys.readouterr().out


def test_deep_scan_finds_a_traceback_holder(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = "def fail(m):\n    raise ValueError('boom')"
    out = _deep_scan_after_a_failure(kip, capsys, setup, "fail(build())")
    assert "held by sys.last_traceback (fail: m)" in out


def test_deep_scan_after_a_failed_fresh_model_cell_names_the_user_s_holders_only(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """The magic's runner frames pass the namespace on: they are not holders of what it holds."""
    failing = "%%fresh_model -q\nmodel = build()\n1/0"
    out = _deep_scan_after_a_failure(kip, capsys, "kept = build()", failing)
    assert "held by kept → del kept" in out
    assert "held by model → del model" in out
    assert "sys.last_traceback" not in out


def test_a_frame_ipython_hides_is_no_holder_but_the_cleanup_still_clears_it(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """``%%fresh_model --predict`` calls ``fit`` from a wrapper IPython hides: a failed fit's
    stored error named "sys.last_traceback (predicted: self)", a frame the user never saw."""
    setup = "def hidden(m):\n    __tracebackhide__ = True\n    raise ValueError('boom')"
    out = _deep_scan_after_a_failure(kip, capsys, setup, "hidden(build())")
    assert "held by sys.last_traceback" not in out and "(hidden: m)" not in out
    run(kip, "import weakref\nfrom kerasmagic.walk import live_model_objects, model_types")
    run(kip, "held = [weakref.ref(m) for m in live_model_objects(model_types())]")
    run(kip, "%%fresh_model -q\nmodel = build()")  # the stored error's frame is cleared
    assert len([r for r in kip.user_ns["held"] if r() is not None]) == 0


def test_html_in_a_notebook(kip: InteractiveShell) -> None:
    from kerasmagic.snapshot import take_snapshot
    from kerasmagic.views.render import Table, snapshot_rows

    html = Table("t", snapshot_rows(take_snapshot(kip.user_ns)))._repr_html_()
    assert html.startswith("<table") and "<th style='text-align:left'>RAM</th>" in html


def test_reset_peak_and_gpu_options_without_gpu(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    kip.run_line_magic("gpu_mem", "--reset-peak --growth")
    out = capsys.readouterr().out
    assert "peak reset on CPU:0" in out
    assert "no GPU visible to TensorFlow: nothing to configure" in out


@pytest.mark.parametrize("line", ["--limit 0", "--limit lots", "--bogus"])
def test_bad_options(ip: InteractiveShell, line: str) -> None:
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("gpu_mem", line)
    assert "\n" not in str(err.value).strip()


@pytest.mark.parametrize("line", ["--live --json", "--history --deep", "--plot --limit 100"])
def test_a_view_flag_with_another_is_refused(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str], line: str
) -> None:
    """A view (--live, --history, --plot) used to return early and drop the other flag."""
    with pytest.raises(UsageError, match="cannot be combined with --"):
        ip.run_line_magic("gpu_mem", line)
    assert capsys.readouterr().out == ""  # nothing shown, nothing configured


def test_help(ip: InteractiveShell) -> None:
    doc = ip.find_line_magic("gpu_mem").__doc__ or ""
    assert all(flag in doc for flag in ("--json", "--reset-peak", "--deep", "--growth", "--limit"))


def test_deep_scan_says_what_a_user_can_act_on(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, "model = build()\nh = model.fit(x, y, verbose=0)\nbig = np.zeros((1000, 1000))")
    run(kip, "results = [build()]")
    run(kip, "%%fresh_model -q\nmodel = build()\nh = model.fit(x, y, verbose=0)")
    capsys.readouterr()
    kip.run_line_magic("gpu_mem", "--deep --json")
    data = json.loads(capsys.readouterr().out)
    fitted = next(m for m in data["models"] if "model" in m["holders"])
    assert fitted["traced_ops"] > 100 and fitted["estimate_bytes"] > fitted["size_bytes"]
    assert not fitted["freeable"] and "del model" in " ".join(fitted["remedies"])
    listed = next(m for m in data["models"] if "results[0]" in m["holders"])
    assert "kept in results" in listed["remedies"][0] and not listed["freeable"]
    sizes = {v["name"]: v["size_bytes"] for v in data["variables"]}
    assert sizes["big"] == 8_000_000 and sizes["x"] == 256 * 20 * 4
    assert next(iter(sizes)) == "big"  # largest first
    kip.run_line_magic("gpu_mem", "--deep")
    text = capsys.readouterr().out
    assert "estimate" in text and "never freed" in text
    assert "last cleanup" in text and "dropping 1 model" in text and "measured" in text


def test_deep_scan_marks_what_free_memory_frees(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, "build()")
    capsys.readouterr()
    kip.run_line_magic("gpu_mem", "--deep --json")
    models = json.loads(capsys.readouterr().out)["models"]
    model = next(m for m in models if any(h.startswith("Out[") for h in m["holders"]))
    assert model["freeable"] and "output cache" in model["remedies"][0]


def test_every_view_counts_live_models_alike_and_names_its_subset(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """One definition of a live model: the deep scan counts every one (a closure's too), the
    per-cell figure those named in the notebook, and each label says which it counts; model
    state no model owns is listed, not counted as a model."""
    from kerasmagic.cleanup.holders import deep_scan

    run(kip, "model = build()\ndef make():\n    held = build()\n    return lambda: held")
    run(kip, "f = make()  # a model only a closure holds")
    run(kip, "layer = keras.layers.Dense(3)\nlayer.build((None, 2))")
    capsys.readouterr()
    kip.run_line_magic("gpu_mem", "--deep")
    text = capsys.readouterr().out
    assert "1 live model named in the notebook" in text
    assert "2 live Keras models (1 named in the notebook): what holds them" in text
    assert "a function closure" in text and "(Dense)  " in text and "held by layer" in text
    scan = deep_scan(kip.user_ns).to_dict()
    assert sorted(m["kind"] for m in scan["models"]) == ["layer", "model", "model"]
    assert scan["named_models"] == 1


def test_a_cpu_figure_that_misses_tensors_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN's CPU allocator leaves tensors under 256 KB uncounted: the figure says so and how
    to get the exact one, unless TF_CPU_ALLOCATOR_USE_BFC counts every tensor (or on a GPU)."""
    import dataclasses

    from kerasmagic.backends import BackendDevice
    from kerasmagic.backends import tensorflow as tf_backend
    from kerasmagic.backends.tensorflow.graphs import GraphInfo
    from kerasmagic.snapshot import take_snapshot
    from kerasmagic.views.render import snapshot_rows

    devices = (
        BackendDevice("CPU:0", 0, 800_000, kind="cpu"),
        BackendDevice("GPU:0", 0, 0, kind="gpu"),
    )
    graph = GraphInfo(default_graph_ops=0, custom_gradients=0, functions=0)
    for value, missed in (("", True), ("false", True), ("true", False), ("1", False)):
        monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", value)
        cpu, gpu = tf_backend.info(devices, graph).devices
        assert (cpu.uncounted is not None) is missed and gpu.uncounted is None
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "")
    info = tf_backend.info(devices[:1], graph)
    snap = dataclasses.replace(take_snapshot(), backends=(info,))
    (row,) = [text for label, text in snapshot_rows(snap) if label == "TF allocator"]
    assert row == (
        "CPU:0 (CPU) tensors in use 0 B, peak 781.2 KB (misses tensors under 256 KB; set "
        "TF_CPU_ALLOCATOR_USE_BFC=true before importing TensorFlow for the exact figure)"
    )


def test_a_ctrl_c_during_a_deep_scan_stops_it_at_the_magics_line(
    kip: InteractiveShell, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Ctrl-C stopping a slow ``--deep`` scan used to show the scan's frames (walk.py's
    ``gc.collect()``, JAX's gc callback); now the line, as an interrupted plain call shows."""
    from kerasmagic import magics

    def interrupted(*args: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(magics, "live_models", interrupted)
    result = kip.run_cell("%gpu_mem --deep")
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert "run_line_magic('gpu_mem', '--deep')" in shown and "interrupted" not in shown
    assert "kerasmagic/" not in shown and "test_gpu_mem" not in shown, shown
