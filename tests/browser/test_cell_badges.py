"""Per-cell memory badges and the ``metadata.kerasmagic`` record, in a real JupyterLab.

The sidebar panel is never opened here: every notebook keeps its kerasmagic comm open, so cells
get their record and badge whether or not the panel is shown.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import MB, Server, run_cell, wait_for_kernel, wait_until, write_notebook

pytestmark = pytest.mark.slow

GROW = "keep.append(b'\\x01' * (24 * 2**20))"  # the same cell keeps 24 MB more each run
CELLS = ["%load_ext kerasmagic", "keep = []", GROW, "x = 1"]
CELL = "window.jupyterapp.shell.currentWidget.content.model.cells.get(i)"
METADATA_JS = f"(i) => {CELL}.getMetadata('kerasmagic') ?? null"
COUNT_JS = f"(i) => {CELL}.executionCount"
RECORDED_JS = f"(i) => {CELL}.getMetadata('kerasmagic')?.execution_count === {CELL}.executionCount"
BADGE = '[data-km="cell-badge"]'
BELOW_JS = """el => el.nextElementSibling === null && ['inputWrapper', 'outputWrapper'].every(
  w => el.getBoundingClientRect().top >= el.parentElement.querySelector('.jp-Cell-' + w)
    .getBoundingClientRect().bottom - 1)"""
TOGGLE_JS = "window.jupyterapp.commands.execute('kerasmagic:toggle-cell-badges')"


def _badge_for_run(page: Any, index: int) -> dict[str, Any]:
    """Wait for cell ``index``'s badge of its latest run; return its data attributes."""
    count = page.evaluate(COUNT_JS, index)
    badge = f".jp-Notebook .jp-Cell >> nth={index} >> {BADGE}"
    page.wait_for_selector(f"{badge}[data-execution-count='{count}']", state="visible")
    attrs: dict[str, Any] = page.eval_on_selector(badge, "el => ({...el.dataset})")
    below = page.eval_on_selector(badge, BELOW_JS)
    assert below, "the badge must be the cell's last line, under its input and output"
    attrs["text"] = page.inner_text(badge)
    return attrs


def _saved(path: Path, index: int, count: int, timeout_s: float = 30) -> dict[str, Any]:
    """Wait until the file on disk has cell ``index`` saved at ``count``; return that cell."""
    deadline = time.monotonic() + timeout_s
    while True:
        cell: dict[str, Any] = json.loads(path.read_text())["cells"][index]
        if cell.get("execution_count") == count:
            return cell
        assert time.monotonic() < deadline, f"not saved: {cell}"
        time.sleep(0.3)


def test_badges_record_each_cell_and_are_saved_with_the_notebook(lab: Server, page: Any) -> None:
    write_notebook(lab.root, "badges.ipynb", CELLS)
    page.goto(f"{lab.url}/lab/workspaces/badges/tree/badges.ipynb")
    wait_for_kernel(page)
    for index in (0, 1):
        run_cell(page, index)
    quiet = _badge_for_run(page, 1)
    assert quiet["warning"] == "false"
    assert abs(int(quiet["rssDelta"])) < 8 * MB, quiet
    assert quiet["text"].startswith("RSS "), quiet

    for _ in range(3):  # a cell that grows run after run: the third run is flagged
        run_cell(page, 2)
    grown = _badge_for_run(page, 2)
    assert 20 * MB <= int(grown["rssDelta"]) <= 40 * MB, grown
    assert int(grown["peakRss"]) >= int(grown["rssDelta"]), grown
    assert grown["text"].startswith("RSS +2") and "⚠" in grown["text"], grown
    assert grown["warning"] == "true"
    record = page.evaluate(METADATA_JS, 2)
    assert record["execution_count"] == int(grown["executionCount"])
    assert record["rss_delta_bytes"] == int(grown["rssDelta"])
    assert record["peak_rss_bytes"] == int(grown["peakRss"])
    assert "grows" in record["warning"], record
    status = page.locator(".jp-kerasmagic-status")
    wait_until(page, "document.querySelector('.jp-kerasmagic-status')?.dataset.warn === 'true'")
    assert "jp-mod-warn" in (status.get_attribute("class") or "")
    assert status.inner_text().startswith("⚠ RSS ")

    run_cell(page, 3)  # the verdict still names cell 2; this cell's own badge has no mark
    other = _badge_for_run(page, 3)
    assert other["warning"] == "false", other
    assert page.evaluate(METADATA_JS, 3)["warning"] is None

    page.keyboard.press("Control+s")
    path = lab.root / "badges.ipynb"
    saved = _saved(path, 2, int(grown["executionCount"]))
    assert saved["metadata"]["kerasmagic"] == record
    saved = _saved(path, 3, int(other["executionCount"]))
    assert saved["metadata"]["kerasmagic"]["warning"] is None

    # The setting hides every badge (and is saved as a setting); records are still written.
    page.evaluate(TOGGLE_JS)
    wait_until(
        page, f"[...document.querySelectorAll('{BADGE}')].every(b => !b.getClientRects().length)"
    )
    settings = lab.root.parent / "JUPYTER_CONFIG_DIR/lab/user-settings/kerasmagic"
    assert '"showCellBadges": false' in (settings / "plugin.jupyterlab-settings").read_text()
    run_cell(page, 3)
    wait_until(page, RECORDED_JS, arg=3)
    assert page.locator(f"{BADGE}:visible").count() == 0
    page.evaluate(TOGGLE_JS)
    assert _badge_for_run(page, 3)["executionCount"] == str(page.evaluate(COUNT_JS, 3))


def test_badge_and_record_carry_tensorflows_tensors(lab: Server, page: Any) -> None:
    """A cell that keeps a 1000x1000 float tensor (4,000,000 B) says so in TF tensors."""
    cells = ["%load_ext kerasmagic", "import tensorflow as tf\nt0 = tf.zeros(1)",
             "t = tf.zeros((1000, 1000))"]  # fmt: skip
    write_notebook(lab.root, "tensors.ipynb", cells)
    page.goto(f"{lab.url}/lab/workspaces/tensors/tree/tensors.ipynb")
    wait_for_kernel(page)
    for index in range(3):
        run_cell(page, index)
    badge = _badge_for_run(page, 2)
    assert 4_000_000 <= int(badge["tfDelta"]) <= 8_000_000, badge  # BFC's chunk, see test_gpu_mem
    assert "TF tensors +" in badge["text"], badge
    record = page.evaluate(METADATA_JS, 2)
    assert record["tf_delta_bytes"] == int(badge["tfDelta"])
    assert record["tf_bytes"] >= record["tf_delta_bytes"]
