"""The oldest version of each library kerasmagic is tested with, and the line for an older one.

The floors are Colab's and Kaggle's pins for Jupyter's side (IPython 7.34, ipykernel 6.17.1,
ipywidgets 7.7.1, traitlets 5.7.1, jupyter_client 7.4.9, psutil 5.9.5) and the oldest
TensorFlow and Keras CI runs. pip keeps kerasmagic's own requirements; ipykernel, jupyter_client
and the frameworks come from the user's environment, so ``%load_ext`` checks them (and the
frameworks once imported) and says in one line what is older than tested. Nothing is imported
to read a version: a module already imported, else the installed distribution's metadata.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

# (distribution, the module it imports as, the oldest version tested)
FLOORS: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("ipython", "IPython", (7, 34)),
    ("ipykernel", "ipykernel", (6, 17)),
    ("ipywidgets", "ipywidgets", (7, 7, 1)),
    ("traitlets", "traitlets", (5, 7, 1)),
    ("jupyter_client", "jupyter_client", (7, 4)),
    ("psutil", "psutil", (5, 9, 5)),
    ("tensorflow", "tensorflow", (2, 16)),
    ("keras", "keras", (3, 3)),
)
FRAMEWORKS = frozenset({"tensorflow", "keras"})  # checked once imported, never imported here


@dataclass(frozen=True)
class TooOld:
    """A library older than the oldest version kerasmagic is tested with."""

    distribution: str
    found: str
    floor: tuple[int, ...]

    @property
    def line(self) -> str:
        """Return the one line ``%load_ext`` prints for it."""
        floor = ".".join(map(str, self.floor))
        return (
            f"kerasmagic: {self.distribution} {self.found} is older than {floor}, the oldest "
            f"kerasmagic is tested with; some parts may fail: pip install '{self.distribution}"
            f">={floor}'"
        )


def parse(version: str) -> tuple[int, ...]:
    """Return the leading release numbers of ``version`` ("2.20.0rc1" -> (2, 20, 0))."""
    numbers = re.match(r"\d+(\.\d+)*", version.strip())
    return tuple(int(n) for n in numbers[0].split(".")) if numbers else ()


def installed(distribution: str, module: str) -> str | None:
    """Return the version of ``module`` if imported, else of the installed distribution."""
    loaded = getattr(sys.modules.get(module), "__version__", None)
    if isinstance(loaded, str):
        return loaded
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def too_old(
    frameworks: bool = False, version_of: Callable[[str, str], str | None] = installed
) -> list[TooOld]:
    """Return the Jupyter-side libraries older than their floor; with ``frameworks``, the
    imported TensorFlow and Keras too (a framework not imported is not looked at)."""
    found = []
    for distribution, module, floor in FLOORS:
        if distribution in FRAMEWORKS and (not frameworks or module not in sys.modules):
            continue
        version = version_of(distribution, module)
        if version is not None and parse(version) < floor:
            found.append(TooOld(distribution, version, floor))
    return found
