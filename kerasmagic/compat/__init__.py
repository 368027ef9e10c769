"""What this environment turns off or lacks, said once in one line each.

``registry``: the private structures kerasmagic reaches, each probed where it runs. Here:
libraries older than kerasmagic is tested with, and a JupyterLab kernel whose kerasmagic was
installed without its sidebar. Read at ``%load_ext`` and when a framework is imported later;
nothing here imports a framework or touches NVML.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from kerasmagic.compat import registry
from kerasmagic.compat.registry import installed, say_once

__all__ = ["check_now", "notes_at_load", "say_once", "too_old", "unwatch", "watch"]

# (distribution, the module it imports as, the oldest version tested)
FLOORS: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("ipython", "IPython", (7, 34)), ("ipykernel", "ipykernel", (6, 17)),
    ("ipywidgets", "ipywidgets", (7, 7, 1)), ("traitlets", "traitlets", (5, 7, 1)),
    ("jupyter_client", "jupyter_client", (7, 4)), ("psutil", "psutil", (5, 9, 5)),
    ("tensorflow", "tensorflow", (2, 16)), ("keras", "keras", (3, 3)),
)  # fmt: skip
ONCE_IMPORTED = frozenset({"tensorflow", "keras"})  # checked once imported, never imported here


@dataclass(frozen=True)
class TooOld:
    """A library older than the oldest version kerasmagic is tested with."""

    distribution: str
    found: str
    floor: tuple[int, ...]

    @property
    def line(self) -> str:
        """Return the one line ``%load_ext`` prints for it."""
        name, floor = self.distribution, ".".join(map(str, self.floor))
        return (
            f"kerasmagic: {name} {self.found} is older than {floor}, the oldest kerasmagic is "
            f"tested with; some parts may fail: pip install '{name}>={floor}'"
        )


def parse(version: str) -> tuple[int, ...]:
    """Return the leading release numbers of ``version`` ("2.20.0rc1" -> (2, 20, 0))."""
    numbers = re.match(r"\d+(\.\d+)*", version.strip())
    return tuple(int(n) for n in numbers[0].split(".")) if numbers else ()


def too_old(
    frameworks: bool = False, version_of: Callable[[str, str], str | None] = installed
) -> list[TooOld]:
    """Return the Jupyter-side libraries older than their floor; with ``frameworks``, the
    imported TensorFlow and Keras too (a framework not imported is not looked at)."""
    return [
        TooOld(distribution, version, floor)
        for distribution, module, floor in FLOORS
        if distribution not in ONCE_IMPORTED or (frameworks and module in sys.modules)
        if (version := version_of(distribution, module)) is not None and parse(version) < floor
    ]


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
    if getattr(shell, "kernel", None) is None or hosted() or find_spec("jupyterlab") is None:
        return None  # no frontend, Colab's or Kaggle's (no JupyterLab there), or no JupyterLab
    paths = extension_paths() if paths is None else paths
    return None if not paths or sidebar_installed(paths) else LINE


FRAMEWORKS = ("tensorflow", "keras", "tf_keras", "jax", "torch")
_watching: list[Any] = []  # the post-import hook, while some shell has the extension loaded


def notes_at_load(shell: Any) -> list[str]:
    """Return the lines ``%load_ext`` says about this environment."""
    return _found(shell) + [line for line in (missing_sidebar(shell),) if line is not None]


def _found(shell: Any, finished: frozenset[str] = frozenset()) -> list[str]:
    """Return the lines for the libraries too old and the reaches newly found off."""
    lines = [old.line for old in too_old(frameworks=True)]
    return lines + [found.line for found in registry.check(shell, finished=finished)]


def check_now(shell: Any = None, finished: frozenset[str] = frozenset()) -> None:
    """Probe what was imported since the last check and say what is off (``reset()`` outside
    IPython, ``%gpu_mem``, and the post-import hook, for which ``finished`` frameworks are
    done importing although importlib still marks them as importing)."""
    say_once(_found(shell, finished))


def watch() -> None:
    """Check again each time a framework is imported (until ``unwatch``): once its code has
    run, though importlib still marks it as importing (a framework importing another is not)."""
    if not _watching:
        from kerasmagic.imports import AfterImport

        hook = AfterImport(FRAMEWORKS, lambda n: check_now(finished=frozenset({n})), named=True)
        hook.install()
        _watching.append(hook)


def unwatch() -> None:
    """Stop checking at framework imports."""
    while _watching:
        _watching.pop().uninstall()
