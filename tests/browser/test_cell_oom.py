"""A real out-of-memory error in a real JupyterLab: the cell's badge, its saved record, the panel.

The kernel puts TensorFlow's CPU device on the BFC allocator every GPU uses, capped at 160 MB,
before TensorFlow starts (its first cell), so the error and its figures are TensorFlow's own.
BFC retries ~10 s before it gives up.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from .conftest import (
    FREE_TIMEOUT_MS,
    Server,
    run_cell,
    show_sidebar,
    wait_for_kernel,
    wait_until,
    write_notebook,
)

pytestmark = pytest.mark.slow

CELLS = [
    "import os\nos.environ['TF_CPU_ALLOCATOR_USE_BFC'] = 'true'\n"
    "os.environ['TF_CPU_BFC_MEM_LIMIT_IN_MB'] = '160'\n%load_ext kerasmagic",
    "import tensorflow as tf\na = tf.zeros((10, 1000, 1000))",
    "big = tf.zeros((35, 1000, 1000))",  # 133.5 MB more than the cap holds
    "x = 1",
]
CELL = "window.jupyterapp.shell.currentWidget.content.model.cells.get(i)"
METADATA_JS = f"(i) => {CELL}.getMetadata('kerasmagic') ?? null"
BADGE = '[data-km="cell-badge"]'
OOM = '.jp-kerasmagic-panel [data-km="oom"]'
WANTED = 35 * 1000 * 1000 * 4


def _badge(page: Any, index: int) -> dict[str, Any]:
    """Wait for cell ``index``'s badge of its latest run; return its data and text."""
    count = page.evaluate(f"(i) => {CELL}.executionCount", index)
    badge = f".jp-Notebook .jp-Cell >> nth={index} >> {BADGE}"
    page.wait_for_selector(f"{badge}[data-execution-count='{count}']", state="visible")
    attrs: dict[str, Any] = page.eval_on_selector(badge, "el => ({...el.dataset})")
    attrs["text"] = page.inner_text(badge)
    attrs["label"] = page.get_attribute(badge, "aria-label")
    return attrs


def test_an_oom_marks_the_badge_is_saved_and_shown_in_the_panel(lab: Server, page: Any) -> None:
    write_notebook(lab.root, "oom.ipynb", CELLS)
    page.goto(f"{lab.url}/lab/workspaces/oom/tree/oom.ipynb")
    wait_for_kernel(page)
    show_sidebar(page)
    for index in (0, 1):
        run_cell(page, index)
    assert _badge(page, 1)["oom"] == "false"
    cell = run_cell(page, 2, timeout_s=180)
    printed = cell.locator(".jp-OutputArea").inner_text()
    assert "ResourceExhaustedError" in printed and "kerasmagic: out of memory on CPU:0" in printed
    remedy = printed.split("  remedy     ", 1)[1].splitlines()[0].strip()

    badge = _badge(page, 2)
    assert badge["oom"] == "true" and badge["oomDevice"] == "CPU:0", badge
    assert int(badge["oomWanted"]) == WANTED
    assert f"✖ out of memory: wanted 133.5 MB on CPU:0 — remedy: {remedy}" in badge["text"]
    assert "limit 160.0 MB (TF_CPU_BFC_MEM_LIMIT_IN_MB)" in badge["label"]  # tooltip, read aloud
    record = page.evaluate(METADATA_JS, 2)
    oom = record["oom"]
    assert oom["device"] == "CPU:0" and oom["backend"] == "tensorflow"
    assert oom["wanted_bytes"] == WANTED and oom["shape"] == [35, 1000, 1000]
    assert oom["limit_bytes"] == 160 * 2**20 and oom["remedy"] == remedy
    assert 40 * 10**6 <= oom["in_use_bytes"] <= 70 * 2**20  # `a`, and BFC's chunk rounding

    wait_until(page, f"document.querySelector('{OOM}')?.dataset.executionCount === "
                     f"'{record['execution_count']}'")  # fmt: skip
    shown = page.inner_text(OOM)
    assert (
        f"Cell [{record['execution_count']}] ran out of memory: wanted 133.5 MB on CPU:0" in shown
    )
    assert "limit 160.0 MB (TF_CPU_BFC_MEM_LIMIT_IN_MB)" in shown
    assert f"Remedy: {remedy}" in shown

    run_cell(page, 3)  # a later cell: its own badge is plain, the panel keeps the last OOM
    assert _badge(page, 3)["oom"] == "false"
    assert page.evaluate(METADATA_JS, 3)["oom"] is None
    assert page.get_attribute(OOM, "data-execution-count") == str(record["execution_count"])

    page.keyboard.press("Control+s")
    path = lab.root / "oom.ipynb"
    deadline = time.monotonic() + 30
    while json.loads(path.read_text())["cells"][2].get("metadata", {}).get("kerasmagic") is None:
        assert time.monotonic() < deadline, "the record was not saved"
        time.sleep(0.3)
    assert json.loads(path.read_text())["cells"][2]["metadata"]["kerasmagic"] == record

    page.click('.jp-kerasmagic-panel [data-km="free"]')
    wait_until(page, f"document.querySelector('{OOM}')?.dataset.freed === 'true'",
               timeout_s=FREE_TIMEOUT_MS / 1000)  # fmt: skip
    assert "Memory was freed since." in page.inner_text(OOM)
    dismiss = page.locator('.jp-kerasmagic-panel [data-km="oom-dismiss"]')
    assert "Dismiss the out-of-memory note of cell" in (dismiss.get_attribute("aria-label") or "")
    dismiss.click()
    wait_until(page, f"document.querySelector('{OOM}') === null")
