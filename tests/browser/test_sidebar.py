"""The sidebar in a real JupyterLab, driven in headless Debian Chromium by Python Playwright.

Skips (unless ``KERASMAGIC_REQUIRE_BROWSER=1``, as in ``.ci/browser.sh``) when Chromium,
Playwright, JupyterLab or the built sidebar are missing. ``KERASMAGIC_SCREENSHOT=path`` saves
the final screenshot there (``docs/sidebar.png`` for the README).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from .conftest import (
    FREE_TIMEOUT_MS,
    MB,
    Server,
    run_cell,
    show_sidebar,
    wait_done,
    wait_for_kernel,
    wait_until,
    write_notebook,
)

pytestmark = pytest.mark.slow

CELLS = [
    "import os, time\nos.getpid()",
    "%load_ext kerasmagic",
    'blob = b"\\x01" * (300 * 2**20)',
    'chunks = []\nfor _ in range(16):\n    chunks.append(b"\\x02" * (20 * 2**20))\n'
    "    time.sleep(0.5)",
    "import keras, numpy as np\n"
    "def small():\n    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])\n"
    "kept = small()",
    "small()  # held only by Out[]",
    "def train():\n    data = np.ones(300 * 2**20 // 8)  # 300 MB the traceback keeps alive\n"
    "    model = small()\n    raise RuntimeError('diverged')\ntrain()",
    # A kernel that never answers "Free memory" (as one whose cleanup hung would).
    "from kerasmagic.shellstate import current\n"
    "current().part('sidebar')._request_free = lambda comm, rid: None",
]


def _figure(page: Any, key: str) -> int:
    return int(page.get_attribute(f'.jp-kerasmagic-panel [data-km="{key}"]', "data-bytes"))


FREE_PHASE_JS = "document.querySelector('[data-km=\"free-result\"]')?.dataset.phase"
STATUS_JS = "document.querySelector('.jp-kerasmagic-panel')?.dataset.status"
RSS_JS = "Number(document.querySelector('.jp-kerasmagic-panel [data-km=\"rss\"]')?.dataset.bytes)"


def test_sidebar_follows_the_kernel_and_frees_memory(lab: Server, page: Any) -> None:
    write_notebook(lab.root, "sidebar.ipynb", CELLS)
    page.goto(f"{lab.url}/lab/workspaces/sidebar/tree/sidebar.ipynb")
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=60000)
    wait_for_kernel(page)
    show_sidebar(page)
    panel = page.locator(".jp-kerasmagic-panel")
    wait_until(
        page, "document.querySelector('.jp-kerasmagic-panel')?.dataset.status === 'not-loaded'"
    )
    assert panel.locator('[data-km="load"]').is_visible()  # says so and offers the button

    out = run_cell(page, 0).locator(".jp-OutputArea-output").inner_text()
    pid = int(out.strip())
    run_cell(page, 1)  # %load_ext kerasmagic: the sidebar connects by itself
    wait_until(page, "document.querySelector('.jp-kerasmagic-panel')?.dataset.status === 'live'")
    assert page.get_attribute('[data-km="kernel"]', "data-pid") == str(pid)
    status_text = page.inner_text(".jp-kerasmagic-status")
    assert status_text.startswith(("RSS ", "VRAM "))

    before = _figure(page, "rss")
    run_cell(page, 2)  # +300 MB
    wait_until(page, f"{RSS_JS} > {before + 250 * MB}")

    start = _figure(page, "rss")
    running = run_cell(page, 3, wait=False)  # 16 x 0.5 s, +20 MB each
    wait_until(page, f"{RSS_JS} > {start + 80 * MB}", timeout_s=7)
    assert "[*]" in running.locator(".jp-InputArea-prompt").inner_text(), (
        "moved only after the cell"
    )
    wait_done(running)

    for index in (4, 5, 6):  # a named model, one held by Out[], one by a failed run's traceback
        run_cell(page, index)
    wait_until(page, "document.querySelector('[data-km=\"history\"]')?.dataset.cells >= 5")
    held = _figure(page, "rss")
    page.click('.jp-kerasmagic-panel [data-km="free"]')
    wait_until(
        page,
        "document.querySelector('[data-km=\"free-result\"]')?.dataset.phase === 'done'",
        timeout_s=60,
    )
    result = page.inner_text('[data-km="free-result"]')
    assert "Out[" in result and "the stored error" in result and "kept" in result, result
    after = _figure(page, "rss")
    assert after < held - 250 * MB, (held, after, result)
    assert page.get_attribute('[data-km="kernel"]', "data-pid") == str(pid)
    # The tiles show the state after the free (only `kept` is left), not the last cell's.
    assert panel.locator('[data-km="live-models"]').get_attribute("data-value") == "1"
    assert panel.locator('[data-km="functions"]').get_attribute("data-value") is not None
    assert "–" not in panel.locator(".jp-kerasmagic-facts").inner_text()
    bar = panel.locator('[data-km="rss"] [role="progressbar"]')
    top = int(bar.get_attribute("aria-valuemax"))
    assert int(bar.get_attribute("aria-valuenow")) == min(after, top)
    assert panel.locator('[data-km="free-result"]').get_attribute("aria-live") == "polite"
    status = page.locator(".jp-kerasmagic-status")
    assert (status.get_attribute("role"), status.get_attribute("tabindex")) == ("button", "0")
    shot = os.environ.get("KERASMAGIC_SCREENSHOT")
    if shot:
        page.screenshot(path=shot)

    # A kernel that does not answer: the panel gives up after the deadline and says so.
    run_cell(page, 7)
    page.click('.jp-kerasmagic-panel [data-km="free"]')
    wait_until(page, f"{FREE_PHASE_JS} === 'failed'", timeout_s=FREE_TIMEOUT_MS / 1000 + 30)
    assert "no answer from the kernel" in page.inner_text('[data-km="free-result"]')
    assert page.locator('.jp-kerasmagic-panel [data-km="free"]').is_enabled()

    # A restarted kernel has no kerasmagic: the panel says so; its button loads it there.
    page.click('.lm-MenuBar-itemLabel:text-is("Kernel")')
    for label in ("Show Kernel Memory", "Free Kernel Memory", "Load kerasmagic"):
        assert page.locator(f'.lm-Menu-itemLabel:text-is("{label}")').count() == 1, label
    page.click('.lm-Menu-itemLabel:text-is("Restart Kernel…")')
    page.click(".jp-Dialog .jp-mod-accept")
    wait_until(page, f"{STATUS_JS} === 'not-loaded'", timeout_s=60)
    page.click('.jp-kerasmagic-panel [data-km="load"]')
    wait_until(page, f"{STATUS_JS} === 'live'", timeout_s=60)
    new_pid = page.get_attribute('[data-km="kernel"]', "data-pid")
    assert new_pid and new_pid != str(pid)


def _activate(page: Any, name: str) -> Any:
    """Click the main-area tab of notebook ``name``; return its panel."""
    tab = page.locator(
        ".lm-DockPanel-tabBar .lm-TabBar-tab",
        has=page.locator(f'.lm-TabBar-tabLabel:text-is("{name}")'),
    )
    tab.click()
    page.wait_for_selector(f'.lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current:has-text("{name}")')
    return page.locator(f'[id="{tab.get_attribute("data-id")}"]')


FOLLOWS_JS = """([pid, path]) => {
  const panel = document.querySelector('.jp-kerasmagic-panel');
  const kernel = panel?.querySelector('[data-km="kernel"]');
  return panel?.dataset.status === 'live' && kernel?.dataset.pid === pid
    && kernel.textContent.startsWith(path);
}"""


def test_sidebar_follows_the_active_notebook(lab: Server, page: Any) -> None:
    names = ("one.ipynb", "two.ipynb")
    for name in names:
        write_notebook(lab.root, name, ["import os\nos.getpid()", "%load_ext kerasmagic"])
    page.goto(f"{lab.url}/lab/workspaces/two-notebooks/tree/one.ipynb")
    wait_for_kernel(page)
    page.dblclick('.jp-DirListing-item[title^="Name: two.ipynb"]')
    pids = {}
    for name in names:
        notebook = _activate(page, name)
        wait_for_kernel(page)
        out = run_cell(page, 0, scope=notebook).locator(".jp-OutputArea-output").inner_text()
        pids[name] = out.strip()
        run_cell(page, 1, scope=notebook)
    assert pids["one.ipynb"] != pids["two.ipynb"], pids

    show_sidebar(page)
    for name in (*names, *names):
        _activate(page, name)
        wait_until(page, FOLLOWS_JS, arg=[pids[name], name])
