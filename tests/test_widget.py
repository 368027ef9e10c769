"""The live widget's traits, the terminal line view, --history/--plot, and a real kernel."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest
from conftest import run
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from kerasmagic.live import LiveMonitor, get_monitor
from kerasmagic.units import fmt_bytes
from kerasmagic.views.widget import LiveWidget

MB = 2**20


@pytest.fixture
def monitor(ip: InteractiveShell) -> LiveMonitor:
    """The shell's monitor with its sampler stopped, so only the test drives samples."""
    found = get_monitor(ip)
    assert found is not None
    found.sampler.stop()
    return found


def test_traits_hold_the_values_shown(ip: InteractiveShell, monitor: LiveMonitor) -> None:
    run(ip, "a = 1")
    widget = LiveWidget(monitor)
    run(ip, "blob = b'x' * (40 * 2**20)")
    record = monitor.history()[-1]
    assert widget.last_cell == record.execution_count == 2
    assert widget.rss_bytes == record.end.ram.rss_bytes
    assert widget.last_delta_bytes == record.delta.rss_bytes > 35 * MB
    assert widget.cell_peak_rss_bytes == record.peak_rss_bytes
    assert widget.history_rss == [r.end.ram.rss_bytes for r in monitor.history()]
    assert fmt_bytes(widget.rss_bytes) in widget.part("bars")
    assert f"data-km-live='rss' data-bytes='{widget.rss_bytes}'" in widget.part("bars")
    assert f"cell [2] RSS +{fmt_bytes(record.delta.rss_bytes)}" in widget.part("figures")
    assert widget.part("spark").count(" ") > 0 and "<polyline" in widget.part("spark")
    assert widget.gpu_used_bytes is None and "VRAM" in widget.part("bars")
    assert not widget.growing and "stable" in widget.part("alert")
    widget.close()


def test_tensorflow_tensors_are_shown_beside_rss_without_a_gpu(
    ip: InteractiveShell, monitor: LiveMonitor
) -> None:
    import tensorflow as tf

    run(ip, "import tensorflow as tf\nt = tf.zeros((1000, 1000))")
    widget = LiveWidget(monitor)
    run(ip, "u = tf.zeros((500, 1000))")
    exact = tf.config.experimental.get_memory_info("CPU:0")["current"]
    assert widget.allocator_in_use_bytes == exact and exact >= 6_000_000
    assert f"data-km-live='allocator' data-bytes='{exact}'" in widget.part("bars")
    assert f"TensorFlow tensors in use: {fmt_bytes(exact)}" in widget.part("bars")
    widget.close()


def test_figures_not_read_are_left_out_not_shown_as_n_a(
    ip: InteractiveShell, monitor: LiveMonitor
) -> None:
    run(ip, "import keras\nm = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])")
    widget = LiveWidget(monitor)
    run(ip, "x = 1")
    shown = widget.part("figures")
    named = f"models: {widget.live_models} named in the notebook, name counter"
    assert "n/a" not in shown and named in shown
    gradients = widget.caches["custom_gradients"]
    assert widget.live_models >= 1 and f"{gradients} custom gradients" in shown
    # Before TensorFlow and Keras are imported there is nothing to count: said so, once each.
    widget.caches = {}
    widget.live_models = widget.name_counter = None
    shown = widget._figures_html()
    assert "graph: TensorFlow not imported" in shown and "Keras not imported" in shown
    assert "n/a" not in shown
    widget.close()


def test_samples_update_the_widget_between_cells(
    ip: InteractiveShell, monitor: LiveMonitor
) -> None:
    run(ip, "a = 1")
    widget = LiveWidget(monitor)
    seen = widget.samples_seen
    run(ip, "ballast = b'x' * (30 * 2**20)")
    monitor.sampler.sample_once()
    latest = monitor.latest()
    assert latest is not None
    assert widget.samples_seen == seen + 2  # the cell's end and the sample
    assert widget.rss_bytes == latest.ram.rss_bytes
    assert widget.running_peak_rss_bytes >= latest.ram.rss_bytes
    widget.close()


def test_warning_state_names_the_remedy(ip: InteractiveShell, monitor: LiveMonitor) -> None:
    widget = LiveWidget(monitor)
    run(ip, "keep = []")
    for _ in range(3):
        # 40 MB: above glibc's largest dynamic mmap threshold (32 MB), so each append really
        # grows RSS instead of reusing heap that earlier tests freed.
        run(ip, "keep.append(b'x' * (40 * 2**20))")
    assert widget.growing
    assert "%%fresh_model" in widget.warning and "--isolate" in widget.warning
    assert "&#9888;" in widget.part("alert")
    widget.close()
    run(ip, "keep.clear()")
    assert widget.last_cell == 4  # closed: no longer listening


def test_terminal_prints_one_line_per_cell(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(ip, "%gpu_mem --live")
    capsys.readouterr()
    run(ip, "c = b'x' * (20 * 2**20)")
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kerasmagic [2]")
    assert "RSS" in lines[0] and "peak" in lines[0]
    run(ip, "%gpu_mem --live")  # asking twice does not print twice
    capsys.readouterr()
    run(ip, "d = 1")
    assert len(capsys.readouterr().out.strip().splitlines()) == 1


def test_history_table_and_plot(ip: InteractiveShell) -> None:
    run(ip, "e = 1")
    run(ip, "f = 2")
    with capture_output() as captured:
        run(ip, "%gpu_mem --history --plot")
    table, image = captured.outputs[0], captured.outputs[1]
    assert "[1]" in table.data["text/plain"] and "[2]" in table.data["text/html"]
    assert image.data["image/png"]


def test_plot_without_matplotlib_says_how_to_get_it(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    run(ip, "%gpu_mem --plot")
    assert "pip install 'kerasmagic[plot]'" in capsys.readouterr().out


def _until_idle(kc: Any, msg_id: str, timeout_s: float = 60) -> list[dict[str, Any]]:
    """Return the iopub messages of one execution, in order, up to its idle status."""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=timeout_s)
        out.append(msg)
        if (
            msg["msg_type"] == "status"
            and msg["parent_header"].get("msg_id") == msg_id
            and msg["content"]["execution_state"] == "idle"
        ):
            return out
    raise TimeoutError("kernel did not finish the cell")


LONG_CELL = "import time\nb = b'x' * (150 * 2**20)\ntime.sleep(1.5)\ndel b\ntime.sleep(0.3)"


@pytest.mark.slow
def test_widget_updates_while_a_cell_runs_in_a_real_kernel() -> None:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        setup = "get_ipython().config.LiveMonitor.interval_s = 0.1\n%load_ext kerasmagic"
        _until_idle(kc, kc.execute(setup))
        opened = _until_idle(kc, kc.execute("%gpu_mem --live"))
        state = {
            m["content"]["comm_id"]: m["content"]["data"]["state"]
            for m in opened
            if m["msg_type"] == "comm_open"
        }
        widget_id = next(cid for cid, s in state.items() if "rss_bytes" in s)
        rss_before = state[widget_id]["rss_bytes"]
        messages = _until_idle(kc, kc.execute(LONG_CELL))
        updates = [
            m["content"]["data"]["state"]
            for m in messages
            if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == widget_id
        ]
        # The cell frees its 150 MB before it ends, so only samples taken while it ran show it.
        during = [i for i, s in enumerate(updates) if s.get("rss_bytes", 0) - rss_before > 120 * MB]
        ended = [i for i, s in enumerate(updates) if s.get("last_cell") == 3]
        assert during, updates
        assert ended and max(during) < ended[0]  # shown before the cell's end record arrived
        assert sum("rss_bytes" in s for s in updates[: ended[0]]) >= 3
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_colours_are_theme_variables(ip: InteractiveShell, monitor: LiveMonitor) -> None:
    import re

    widget = LiveWidget(monitor)
    run(ip, "keep = []")
    for _ in range(3):
        run(ip, "keep.append(b'x' * (40 * 2**20))")
    html = widget.value
    colours = re.findall(r"(?:color|background|stroke)\s*:\s*([^;'\"]+)", html)
    assert colours and all(c.strip().startswith("var(--jp-") for c in colours), colours
    assert "flex-wrap:wrap" in html  # wraps on narrow screens instead of clipping
    widget.close()
    run(ip, "keep.clear()")


def test_one_cell_is_one_comm_message(
    ip: InteractiveShell, monitor: LiveMonitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every message costs the kernel a JSON dump, a signature and a send: one per cell, of
    the traits that changed and the HTML, from the one widget (no child widgets)."""
    run(ip, "a = 0")
    widget = LiveWidget(monitor)  # shows that cell's figures
    sent: list[Any] = []
    # the comm class of this ipywidgets: comm's BaseComm (8.x) or ipykernel's Comm (7.x)
    comm_class = type(widget.comm)
    monkeypatch.setattr(comm_class, "send", lambda self, data=None, **_: sent.append(data))
    if getattr(widget.comm, "kernel", ...) is None:  # ipywidgets 7 sends only through a kernel
        from ipykernel.kernelbase import Kernel

        widget.comm.kernel = Kernel.__new__(Kernel)  # one to be there; send() is the seam
    run(ip, "a = 1")
    assert len(sent) == 1, sent
    state = sent[0]["state"]
    assert {"value", "last_cell"} <= set(state), state
    assert "host_total_bytes" not in state  # unchanged: not sent again
    widget.close()


def test_the_first_moments_read_as_measuring(ip: InteractiveShell, monitor: LiveMonitor) -> None:
    """Shown before any cell is recorded (during the cell that shows it): no "last cell 0 B",
    no "no cell yet", but the first cell being measured; after it, its figures."""
    from kerasmagic.snapshot import take_snapshot

    assert monitor.history() == []
    widget = LiveWidget(monitor)
    widget.show_snapshot(take_snapshot())  # a sample while the first cell runs
    bars, figures = widget.part("bars"), widget.part("figures")
    assert "measuring the first cell" in bars and "last cell 0 B" not in bars
    assert "last: measuring the first cell" in figures and "no cell yet" not in figures
    run(ip, "a = 1")
    assert "peak: last cell" in widget.part("bars")
    assert "1 cell so far" in widget.part("spark")
    widget.close()


def _heights(svg: str) -> list[float]:
    points = svg.split("points='")[1].split("'")[0].split()
    return [float(p.split(",")[1]) for p in points]


def test_the_sparkline_lies_flat_when_its_ends_read_alike() -> None:
    """A change the caption cannot show (800.6 MB both ends) is not drawn as a full rise; one
    value is a flat line; a real change still spans the height."""
    from kerasmagic.views.widget import HEIGHT, sparkline_svg

    base = int(800.6 * MB)
    alike = sparkline_svg([base, base + 20_000, base + 40_000], "RSS after each cell")
    assert "(last 3 cells): 800.6 MB<" in alike and ".." not in alike
    assert max(_heights(alike)) - min(_heights(alike)) < 1
    one = sparkline_svg([base], "RSS after each cell")
    assert "(1 cell so far): 800.6 MB" in one and len(set(_heights(one))) == 1
    assert len(_heights(one)) == 2
    rising = _heights(sparkline_svg([base, base + 40 * MB], "RSS"))
    assert rising[0] - rising[1] > HEIGHT - 5


def test_a_cpu_figure_that_misses_tensors_says_so(
    ip: InteractiveShell, monitor: LiveMonitor
) -> None:
    import dataclasses

    from kerasmagic.backends import BackendDevice, BackendInfo
    from kerasmagic.snapshot import take_snapshot

    device = BackendDevice("CPU:0", 0, 800_000, kind="cpu", uncounted="misses tensors under 256 KB")
    info = BackendInfo("tensorflow", "2.21.0", True, "cpu", (device,))
    widget = LiveWidget(monitor)
    widget.show_snapshot(dataclasses.replace(take_snapshot(), backends=(info,)))
    assert "TensorFlow tensors in use: 0 B (misses tensors under 256 KB)" in widget.part("bars")
    widget.close()
