"""``%gpu_mem --live`` in a real JupyterLab and Notebook 7: the ipywidgets view renders and moves.

Reads the RSS figure from the rendered widget's DOM (``[data-km-live="rss"]``, whose
``data-bytes`` is the figure the bar shows). ``KERASMAGIC_WIDGET_SCREENSHOT=path`` saves the
JupyterLab widget there (``docs/live_widget.png``); ``KERASMAGIC_SCREENSHOT_DIR=docs`` writes
``live_widget.png`` and ``live_widget_dark.png`` there. Its text is checked for 4.5:1 contrast in
the light and dark themes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kerasmagic.views.render import fmt_bytes

from .conftest import (
    MB,
    Server,
    missing,
    require,
    run_cell,
    serve,
    wait_done,
    wait_for_kernel,
    wait_until,
    write_notebook,
)
from .contrast import low_contrast, set_theme

pytestmark = pytest.mark.slow

CELLS = [
    "%load_ext kerasmagic",
    "%gpu_mem --live",
    "import numpy as np\na = np.ones(200 * 2**20 // 8)  # 200 MB",
    "import time\nchunks = []\nfor _ in range(16):\n"
    "    chunks.append(np.ones(20 * 2**20 // 8))\n    time.sleep(0.5)",
]
RSS = '.kerasmagic-live [data-km-live="rss"]'
RSS_JS = f"Number(document.querySelector('{RSS}')?.dataset.bytes)"


@pytest.fixture(scope="module")
def notebook7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Notebook 7 (``jupyter notebook``), started like the JupyterLab fixture."""
    require(missing())
    try:
        import notebook
    except ImportError:
        notebook = None
    if notebook is None or not notebook.__version__.startswith("7."):
        require("needs Notebook 7: pip install 'notebook>=7,<8'")
    with serve(tmp_path_factory.mktemp("notebook7"), "notebook") as server:
        yield server


def _rss(page: Any) -> tuple[int, str]:
    """Return the widget's RSS bytes and the text its bar shows."""
    bar = page.locator(RSS)
    return int(bar.get_attribute("data-bytes")), bar.inner_text()


def _check_widget(page: Any, url: str, during: bool) -> Any:
    """Run the cells at ``url``: the widget renders, rises and (``during``) moves mid-cell."""
    page.goto(url)
    wait_for_kernel(page)
    run_cell(page, 0)
    shown = run_cell(page, 1)
    output = shown.locator(".jp-OutputArea-output")
    output.locator(".kerasmagic-live").wait_for(state="visible", timeout=30000)
    assert "VBox(" not in output.inner_text(), "text fallback instead of the widget"
    wait_until(page, f"{RSS_JS} > 0")
    before, text = _rss(page)
    assert text.startswith("RSS") and fmt_bytes(before) in text, text

    run_cell(page, 2)  # +200 MB
    wait_until(page, f"{RSS_JS} > {before + 150 * MB}")
    after, text = _rss(page)
    assert fmt_bytes(after) in text, text

    if during:
        running = run_cell(page, 3, wait=False)  # 16 x 0.5 s, +20 MB each
        wait_until(page, f"{RSS_JS} > {after + 60 * MB}", timeout_s=7)
        assert "[*]" in running.locator(".jp-InputArea-prompt").inner_text(), (
            "the widget moved only after the cell"
        )
        moved, text = _rss(page)
        assert fmt_bytes(moved) in text, text
        wait_done(running)
        wait_until(page, f"{RSS_JS} > {after + 250 * MB}")
    return output


def test_live_widget_renders_and_follows_rss_in_jupyterlab(lab: Server, page: Any) -> None:
    write_notebook(lab.root, "live.ipynb", CELLS)
    output = _check_widget(page, f"{lab.url}/lab/workspaces/live/tree/live.ipynb", during=True)
    shot = os.environ.get("KERASMAGIC_WIDGET_SCREENSHOT")
    shots = os.environ.get("KERASMAGIC_SCREENSHOT_DIR")
    if shot:
        output.screenshot(path=shot)
    elif shots:
        output.screenshot(path=str(Path(shots) / "live_widget.png"))
    assert low_contrast(page, [".kerasmagic-live"]) == [], low_contrast(page, [".kerasmagic-live"])
    try:
        set_theme(page, "JupyterLab Dark")
        assert low_contrast(page, [".kerasmagic-live"]) == [], low_contrast(
            page, [".kerasmagic-live"]
        )
        if shots:
            output.screenshot(path=str(Path(shots) / "live_widget_dark.png"))
    finally:
        set_theme(page, "JupyterLab Light")


def test_live_widget_renders_in_notebook7(notebook7: Server, page: Any) -> None:
    write_notebook(notebook7.root, "live.ipynb", CELLS)
    _check_widget(page, f"{notebook7.url}/notebooks/live.ipynb", during=False)
