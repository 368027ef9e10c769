"""The sidebar's "What holds memory" section in a real JupyterLab: press Scan, read the rows.

A model held only by ``Out[]`` is marked as freed by "Free memory", one kept under a name is
not (with its remedy), and the user's array is listed under the largest data. A scan pressed
while a cell runs is queued and answered after it. Text contrast in light and dark.
``KERASMAGIC_SCREENSHOT_DIR=docs`` writes ``sidebar_scan.png``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .conftest import Server, run_cell, show_sidebar, wait_for_kernel, wait_until, write_notebook
from .contrast import low_contrast, set_theme

pytestmark = pytest.mark.slow

CELLS = [
    "%load_ext kerasmagic",
    "import numpy as np, keras\narr = np.ones((1000, 1000))  # 8 MB of float64\n"
    "def small():\n    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])\n"
    "kept = small()",
    "small()  # held only by Out[3]",
    "import time\ntime.sleep(6)\nlate = np.zeros(500_000)",
]
PANEL = ".jp-kerasmagic-panel"
PHASE_JS = "document.querySelector('[data-km=\"scan-status\"]')?.dataset.phase"
BUSY_JS = "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'busy'"


def _row(panel: Any, kind: str, name: str) -> Any:
    return panel.locator(f'[data-km="scan-{kind}"][data-name="{name}"]')


def _shoot(page: Any, path: Path) -> None:
    page.locator('[data-km="scan-section"]').screenshot(path=str(path))


def _readable(page: Any, theme: str) -> None:
    bad = low_contrast(page, ['[data-km="scan-section"]'])
    assert bad == [], f"text below 4.5:1 in {theme}:\n" + "\n".join(map(str, bad))


def test_scan_shows_what_holds_memory(lab: Server, page: Any) -> None:
    write_notebook(lab.root, "scan.ipynb", CELLS)
    page.goto(f"{lab.url}/lab/workspaces/scan/tree/scan.ipynb")
    wait_for_kernel(page)
    show_sidebar(page)
    for index in (0, 1, 2):
        run_cell(page, index)
    wait_until(page, f"document.querySelector('{PANEL}')?.dataset.status === 'live'")
    panel = page.locator(PANEL)
    button = panel.locator('[data-km="scan"]')
    assert button.get_attribute("aria-label") == "Scan the kernel for what holds memory"
    assert panel.locator('[data-km="scan-status"]').get_attribute("aria-live") == "polite"

    button.click()
    wait_until(page, f"{PHASE_JS} === 'done'", timeout_s=60)
    out = panel.locator('[data-km="scan-model"][data-freeable="true"]')
    assert out.count() == 1
    assert "Out[3]" in out.inner_text() and "Free memory clears it" in out.inner_text()
    assert "freed by Free memory" in out.inner_text()
    kept = panel.locator('[data-km="scan-model"][data-freeable="false"]')
    assert kept.count() == 1
    assert "del kept, or rebind it in a %%fresh_model cell" in kept.inner_text()
    assert int(kept.get_attribute("data-bytes")) == (8 * 2 + 2) * 4  # float32 weights
    array = _row(panel, "variable", "arr")
    assert array.get_attribute("data-bytes") == str(8_000_000)
    assert "ndarray" in array.inner_text() and "7.6 MB" in array.inner_text()
    data = panel.locator('[data-km="scan-variables"]')
    assert data.locator("caption").inner_text() == "Largest data (yours; never freed)"
    headers = panel.locator('[data-km="scan-models"] thead th[scope="col"]').all_inner_texts()
    assert headers == ["Model", "Held by → what frees it"], headers

    shots = os.environ.get("KERASMAGIC_SCREENSHOT_DIR")
    if shots:
        _shoot(page, Path(shots) / "sidebar_scan.png")
    _readable(page, "JupyterLab Light")
    try:
        set_theme(page, "JupyterLab Dark")
        _readable(page, "JupyterLab Dark")
    finally:
        set_theme(page, "JupyterLab Light")  # the theme is a user setting the next tests share

    # Pressed while a cell runs: queued (the button is off), answered after the cell.
    running = run_cell(page, 3, wait=False)
    wait_until(page, BUSY_JS, timeout_s=10)
    button.click()
    assert page.evaluate(PHASE_JS) == "queued"
    assert button.is_disabled()
    assert "[*]" in running.locator(".jp-InputArea-prompt").inner_text()
    wait_until(page, f"{PHASE_JS} === 'done'", timeout_s=60)
    assert _row(panel, "variable", "late").get_attribute("data-bytes") == str(4_000_000)
    assert button.is_enabled()
