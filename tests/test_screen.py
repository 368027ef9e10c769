"""What the screen says is true and agrees with itself: the report line, %gpu_mem, the record.

Each test here failed on main before issue 32's fixes: the figures a person reads (KB, not
"0.0 MB"; RAM freed with nothing dropped explained; the report's net equal to the cell's record,
which the badge shows), %gpu_mem --deep listing the models it counts in the same cell, a kept
model's operations left in its graph, and a reason for missing statistics that is this
kernel's own.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import run
from IPython.core.interactiveshell import InteractiveShell

from kerasmagic.cleanup import CleanupReport, last_report, report_text
from kerasmagic.live import get_monitor
from kerasmagic.units import signed_bytes
from kerasmagic.views.render import ReportLine, no_stats

KB = 1024
ROOT = Path(__file__).parent.parent


def report(**changes: object) -> CleanupReport:
    base = {
        "dropped": ("model",),
        "kept": (),
        "not_freed": (),
        "freed_bytes": 6 * KB * KB,
        "allocator_freed_bytes": 12 * KB,
        "allocator_backend": "tensorflow",
        "released": (),
        "elapsed_s": 0.2,
    }
    return CleanupReport(**{**base, **changes})  # type: ignore[arg-type]


def test_small_figures_read_in_their_own_unit() -> None:
    line = report().summary()
    assert "freed 6.0 MB of RAM and 12.0 KB of TensorFlow tensors" in line
    assert "0.0 MB" not in report(freed_bytes=30_000, allocator_freed_bytes=40_000).summary()


def test_ram_freed_with_nothing_dropped_is_explained() -> None:
    line = report(dropped=(), freed_bytes=30 * KB * KB, allocator_freed_bytes=None).summary()
    assert line.startswith("freed 30.0 MB of RAM (garbage earlier cells left) in 0.20 s")
    assert "dropped nothing" in line
    assert (
        report(dropped=(), freed_bytes=-KB, allocator_freed_bytes=0)
        .summary()
        .startswith("freed no memory")
    )


@dataclass
class FakeRecord:
    """What report_text reads of a cell's record: its start, its end and their difference."""

    start_rss: int
    end_rss: int
    tensors: dict[str, int]

    @property
    def start(self) -> Any:
        return SimpleNamespace(ram=SimpleNamespace(rss_bytes=self.start_rss))

    @property
    def end(self) -> Any:
        return SimpleNamespace(ram=SimpleNamespace(rss_bytes=self.end_rss))

    @property
    def delta(self) -> Any:
        return SimpleNamespace(device_bytes=self.tensors)


SPLIT = re.compile(r"(RSS|TF tensors) (\S+ \w+) \(cleanup (\S+ \w+), the cell (\S+ \w+)\)")


def megabytes(figure: str) -> float:
    number, unit = figure.split()
    return float(number) * {"B": 2**-20, "KB": 2**-10, "MB": 1, "GB": 2**10}[unit]


def test_the_line_adds_up_the_cleanup_and_the_cell_to_the_badges_figure() -> None:
    """Issue 39: "freed 396.0 KB of RAM ... the cell then took +16.0 KB of RAM, +400.0 KB for
    the whole cell" added up to nothing a reader could check. The line leads with the cell's
    change as its badge shows it (RSS, TF tensors), then the cleanup's part and the cell's own,
    which add up to it; what was dropped follows, its names without their descriptions."""
    mb = KB * KB
    dropped = ("h (a KerasTensor holding 2 layers, 4.4 MB)", "model", "history.model", "Out[3]")
    record = FakeRecord(100 * mb, 95 * mb, {"tensorflow": -20 * mb})
    freed = report(dropped=dropped, allocator_freed_bytes=80 * mb)
    line = report_text(freed, 0, 90 * mb, record, 0)  # the record's start and end win
    assert line == (
        "RSS -5.0 MB (cleanup -10.0 MB, the cell +5.0 MB); "
        "TF tensors -20.0 MB (cleanup -80.0 MB, the cell +60.0 MB); "
        "dropped h, model and 2 more"
    )
    for _, net, cleanup, cell in SPLIT.findall(line):
        assert megabytes(cleanup) + megabytes(cell) == megabytes(net)
    # each rounded alone, +99.9 MB was "cleanup +1.0 MB, the cell +98.8 MB": in one unit, the
    # cell's figure is what the two others leave, so they add up as printed
    rounded = report_text(report(dropped=()), 0, int(1.04 * mb), None, int(99.86 * mb))
    assert rounded == "RSS +99.9 MB (cleanup +1.0 MB, the cell +98.9 MB)", rounded
    gave = report_text(report(dropped=()), 100 * mb, 99 * mb, None, 99 * mb - 1004 * KB)
    assert gave == "RSS -2.0 MB (cleanup -1.0 MB, the cell -1004.0 KB)", gave
    nothing = FakeRecord(mb, mb, {"tensorflow": 0})
    quiet = report_text(report(dropped=(), allocator_freed_bytes=0), 0, mb, nothing, 0)
    assert quiet == "RSS 0 B (cleanup 0 B, the cell 0 B)", quiet  # as the badge writes 0


def test_what_was_not_freed_is_counted_on_the_line_and_its_holders_left_to_the_detail() -> None:
    """A cell that failed inside a trace left five variables of its model held through
    ``sys.last_value``: the line listed each with its holders, 800 characters. One survivor is
    said whole; several are counted and named, their holders in the detail."""
    held = "(held by a list outside the namespace, a dict outside the namespace)"
    five = tuple(f"sys.last_value (frame {i}: variable) {held}" for i in range(5))
    record = FakeRecord(KB, KB, {"tensorflow": 0})
    line = report_text(report(not_freed=five), 0, 0, record, 0)
    assert line.endswith("; dropped model; NOT freed: 5 objects, sys.last_value"), line
    assert held in report(not_freed=five).summary()
    two = ("ens[0] (held by a function closure)", "ens[1] (held by a function closure)")
    assert report_text(report(not_freed=two), 0, 0, record, 0).endswith(
        "NOT freed: 2 objects, ens[0], ens[1]"
    )
    one = report_text(report(not_freed=two[:1]), 0, 0, record, 0)
    assert one.endswith("NOT freed: ens[0] (held by a function closure)"), one


def test_the_line_stays_short_and_the_detail_is_one_flag_or_click_away(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line is what a person reads after every cell: short, whatever the cleanup did.
    What it did in full (what was freed of what, in how long, what was released and kept) is
    under the line: one click in a notebook (the line's ▸), ``-v`` in text."""
    many = tuple(f"layer_{i} (a Dense layer, 5.2 KB)" for i in range(12))
    released = ("released 10 training graphs (TF's gradient registry)",)
    full = report(dropped=many, released=released, kept=("base",), notes=("a note " * 12,))
    line = report_text(full, 0, 0, FakeRecord(KB, KB, {"tensorflow": 0}), 0)
    assert len(line) <= 140, line  # and 60 to 80 where no tensors moved
    view = ReportLine(f"kerasmagic: {line}", full.summary())
    assert repr(view) == f"kerasmagic: {line}"
    opened = ReportLine(view.line, view.detail, verbose=True)
    assert repr(opened).splitlines()[1:] == [f"  {row}" for row in full.summary().splitlines()]
    page = view._repr_html_()
    assert page.startswith("<details class='kerasmagic-line'") and " open" not in page
    assert f"title='what the cleanup did: click'>{html.escape(view.line)}</summary>" in page
    assert "released 10 training graphs (TF&#x27;s gradient registry)" in page
    assert opened._repr_html_().startswith("<details open ")

    run(kip, "base = build()")
    for flag, rows in (("", 1), ("-v", 4)):
        capsys.readouterr()
        run(kip, f"%%fresh_model {flag}\nmodel = build()")
        out = capsys.readouterr().out.strip().splitlines()
        assert len(out) == rows and out[0].startswith("kerasmagic: RSS "), out
    assert out[1:] == [f"  {row}" for row in last_report(kip).summary().splitlines()]  # type: ignore[union-attr]
    assert "  still alive: base" in out, out


def test_the_report_line_and_the_cells_record_say_the_same_net(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """The badge under a cell shows its record's RSS change; the report line leads with the
    same figure, to the byte as printed, and the cleanup's and the cell's parts add up to it
    (to the printed figures' rounding)."""
    monitor = get_monitor(kip)
    assert monitor is not None
    for _ in range(2):
        capsys.readouterr()
        run(kip, "%%fresh_model\nmodel = build()\nhistory = model.fit(x, y, verbose=0)")
        line = capsys.readouterr().out.strip().splitlines()[-1]
        record = monitor.history()[-1]
        net = signed_bytes(record.delta.rss_bytes)
        assert line.startswith(f"kerasmagic: RSS {net} (cleanup "), (line, net)
        splits = dict((what, rest) for what, *rest in SPLIT.findall(line))
        shown, cleanup, cell = (megabytes(f) for f in splits["RSS"])
        assert abs(cleanup + cell - shown) <= 0.1, line  # each figure rounded to 0.1 of its unit
        if len({f.split()[1] for f in splits["RSS"]}) == 1:  # in one unit: to the printed digit
            assert round(cleanup + cell - shown, 6) == 0, line


def test_gpu_mem_deep_lists_the_models_it_counts_in_the_same_cell(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fit in the cell freezes the collector's old objects (the loop guard); --deep listed no
    model while the line above it counted two."""
    run(kip, "%%fresh_model -q\nmodel = build()\nhistory = model.fit(x, y, verbose=0)")
    capsys.readouterr()
    run(kip, "base = build()\nbase.fit(x, y, verbose=0)\n%gpu_mem --deep")
    out = capsys.readouterr().out
    counted = re.search(r"(\d+) live models? named in the notebook", out)
    listed = re.search(r"(\d+) live Keras models? \((\d+) named in the notebook\)", out)
    assert counted is not None and listed is not None, out
    assert "no live Keras model" not in out, out
    assert "held by base" in out and "held by model" in out, out
    assert int(counted[1]) == int(listed[1]) == int(listed[2]) == 2, out


def test_a_kept_models_operations_stay_in_its_graph(kip: InteractiveShell) -> None:
    """keras.ops calls of a kept functional model are its own: wide & deep's baseline kept
    its 12 expand_dims nodes; the note named them "dropped layers"."""
    run(
        kip,
        "inp = keras.Input((20,))\n"
        "wide = keras.ops.expand_dims(inp, -1)\n"
        "out = keras.layers.Dense(2)(keras.layers.Flatten()(wide))\n"
        "baseline = keras.Model(inp, out)",
    )
    layer = kip.user_ns["baseline"].layers[0]
    before = [type(n.operation).__name__ for n in layer._outbound_nodes]
    assert before == ["ExpandDims"]
    run(kip, "%%fresh_model -q\ninp = None\nwide = None\nout = None\nm = build()")
    after = [type(n.operation).__name__ for n in layer._outbound_nodes]
    assert after == before
    notes = last_report(kip).notes  # type: ignore[union-attr]
    assert not any("dropped" in note for note in notes), notes


def test_a_head_no_kept_model_uses_is_unlinked_and_said_so(kip: InteractiveShell) -> None:
    run(kip, "inp = keras.Input((20,))\nbase = keras.Model(inp, keras.layers.Dense(8)(inp))")
    run(kip, "head = keras.layers.Dense(2)(base.output)")
    run(kip, "%%fresh_model -q\nhead = None")
    notes = last_report(kip).notes  # type: ignore[union-attr]
    assert "unlinked a layer no kept model uses from the graphs of kept models" in notes


def test_missing_statistics_are_explained_by_this_kernels_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    assert "TF_ENABLE_ONEDNN_OPTS=0 in this kernel turns its CPU statistics off" in no_stats()
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS")
    said = no_stats()
    assert "TF_ENABLE_ONEDNN_OPTS" not in said and "oneDNN on, by CPU" in said
    assert "TF_CPU_ALLOCATOR_USE_BFC=true, set before TensorFlow is imported" in said


HEADLINE = r"""
import json, os, sys
sys.path.insert(0, {tests!r})
from fake_nvml import FakeGpu, make_pynvml
GB = 2**30
gpu = FakeGpu("NVIDIA H200", "GPU-aaaa-0000", 141 * GB, 133 * GB, [(os.getpid(), 132 * GB)])
sys.modules["pynvml"] = make_pynvml([gpu])  # TensorFlow reserved the card: NVML never moves
import tensorflow as tf
from IPython.core.interactiveshell import InteractiveShell
from kerasmagic.snapshot import take_snapshot
from kerasmagic.views.render import snapshot_rows
from kerasmagic.views.widget import LiveWidget
from kerasmagic.live import get_monitor
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "kerasmagic")
keep, leads = [], []
for _ in range(3):
    keep.append(tf.zeros((5, 1000, 1000)))  # 20 MB more each time: what runs out grows
    lead = take_snapshot().headline
    leads.append([lead.what, lead.label, lead.used_bytes, lead.limit_bytes, lead.limit_label,
                  lead.reserved_bytes])
snap = take_snapshot()
widget = LiveWidget(get_monitor(ip))
widget.show_snapshot(snap)
print(json.dumps({{"leads": leads, "rows": snapshot_rows(snap), "bars": widget.part("bars"),
                  "wire": snap.to_dict()["headline"]}}))
"""


def test_beside_a_gpu_what_runs_out_leads_not_nvmls_flat_reservation(tmp_path: Any) -> None:
    """TensorFlow reserves nearly a whole GPU at start: NVML's figure for the kernel stays flat
    while its allocator grows to an out-of-memory. The headline is the allocator's use against
    its limit, NVML's reservation beside it, named; on the CPU here, TF's capped BFC allocator
    and a fake NVML whose reservation never moves stand in for both."""
    env = {
        **os.environ,
        "TF_CPU_ALLOCATOR_USE_BFC": "true",
        "TF_CPU_BFC_MEM_LIMIT_IN_MB": "160",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYTHONPATH": str(ROOT),
    }
    code = HEADLINE.format(tests=str(ROOT / "tests"))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout.strip().splitlines()[-1])
    leads = data["leads"]
    assert {tuple(lead[:2]) for lead in leads} == {("allocator", "TensorFlow's tensors on CPU:0")}
    used = [lead[2] for lead in leads]
    assert used[1] - used[0] >= 20_000_000 and used[2] - used[1] >= 20_000_000, used
    assert {lead[3] for lead in leads} == {160 * 2**20}  # its limit: the cap, not the GPU
    assert {lead[4] for lead in leads} == {"TF_CPU_BFC_MEM_LIMIT_IN_MB"}
    assert {lead[5] for lead in leads} == {132 * 2**30}  # NVML's, flat: beside it, not leading
    rows = dict(data["rows"])
    assert rows["Runs out"].startswith("TensorFlow's tensors on CPU:0: ")
    assert rows["Runs out"].endswith(
        "of 160.0 MB (TF_CPU_BFC_MEM_LIMIT_IN_MB); 132.0 GB reserved on the GPU (NVML)"
    )
    assert "data-km-live='lead'" in data["bars"] and "reserved on the GPU (NVML)" in data["bars"]
    assert data["wire"]["what"] == "allocator" and data["wire"]["label"] == leads[0][1]
