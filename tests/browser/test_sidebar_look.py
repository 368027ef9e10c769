"""What the sidebar looks like: the headline figure, the scaled history chart with its live line,
the disabled button, the status-bar warning, and text contrast in the light and dark themes.

``KERASMAGIC_SCREENSHOT_DIR=docs`` writes the images README.md and docs/ show: ``sidebar.png``
and ``sidebar_dark.png`` (the panel), ``cell_badge.png`` (a cell with its badge).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    MB,
    Server,
    run_cell,
    show_sidebar,
    wait_done,
    wait_for_kernel,
    wait_until,
    write_notebook,
)
from .contrast import CONTRAST_JS, low_contrast, set_theme

pytestmark = pytest.mark.slow

CELLS = [
    "%load_ext kerasmagic",
    "blob = b'\\x01' * (40 * 2**20)",
    "keep = []",
    "keep.append(b'\\x02' * (12 * 2**20))",  # run three times: flagged as growing
    "import time\nmore = []\nfor _ in range(12):\n    more.append(b'\\x03' * (4 * 2**20))\n"
    "    time.sleep(0.5)",
]
PANEL = ".jp-kerasmagic-panel"
TEXT = [PANEL, ".jp-kerasmagic-status", '[data-km="cell-badge"]']
LIVE_JS = "Number(document.querySelector('.jp-kerasmagic-live')?.dataset.points ?? 0)"


def _shots() -> Path | None:
    where = os.environ.get("KERASMAGIC_SCREENSHOT_DIR")
    return Path(where) if where else None


def _shoot_panel(page: Any, path: Path) -> None:
    """Screenshot the panel down to its last line (not the empty rest of the sidebar)."""
    box = page.eval_on_selector(
        PANEL,
        """el => { const r = el.getBoundingClientRect();
        const bottom = Math.max(...[...el.children].map(c => c.getBoundingClientRect().bottom));
        const height = Math.min(r.height, bottom - r.y + 10);
        return {x: r.x, y: r.y, width: r.width, height}; }""",
    )
    page.screenshot(path=str(path), clip=box)


def _check_contrast(page: Any, theme: str) -> None:
    rows = page.evaluate(CONTRAST_JS, TEXT)
    assert any(r["tag"] == "text" for r in rows), "the chart's SVG text was not checked"
    print(theme, len(rows), "texts, lowest contrast", min(rows, key=lambda r: r["ratio"]))
    bad = low_contrast(page, TEXT)
    assert bad == [], f"text below 4.5:1 in {theme}:\n" + "\n".join(map(str, bad))


def test_sidebar_look_in_light_and_dark(lab: Server, page: Any) -> None:
    write_notebook(lab.root, "look.ipynb", CELLS)
    page.goto(f"{lab.url}/lab/workspaces/look/tree/look.ipynb")
    wait_for_kernel(page)
    show_sidebar(page)
    for index in (0, 1, 2, 3, 3, 3):
        run_cell(page, index)
    wait_until(page, "document.querySelector('[data-km=\"history\"]')?.dataset.cells >= 5")
    panel = page.locator(PANEL)

    # The one figure first, in large type: this kernel's RSS (no GPU here).
    headline = panel.locator('[data-km="headline"]')
    assert headline.get_attribute("data-bytes") == panel.locator('[data-km="rss"]').get_attribute(
        "data-bytes"
    )
    size = headline.locator(".jp-kerasmagic-headline-value").evaluate(
        "el => parseFloat(getComputedStyle(el).fontSize)"
    )
    assert size >= 2 * panel.evaluate("el => parseFloat(getComputedStyle(el).fontSize)")

    # The chart's axis spans the data, not zero to the top: 40 MB on ~100+ MB is visible.
    chart = panel.locator(".jp-kerasmagic-chart")
    lo, hi = int(chart.get_attribute("data-lo")), int(chart.get_attribute("data-hi"))
    rss = int(headline.get_attribute("data-bytes"))
    assert 0 < lo < rss - 40 * MB and rss <= hi < rss + 40 * MB, (lo, hi, rss)
    axis = chart.locator(".jp-kerasmagic-axis").all_text_contents()
    assert f"{round(lo / MB)} MB" in axis and f"{round(hi / MB)} MB" in axis, axis
    blob = chart.locator('.jp-kerasmagic-delta[data-count="2"]')  # the 40 MB cell, labelled
    assert 35 <= float(blob.text_content().strip("+ MB")) <= 45, blob.text_content()
    assert chart.locator("rect.jp-kerasmagic-up").count() >= 4
    legend = panel.locator(".jp-kerasmagic-legend").inner_text()
    assert "cell grew" in legend and "in-cell peak" in legend

    # The status bar turns to the warning colour with a mark.
    status = page.locator(".jp-kerasmagic-status")
    wait_until(page, "document.querySelector('.jp-kerasmagic-status')?.dataset.warn === 'true'")
    assert status.inner_text().startswith("⚠")
    assert status.evaluate("el => getComputedStyle(el).backgroundColor") not in (
        "rgba(0, 0, 0, 0)",
        "transparent",
    )

    # The running cell draws a live line from its samples (twice a second), gone once it ends.
    running = run_cell(page, 4, wait=False)
    wait_until(page, f"{LIVE_JS} >= 3", timeout_s=10)
    assert "[*]" in running.locator(".jp-InputArea-prompt").inner_text()
    assert "running cell" in panel.locator(".jp-kerasmagic-legend").inner_text()
    wait_done(running)
    wait_until(page, f"{LIVE_JS} === 0")

    # A disabled "Free memory" looks disabled (dashed, dimmed, no-entry cursor).
    free = panel.locator('[data-km="free"]')
    looks = free.evaluate(
        """el => { el.disabled = true; const s = getComputedStyle(el);
        const out = [s.borderStyle, s.cursor, Number(s.opacity)];
        el.disabled = false; return out; }"""
    )
    assert looks[0] == "dashed" and looks[1] == "not-allowed" and looks[2] < 1, looks

    # The check itself catches faint text: a line in --jp-ui-font-color3 (38% black) fails it.
    page.eval_on_selector(
        PANEL,
        "el => el.insertAdjacentHTML('beforeend', '<p id=\"km-faint\" "
        'style="color: var(--jp-ui-font-color3)">faint</p>\')',
    )
    assert [r["text"] for r in low_contrast(page, [PANEL])] == ["faint"]
    page.eval_on_selector("#km-faint", "el => el.remove()")

    shots = _shots()
    _check_contrast(page, "JupyterLab Light")
    if shots:
        _shoot_panel(page, shots / "sidebar.png")
        page.locator(".jp-Notebook .jp-Cell").nth(3).screenshot(path=str(shots / "cell_badge.png"))
    try:
        set_theme(page, "JupyterLab Dark")
        _check_contrast(page, "JupyterLab Dark")
        if shots:
            _shoot_panel(page, shots / "sidebar_dark.png")
    finally:
        set_theme(page, "JupyterLab Light")  # the theme is a user setting the next tests share
