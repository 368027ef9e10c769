"""Tell a JupyterLab user whose kerasmagic was installed without the sidebar how to get it.

``pip install`` from a git checkout without Node.js (and on Colab or Kaggle) installs the Python
package alone, and pip hides the build's warning. So ``%load_ext`` says it, once, where a
JupyterLab could show the sidebar: a kernel whose environment has JupyterLab, not on Colab or
Kaggle (their frontends load no JupyterLab extension), and no installed sidebar on Jupyter's
data path.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

HOSTED = ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE")  # set in Colab's and Kaggle's VMs
LINE = (
    "kerasmagic: the JupyterLab sidebar is not installed (this kerasmagic was built without "
    "Node.js); to get it, install Node.js >= 18 and run the same pip install again"
)


def hosted() -> bool:
    """Return whether this runs on Colab or Kaggle."""
    return any(os.environ.get(name) for name in HOSTED)


def extension_paths() -> list[str]:
    """Return Jupyter's data folders for JupyterLab extensions (none without jupyter_core)."""
    try:
        from jupyter_core.paths import jupyter_path
    except ImportError:  # no Jupyter here: no JupyterLab to show it either
        return []
    return list(jupyter_path("labextensions"))


def sidebar_installed(paths: list[str] | None = None) -> bool:
    """Return whether the built sidebar is on ``paths`` (default: Jupyter's labextension
    folders)."""
    paths = extension_paths() if paths is None else paths
    return any(Path(p, "kerasmagic", "package.json").exists() for p in paths)


def missing_sidebar(shell: Any, paths: list[str] | None = None) -> str | None:
    """Return the line for a kernel a JupyterLab could show the sidebar in, if the sidebar is
    on none of ``paths`` (default: Jupyter's labextension folders)."""
    if getattr(shell, "kernel", None) is None or hosted():
        return None
    if importlib.util.find_spec("jupyterlab") is None:
        return None
    paths = extension_paths() if paths is None else paths
    return None if not paths or sidebar_installed(paths) else LINE
