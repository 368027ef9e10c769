"""The sidebar and the live widget from a kernel's first moments to a reload, in JupyterLab.

During the first cell after ``%gpu_mem --live`` nothing reads as a measured "0 B" or a chart of
"0 cells"; the chart's change labels lie over no bar and its x-axis labels do not touch; the
tile and Scan count live models by one definition, each label saying which it counts; a CPU
allocator figure that misses small tensors says so; and ``%unload_ext`` then ``%load_ext`` in
the same kernel keeps the chart's cells.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Server, run_cell, show_sidebar, wait_for_kernel, wait_until, write_notebook

pytestmark = pytest.mark.slow

CELLS = [
    "%load_ext kerasmagic",
    "%gpu_mem --live\nimport time\ntime.sleep(5)",
    "import numpy as np\na = np.ones(30 * 2**20 // 8)  # 30 MB",
    "b = np.ones(12 * 2**20 // 8)  # 12 MB more: a taller bar beside a's",
    "c = 1",
    # oneDNN on (its CPU allocator keeps statistics but misses small tensors), whatever the CPU.
    "import os\nos.environ['TF_ENABLE_ONEDNN_OPTS'] = '1'\nimport keras\n"
    "def small():\n    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])\n"
    "model = small()\ndef make():\n    held = small()\n    return lambda: held\n"
    "f = make()  # a model only a closure holds\nmodel(np.ones((1, 4)));",
    "%unload_ext kerasmagic",
    "%load_ext kerasmagic",
]
PANEL = ".jp-kerasmagic-panel"
HISTORY = f'{PANEL} [data-km="history"]'
STATUS_JS = f"document.querySelector('{PANEL}')?.dataset.status"
TITLE_JS = f"document.querySelector('{HISTORY} .jp-kerasmagic-section-title')?.textContent"
CELLS_JS = f"document.querySelector('{HISTORY}')?.dataset.cells"
# Each change label's box against every bar's, and the x-axis labels against each other, in
# the chart's own units (read at once: the chart is redrawn at every sample).
OVERLAPS_JS = f"""() => {{
  const svg = document.querySelector('{HISTORY} svg');
  const hit = (a, b) => a.x < b.x + b.width - 0.5 && b.x < a.x + a.width - 0.5 &&
    a.y < b.y + b.height - 0.5 && b.y < a.y + a.height - 0.5;
  const boxes = sel => [...svg.querySelectorAll(sel)].map(e => e.getBBox());
  const labels = boxes('text.jp-kerasmagic-delta');
  const bars = boxes('rect');
  const xs = boxes('text.jp-kerasmagic-x');
  return {{
    labels: labels.length,
    overBars: labels.filter(l => bars.some(r => hit(l, r))).length,
    xLabels: xs.length,
    touching: xs.filter((a, i) => xs.some((b, j) => i !== j && hit(a, b))).length,
    xTexts: [...svg.querySelectorAll('text.jp-kerasmagic-x')].map(e => e.textContent)
  }};
}}"""


def _text(page: Any, selector: str) -> str:
    return str(page.locator(selector).first.inner_text())


def test_first_moments_chart_counts_and_a_reload(lab: Server, page: Any) -> None:
    write_notebook(lab.root, "moments.ipynb", CELLS)
    page.goto(f"{lab.url}/lab/workspaces/moments/tree/moments.ipynb")
    wait_for_kernel(page)
    show_sidebar(page)
    run_cell(page, 0)
    wait_until(page, f"{STATUS_JS} === 'live'")

    # The first cell, still running: measured as it goes, no count of cells, no "0 B" peak.
    running = run_cell(page, 1, wait=False)
    wait_until(page, f"!!document.querySelector('{HISTORY} polyline')", timeout_s=20)
    wait_until(page, f"{TITLE_JS} === 'RSS of the running cell'", timeout_s=5)  # not "0 cells"
    widget = running.locator(".kerasmagic-live")
    widget.wait_for(timeout=20000)
    shown = widget.inner_text()
    assert "measuring the first cell" in shown, shown
    assert "no cell yet" not in shown and "last cell 0 B" not in shown, shown
    wait_until(page, f"{CELLS_JS} === '1'", timeout_s=30)
    assert page.evaluate(TITLE_JS) == "RSS over the last cell"
    assert "(1 cell so far)" in widget.inner_text()

    # Two cells: the x-axis labels do not touch ("[2][3]").
    run_cell(page, 2)
    wait_until(page, f"{CELLS_JS} === '2'")
    wait_until(page, "document.querySelectorAll('.jp-kerasmagic-x').length > 0")
    found = page.evaluate(OVERLAPS_JS)
    assert found["touching"] == 0, found
    assert page.evaluate(TITLE_JS) == "RSS over the last 2 cells"

    # +30 MB beside a taller +12 MB bar: its label sits above both, over no bar.
    run_cell(page, 3)
    run_cell(page, 4)
    wait_until(page, f"{CELLS_JS} === '4'")
    found = page.evaluate(OVERLAPS_JS)
    assert found["labels"] >= 1 and found["overBars"] == 0, found
    assert found["touching"] == 0, found

    # One definition of a live model: the tile counts those named in the notebook, and says
    # so (in the singular for 1); Scan counts every one, the closure's too.
    run_cell(page, 5, timeout_s=120)
    wait_until(page, f"{CELLS_JS} === '5'")
    tile = f'{PANEL} [data-km="live-models"]'
    wait_until(page, f"document.querySelector('{tile}')?.dataset.value === '1'")
    assert _text(page, f"{tile} .jp-kerasmagic-fact-label") == "Keras model named in the notebook"
    page.click(f'{PANEL} [data-km="scan"]')
    status = f'{PANEL} [data-km="scan-status"]'
    wait_until(page, f"document.querySelector('{status}')?.dataset.phase === 'done'", timeout_s=60)
    assert _text(page, status).startswith("2 live models (1 named in the notebook);")
    # The CPU allocator's figure misses tensors under 256 KB: said beside it, with the remedy.
    tf_line = _text(page, f'{PANEL} [data-km="tf"]')
    assert "CPU:0: " in tf_line and "(misses tensors under 256 KB; set " in tf_line, tf_line
    assert "TF_CPU_ALLOCATOR_USE_BFC=true before importing TensorFlow" in tf_line, tf_line

    # Unloaded and loaded again in the same kernel: the chart keeps its cells.
    run_cell(page, 6)
    wait_until(page, f"{STATUS_JS} === 'not-loaded'")
    run_cell(page, 7)
    wait_until(page, f"{STATUS_JS} === 'live'")
    wait_until(page, f"{CELLS_JS} === '5'", timeout_s=10)
    assert "No cells recorded yet" not in _text(page, HISTORY)
