"""``%gpu_mem --live`` where Colab's users see it: classic Notebook 6.5.7 with ipywidgets 7.7.1.

Colab's frontend is Colab's own and loads no JupyterLab extension; the closest one that runs
here is classic Notebook with Colab's widget versions. The server and kernel run in the Colab
environment (``KERASMAGIC_COLAB_PYTHON``, see tests/test_colab.py); Chromium shows the page.
The widget must render, move after each cell and while a cell runs, and log no console error.
``KERASMAGIC_SCREENSHOT_DIR=docs`` keeps ``docs/live_widget_classic.png``.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kerasmagic.units import fmt_bytes

from .conftest import MB, Server, missing, require, serve, wait_until, write_notebook

pytestmark = pytest.mark.slow
CELLS = [
    "import os\nos.environ['TF_CPU_ALLOCATOR_USE_BFC'] = 'true'\n%load_ext kerasmagic",
    "%gpu_mem --live",
    "import numpy as np\na = np.ones(200 * 2**20 // 8)  # 200 MB",
    "import time\nchunks = []\nfor _ in range(16):\n"
    "    chunks.append(np.ones(20 * 2**20 // 8))\n    time.sleep(0.5)",
    "import tensorflow as tf\nt = tf.zeros((1000, 1000))",
]
RSS = '.kerasmagic-live [data-km-live="rss"]'
RSS_JS = f"Number(document.querySelector('{RSS}')?.dataset.bytes)"


@pytest.fixture(scope="module")
def classic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    python = os.environ.get("KERASMAGIC_COLAB_PYTHON")
    if not python:
        why = "needs KERASMAGIC_COLAB_PYTHON: Colab's environment (.ci/run makes it)"
        if os.environ.get("KERASMAGIC_REQUIRE_COLAB") == "1":
            pytest.fail(why)
        pytest.skip(why)
    require(missing())
    found = subprocess.run([python, "-c", "import kerasmagic"], capture_output=True, cwd="/")
    if found.returncode != 0:  # else each cell would fail in the page, seen only as a timeout
        pytest.fail(f"kerasmagic is not importable by {python} (install it or set PYTHONPATH)")
    with serve(tmp_path_factory.mktemp("classic"), "classic", python) as server:
        yield server


def run_classic(page: Any, index: int, wait: bool = True, timeout_s: float = 120) -> Any:
    """Select the ``index``-th cell of the classic notebook and run it with Shift+Enter."""
    cell = page.locator("#notebook-container .cell").nth(index)
    cell.locator(".input_area").click()
    page.keyboard.press("Control+Enter")
    if wait:
        prompt = cell.locator(".input_prompt")
        deadline = time.monotonic() + timeout_s
        while not re.search(r"\[\d+\]", prompt.inner_text()):
            assert time.monotonic() < deadline, f"cell still running: {prompt.inner_text()!r}"
            time.sleep(0.2)
    return cell


def rss(page: Any) -> int:
    return int(page.locator(RSS).get_attribute("data-bytes"))


def test_live_widget_renders_and_moves_in_classic_notebook(classic: Server, page: Any) -> None:
    write_notebook(classic.root, "live.ipynb", CELLS)
    page.goto(f"{classic.url}/notebooks/live.ipynb")
    wait_until(page, "() => window.Jupyter?.notebook?.kernel?.is_connected()", timeout_s=90)
    wait_until(page, "() => window.Jupyter.notebook.kernel_busy === false", timeout_s=90)
    run_classic(page, 0)
    shown = run_classic(page, 1)
    output = shown.locator(".output_area")
    output.locator(".kerasmagic-live").wait_for(state="visible", timeout=30000)
    assert "HTML(value=" not in output.inner_text(), "the text fallback, not the widget"
    wait_until(page, f"() => {RSS_JS} > 0")
    before = rss(page)
    assert fmt_bytes(before) in page.locator(RSS).inner_text()

    run_classic(page, 2)  # +200 MB: the widget moves after the cell
    wait_until(page, f"() => {RSS_JS} > {before + 150 * MB}")
    after = rss(page)

    running = run_classic(page, 3, wait=False)  # 16 x 0.5 s, +20 MB each
    wait_until(page, f"() => {RSS_JS} > {after + 60 * MB}", timeout_s=7)
    assert "[*]" in running.locator(".input_prompt").inner_text(), "moved only after the cell"
    run_classic(page, 4)  # TensorFlow's allocator, counted on the CPU, shown beside RSS
    tensors = '.kerasmagic-live [data-km-live="allocator"]'
    wait_until(page, f"() => document.querySelector('{tensors}') !== null", timeout_s=60)
    tf_bytes = int(page.locator(tensors).get_attribute("data-bytes"))
    assert tf_bytes >= 4_000_000
    shots = os.environ.get("KERASMAGIC_SCREENSHOT_DIR")
    if shots:
        output.screenshot(path=str(Path(shots) / "live_widget_classic.png"))
