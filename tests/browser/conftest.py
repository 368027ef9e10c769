"""A real JupyterLab (or Notebook 7) server and headless Debian Chromium for the browser tests.

Both are started once per session. Tests write their notebooks into ``server.root`` and open
them in a workspace of their own (``/lab/workspaces/<name>/tree/...``) so no test inherits
another's open tabs. Everything skips (or fails, with ``KERASMAGIC_REQUIRE_BROWSER=1``) when
Chromium, Playwright, JupyterLab or the built sidebar are missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

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
FREE_TIMEOUT_MS = 15000  # shorter than the sidebar's 60 s default, so a test can wait for it
# The toolbar's execution indicator says "idle" before the kernel even starts, and a cell run
# before the kernel is there opens the "Select Kernel" dialog (seen on a loaded machine), so wait
# for the current notebook's own kernel.
KERNEL_READY_JS = """() => {
  const kernel = window.jupyterapp?.shell?.currentWidget?.sessionContext?.session?.kernel;
  return kernel?.connectionStatus === 'connected' && kernel.status === 'idle';
}"""


def missing() -> str | None:
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


def require(why: str | None) -> None:
    """Skip (or fail, under ``KERASMAGIC_REQUIRE_BROWSER=1``) when ``why`` says what is missing."""
    if why is None:
        return
    if os.environ.get("KERASMAGIC_REQUIRE_BROWSER") == "1":
        pytest.fail(why)
    pytest.skip(why)


@dataclass
class Server:
    url: str
    root: Path


def write_notebook(root: Path, name: str, cells: list[str]) -> None:
    """Write a Python 3 notebook of code cells (not run) to ``root / name``."""
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None}
    notebook = {
        "cells": [{**cell, "source": s} for s in cells],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (root / name).write_text(json.dumps(notebook))


@contextlib.contextmanager
def serve(tmp: Path, app: str = "lab", python: str = sys.executable) -> Iterator[Server]:
    """Run ``jupyter <app>`` on 127.0.0.1 with throw-away Jupyter/IPython dirs; ``app``
    "classic" is Notebook 6 (Colab's frontend is closest to it), run by ``python``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        (tmp / var).mkdir()
        env[var] = str(tmp / var)
    labconfig = tmp / "JUPYTER_CONFIG_DIR" / "labconfig"
    labconfig.mkdir()
    off = {"@jupyterlab/apputils-extension:announcements": True}  # its toast covers the page
    config = {
        "disabledExtensions": off,
        "exposeAppInBrowser": True,  # window.jupyterapp
        "kerasmagicFreeTimeoutMs": FREE_TIMEOUT_MS,  # the sidebar's "Free memory" deadline
    }
    (labconfig / "page_config.json").write_text(json.dumps(config))
    root = tmp / "notebooks"
    root.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp / f"{app}.log"
    log = log_path.open("w")
    if app == "classic":
        access = ["--NotebookApp.token=", "--NotebookApp.password=", f"--notebook-dir={root}"]
        command = [python, "-m", "notebook", "--ip=127.0.0.1", *access]
    else:
        access = ["--IdentityProvider.token=", "--ServerApp.password="]
        command = [python, "-m", "jupyter", app, "--ServerApp.ip=127.0.0.1", *access]
        command.append(f"--ServerApp.root_dir={root}")
    server = subprocess.Popen(
        [*command, "--no-browser", "--allow-root", f"--port={port}"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_http(f"{url}/api/status", server, log_path)
        yield Server(url, root)
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
            raise RuntimeError(f"jupyter exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"jupyter did not answer at {url}:\n{log.read_text()[-3000:]}")


# Package scope: Playwright's sync API keeps an event loop running in the main thread while it
# is open, which breaks every later test that runs a loop (top-level await, comms) in the same
# pytest session; it stops when the browser tests end.
@pytest.fixture(scope="package")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One JupyterLab for the browser tests."""
    require(missing())
    with serve(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium, driven by Python Playwright."""
    require(missing())
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _foreign(error: Any) -> bool:
    """Return True for the one known error of Notebook 7's own code, not of kerasmagic.

    Notebook 7.6's ``notebook_core`` bundle throws "reading 'schema'" while loading settings on
    every page load, with the kerasmagic extension disabled too (checked by hand).
    """
    return "reading 'schema'" in str(error) and "/static/notebook/notebook_core." in (
        getattr(error, "stack", "") or ""
    )


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page (own browser context) for one test; fails if the page logged an error."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("console", lambda m: m.type == "error" and errors.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: _foreign(e) or errors.append(f"uncaught: {e}"))
        yield page
    finally:
        context.close()
    assert errors == [], "the page logged errors:\n" + "\n".join(errors)


def run_cell(
    page: Any, index: int, wait: bool = True, timeout_s: float = 90, scope: Any = None
) -> Any:
    """Run the ``index``-th cell (of the notebook in ``scope``, else the page's) with Ctrl+Enter."""
    cell = (scope or page).locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    if wait:
        wait_done(cell, timeout_s)
    return cell


def wait_done(cell: Any, timeout_s: float = 90) -> None:
    """Wait until the cell's prompt shows an execution count."""
    prompt = cell.locator(".jp-InputArea-prompt")
    deadline = time.monotonic() + timeout_s
    while not re.search(r"\[\d+\]", prompt.inner_text()):
        assert time.monotonic() < deadline, f"cell still running: {prompt.inner_text()!r}"
        time.sleep(0.2)


def wait_until(page: Any, js: str, arg: Any = None, timeout_s: float = 30) -> None:
    """Wait until the JavaScript expression ``js`` is truthy in the page."""
    page.wait_for_function(js, arg=arg, timeout=timeout_s * 1000, polling=200)


def show_sidebar(page: Any) -> None:
    """Show the memory panel: JupyterLab opens it on the right at start (a click on its tab
    then would close it); Notebook 7 and a saved layout may not."""
    panel = page.locator("#kerasmagic-memory")
    if not panel.is_visible():
        page.click('.jp-SideBar .lm-TabBar-tab[data-id="kerasmagic-memory"]')
    panel.wait_for(state="visible", timeout=10000)


def wait_for_kernel(page: Any, timeout_s: float = 90) -> None:
    """Wait until the current notebook's kernel is connected and idle."""
    wait_until(page, KERNEL_READY_JS, timeout_s=timeout_s)
