"""What a person sees first (issue 32): the sidebar during Run All, where it opens, Notebook 7's
way in, the chart's text and labels, and kerasmagic's lines wrapped between words.

Run All queues every cell on the kernel's shell channel, and the sidebar's own hello waited
behind them: "Connecting to the kernel…" until the last cell ended. ``%load_ext kerasmagic`` now
opens the connection from the kernel's side (iopub), so the panel is live while the rest run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import (
    Server,
    missing,
    require,
    run_cell,
    serve,
    show_sidebar,
    wait_for_kernel,
    wait_until,
    write_notebook,
)

pytestmark = pytest.mark.slow
PANEL = "#kerasmagic-memory"
LIVE_JS = "() => document.querySelector('[data-km=\"headline\"]') !== null"
RUNNING_JS = (
    "(i) => window.jupyterapp.shell.currentWidget.content.model.cells.get(i).executionState"
    " === 'running'"
)


def test_the_panel_opens_on_the_right_and_is_live_while_run_all_still_runs(
    lab: Server, page: Any
) -> None:
    cells = [
        "%load_ext kerasmagic",
        "import time\ntime.sleep(8)",
        "x = 1",
    ]
    write_notebook(lab.root, "runall_live.ipynb", cells)
    page.goto(f"{lab.url}/lab/workspaces/runall_live/tree/runall_live.ipynb")
    wait_for_kernel(page)
    page.locator(PANEL).wait_for(state="visible", timeout=10000)  # opened without a click
    page.click('.lm-MenuBar-itemLabel:text-is("Run")')
    page.click('.lm-Menu-itemLabel:text-is("Run All Cells")')
    wait_until(page, RUNNING_JS, arg=1, timeout_s=30)  # the sleep runs: the load cell is done
    wait_until(page, LIVE_JS, timeout_s=5)  # live within seconds, not after the last cell
    assert page.evaluate(RUNNING_JS, 1), "the panel went live only after the queued cells"
    status = page.locator(".jp-kerasmagic-status")
    assert status.inner_text().startswith(("RSS ", "VRAM ", "TF tensors ")), status.inner_text()


def test_the_chart_reads_at_the_default_width_and_no_bar_covers_a_label(
    lab: Server, page: Any
) -> None:
    cells = [
        "%load_ext kerasmagic",
        "keep = [b'\\x01' * (40 * 2**20)]",
        "keep.append(b'\\x01' * (60 * 2**20))",
        "keep.append(b'\\x01' * (20 * 2**20))",
        "print('kerasmagic: ' + 'a long line that must wrap between words ' * 8)",
    ]
    write_notebook(lab.root, "chart_text.ipynb", cells)
    page.goto(f"{lab.url}/lab/workspaces/chart_text/tree/chart_text.ipynb")
    wait_for_kernel(page)
    for index in range(len(cells)):
        run_cell(page, index)
    show_sidebar(page)
    chart = page.locator(".jp-kerasmagic-chart")
    chart.wait_for(state="visible", timeout=15000)
    sizes = chart.evaluate(
        "svg => [...svg.querySelectorAll('.jp-kerasmagic-axis, .jp-kerasmagic-delta')]"
        ".map(t => t.getBoundingClientRect().height)"
    )
    assert sizes and min(sizes) >= 9.5, sizes  # ~7 px before, at this width
    order = chart.evaluate(
        "svg => { const kids = [...svg.children];"
        " const labels = kids.filter(k => k.classList.contains('jp-kerasmagic-delta'));"
        " const bars = kids.filter(k => k.tagName === 'rect');"
        " return [labels.length, Math.min(...labels.map(l => kids.indexOf(l))),"
        " Math.max(...bars.map(b => kids.indexOf(b)))]; }"
    )
    labels, first_label, last_bar = order
    assert labels >= 1 and first_label > last_bar, order  # drawn after every bar
    pre = page.locator(".jp-Notebook .jp-Cell").nth(4).locator(".jp-OutputArea-output pre")
    assert pre.evaluate("el => getComputedStyle(el).wordBreak") == "normal"


@pytest.fixture(scope="module")
def notebook7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    require(missing())
    with serve(tmp_path_factory.mktemp("notebook7_toolbar"), "notebook") as server:
        yield server


def test_notebook7_shows_the_figure_in_the_toolbar_and_it_opens_the_panel(
    notebook7: Server, page: Any
) -> None:
    write_notebook(notebook7.root, "toolbar.ipynb", ["%load_ext kerasmagic", "x = 1"])
    page.goto(f"{notebook7.url}/notebooks/toolbar.ipynb")
    wait_for_kernel(page)
    run_cell(page, 0)
    item = page.locator(".jp-NotebookPanel-toolbar .jp-kerasmagic-status")
    wait_until(page, "() => /^(RSS|VRAM|TF tensors) /.test("
               "document.querySelector('.jp-NotebookPanel-toolbar .jp-kerasmagic-status')"
               "?.textContent ?? '')", timeout_s=20)  # fmt: skip
    item.click()
    page.locator(PANEL).wait_for(state="visible", timeout=10000)
