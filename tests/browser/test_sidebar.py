"""The sidebar in a real JupyterLab, driven in headless Debian Chromium by Python Playwright.

Skips (unless ``KERASMAGIC_REQUIRE_BROWSER=1``, as in ``.ci/browser.sh``) when Chromium,
Playwright, JupyterLab or the built sidebar are missing. ``KERASMAGIC_SCREENSHOT=path`` saves
the final screenshot there (``docs/sidebar.png`` for the README).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("KERASMAGIC_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MB = 2**20
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
]


def _missing() -> str | None:
    try:
        import jupyterlab  # noqa: F401
        import playwright.sync_api  # noqa: F401
        from jupyter_core.paths import jupyter_path
    except ImportError as exc:
        return f"needs playwright and jupyterlab: {exc}"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if not any(
        (Path(p) / "kerasmagic" / "package.json").exists() for p in jupyter_path("labextensions")
    ):
        return "the kerasmagic sidebar is not installed (pip install . builds it)"
    return None


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start JupyterLab on 127.0.0.1 with throw-away Jupyter/IPython dirs; yield its URL."""
    why = _missing()
    if why is not None:
        if os.environ.get("KERASMAGIC_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("lab")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        (tmp / var).mkdir()
        env[var] = str(tmp / var)
    labconfig = tmp / "JUPYTER_CONFIG_DIR" / "labconfig"
    labconfig.mkdir()
    off = {"@jupyterlab/apputils-extension:announcements": True}  # its toast covers the page
    (labconfig / "page_config.json").write_text(json.dumps({"disabledExtensions": off}))
    root = tmp / "notebooks"
    root.mkdir()
    cells = [
        {"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None}
        for s in CELLS
    ]
    notebook = {
        "cells": cells,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (root / "sidebar.ipynb").write_text(json.dumps(notebook))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp / "lab.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--allow-root",
            f"--port={port}",
            "--ServerApp.ip=127.0.0.1",
            "--IdentityProvider.token=",
            "--ServerApp.password=",
            f"--ServerApp.root_dir={root}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_http(f"{url}/api/status", server, tmp / "lab.log")
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _wait_for_http(url: str, server: subprocess.Popen[Any], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"jupyter lab exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"jupyter lab did not answer at {url}:\n{log.read_text()[-3000:]}")


def _figure(page: Any, key: str) -> int:
    return int(page.get_attribute(f'.jp-kerasmagic-panel [data-km="{key}"]', "data-bytes"))


def _run_cell(page: Any, index: int, wait: bool = True, timeout_s: float = 90) -> Any:
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    if wait:
        _wait_done(cell, timeout_s)
    return cell


def _wait_done(cell: Any, timeout_s: float = 90) -> None:
    prompt = cell.locator(".jp-InputArea-prompt")
    deadline = time.monotonic() + timeout_s
    while not re.search(r"\[\d+\]", prompt.inner_text()):
        assert time.monotonic() < deadline, f"cell still running: {prompt.inner_text()!r}"
        time.sleep(0.2)


def _wait_until(page: Any, js: str, arg: Any = None, timeout_s: float = 30) -> None:
    page.wait_for_function(js, arg=arg, timeout=timeout_s * 1000, polling=200)


STATUS_JS = "document.querySelector('.jp-kerasmagic-panel')?.dataset.status"
RSS_JS = "Number(document.querySelector('.jp-kerasmagic-panel [data-km=\"rss\"]')?.dataset.bytes)"


def test_sidebar_follows_the_kernel_and_frees_memory(lab: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            _drive(page, lab)
        finally:
            browser.close()


def _drive(page: Any, lab: str) -> None:
    page.goto(f"{lab}/lab/tree/sidebar.ipynb")
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=60000)
    page.click('.jp-SideBar .lm-TabBar-tab[data-id="kerasmagic-memory"]')
    panel = page.locator(".jp-kerasmagic-panel")
    _wait_until(
        page, "document.querySelector('.jp-kerasmagic-panel')?.dataset.status === 'not-loaded'"
    )
    assert panel.locator('[data-km="load"]').is_visible()  # says so and offers the button

    out = _run_cell(page, 0).locator(".jp-OutputArea-output").inner_text()
    pid = int(out.strip())
    _run_cell(page, 1)  # %load_ext kerasmagic: the sidebar connects by itself
    _wait_until(page, "document.querySelector('.jp-kerasmagic-panel')?.dataset.status === 'live'")
    assert page.get_attribute('[data-km="kernel"]', "data-pid") == str(pid)
    status_text = page.inner_text(".jp-kerasmagic-status")
    assert status_text.startswith(("RSS ", "VRAM "))

    before = _figure(page, "rss")
    _run_cell(page, 2)  # +300 MB
    _wait_until(page, f"{RSS_JS} > {before + 250 * MB}")

    start = _figure(page, "rss")
    running = _run_cell(page, 3, wait=False)  # 16 x 0.5 s, +20 MB each
    _wait_until(page, f"{RSS_JS} > {start + 80 * MB}", timeout_s=7)
    assert "[*]" in running.locator(".jp-InputArea-prompt").inner_text(), (
        "moved only after the cell"
    )
    _wait_done(running)

    for index in (4, 5, 6):  # a named model, one held by Out[], one by a failed run's traceback
        _run_cell(page, index)
    _wait_until(page, "document.querySelector('[data-km=\"history\"]')?.dataset.cells >= 5")
    held = _figure(page, "rss")
    page.click('.jp-kerasmagic-panel [data-km="free"]')
    _wait_until(
        page,
        "document.querySelector('[data-km=\"free-result\"]')?.dataset.phase === 'done'",
        timeout_s=60,
    )
    result = page.inner_text('[data-km="free-result"]')
    assert "Out[" in result and "sys.last_" in result and "kept" in result, result
    after = _figure(page, "rss")
    assert after < held - 250 * MB, (held, after, result)
    assert page.get_attribute('[data-km="kernel"]', "data-pid") == str(pid)
    shot = os.environ.get("KERASMAGIC_SCREENSHOT")
    if shot:
        page.screenshot(path=shot)

    # A restarted kernel has no kerasmagic: the panel says so; its button loads it there.
    page.click('.lm-MenuBar-itemLabel:text-is("Kernel")')
    page.click('.lm-Menu-itemLabel:text-is("Restart Kernel…")')
    page.click(".jp-Dialog .jp-mod-accept")
    _wait_until(page, f"{STATUS_JS} === 'not-loaded'", timeout_s=60)
    page.click('.jp-kerasmagic-panel [data-km="load"]')
    _wait_until(page, f"{STATUS_JS} === 'live'", timeout_s=60)
    new_pid = page.get_attribute('[data-km="kernel"]', "data-pid")
    assert new_pid and new_pid != str(pid)
