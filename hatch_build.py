"""Build the JupyterLab sidebar when a wheel is built, or say in one line why it cannot be.

hatch-jupyter-builder calls :func:`build_sidebar` (``build-function`` in pyproject.toml) only
when the sidebar is not built yet: a git checkout, not an sdist (which ships it prebuilt).
Building it needs Node.js; without it, ``jlpm`` used to fail deep in a traceback with "Please
install Node.js and npm before continuing installation", and an editable install went on
silently without the sidebar (pip hides a successful build's warnings). Both now stop with one
line that names the two ways on: install Node.js, or ``SKIP_JUPYTER_BUILDER=1`` to install the
Python package alone. An editable install that already has a built sidebar keeps it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

MIN_NODE = (18, 0)  # what JupyterLab 4.6's extension builder (webpack 5) needs
BUILT = "kerasmagic/labextension/static/style.js"
MESSAGE = (
    "kerasmagic: the JupyterLab sidebar cannot be built: {problem}. Install Node.js >= {need} "
    "(https://nodejs.org/, or conda install nodejs) and run pip again, or run it with "
    "SKIP_JUPYTER_BUILDER=1 to install kerasmagic without the sidebar."
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


def build_sidebar(target_name: str, version: str, **kwargs: Any) -> None:
    """hatch-jupyter-builder's build function: check Node.js, then run its ``npm_builder``."""
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
    # SystemExit, not an exception: pip then shows this one line instead of a traceback.
    raise SystemExit(MESSAGE.format(problem=problem, need=MIN_NODE[0]))
