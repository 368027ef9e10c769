"""Build the JupyterLab sidebar with the wheel when it can be built and loaded; else go without.

hatch-jupyter-builder calls :func:`build_sidebar` (``build-function`` in pyproject.toml) only
when the sidebar is not built yet: a git checkout, not an sdist (which ships it prebuilt).
Building it needs Node.js >= 18. Without Node.js, and on Colab or Kaggle (whose frontends load
no JupyterLab extension), the Python package installs alone: ``pip install git+...`` in a Colab
cell needs nothing but pip. pip hides a build's warnings, so a JupyterLab user whose kerasmagic
was built that way hears how to get the sidebar at ``%load_ext`` (``kerasmagic/sidebarcheck.py``).

:class:`SidebarDataHook` (hatchling's custom hook, this file) puts the built sidebar where
JupyterLab finds prebuilt extensions, and only when it was built.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

MIN_NODE = (18, 0)  # what JupyterLab 4.6's extension builder (webpack 5) needs
BUILT = "kerasmagic/labextension/static/style.js"
BUILT_DIR = "kerasmagic/labextension"
SHARE = "share/jupyter/labextensions/kerasmagic"
HOSTED = {"COLAB_RELEASE_TAG": "Colab", "KAGGLE_KERNEL_RUN_TYPE": "Kaggle"}  # set in their VMs
MESSAGE = (
    "kerasmagic: building without the JupyterLab sidebar: {problem}. For the sidebar, install "
    "Node.js >= {need} (https://nodejs.org/, or conda install nodejs) and run pip again."
)


def node_problem(path: str | None = None) -> str | None:
    """Return why Node.js on ``path`` (default: PATH) cannot build the sidebar, or None."""
    node = shutil.which("node", path=path)
    if node is None:
        return "Node.js (node) is not on PATH"
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{node} --version failed ({exc})"
    found = re.match(r"v?(\d+)\.(\d+)", out.stdout.strip())
    if out.returncode != 0 or found is None:
        return f"{node} --version failed ({(out.stderr or out.stdout).strip()[:200]})"
    if (int(found[1]), int(found[2])) < MIN_NODE:
        return f"Node.js {out.stdout.strip()} at {node} is too old"
    return None


def hosted_notebook() -> str | None:
    """Return "Colab" or "Kaggle" when building inside their runtime, else None."""
    return next((name for var, name in HOSTED.items() if os.environ.get(var)), None)


def build_sidebar(target_name: str, version: str, **kwargs: Any) -> None:
    """hatch-jupyter-builder's build function: build the sidebar, or say why not and go on."""
    host = hosted_notebook()
    if host is not None:
        warnings.warn(f"kerasmagic: no sidebar on {host} (no JupyterLab there)", stacklevel=1)
        return
    problem = node_problem()
    if problem is None:
        from hatch_jupyter_builder.utils import npm_builder

        npm_builder(target_name, version, **kwargs)
        return
    if version == "editable" and Path(BUILT).exists():
        warnings.warn(
            f"kerasmagic: sidebar not rebuilt ({problem}); keeping the last build", stacklevel=1
        )
        return
    warnings.warn(MESSAGE.format(problem=problem, need=MIN_NODE[0]), stacklevel=1)


class SidebarDataHook(BuildHookInterface):  # type: ignore[type-arg]
    """Install the built sidebar as JupyterLab's prebuilt extension; nothing when unbuilt."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Map the built folder and install.json into the wheel's data, if the sidebar exists."""
        if self.target_name != "wheel" or not Path(self.root, BUILT).exists():
            return
        build_data["shared_data"][BUILT_DIR] = SHARE
        build_data["shared_data"]["labextension/install.json"] = f"{SHARE}/install.json"
