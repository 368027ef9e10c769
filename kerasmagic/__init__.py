"""kerasmagic: memory-safe Keras/TensorFlow model iteration in Jupyter.

``%load_ext kerasmagic`` registers ``%%fresh_model`` and ``%gpu_mem``. The plain-Python API
(``reset``, ``fresh``, ``take_snapshot``) serves scripts and search loops. Importing this
package touches neither TensorFlow nor NVML; every part loads on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kerasmagic._version import __version__

if TYPE_CHECKING:
    from kerasmagic.cleanup import CleanupReport, fresh, reset
    from kerasmagic.cleanup.holders import live_models
    from kerasmagic.isolate.api import isolated, run_isolated, sweep
    from kerasmagic.live import history
    from kerasmagic.oom.batch import FitPrediction, find_batch_size, predict_fit
    from kerasmagic.snapshot import MemorySnapshot, diff, take_snapshot

_LAZY = {  # public name -> the module that defines it, imported on first use
    name: module
    for module, names in {
        "kerasmagic.cleanup": "reset fresh CleanupReport",
        "kerasmagic.snapshot": "take_snapshot MemorySnapshot diff",
        "kerasmagic.isolate.api": "run_isolated isolated sweep",
        "kerasmagic.cleanup.holders": "live_models",
        "kerasmagic.live": "history",
        "kerasmagic.oom.batch": "find_batch_size predict_fit FitPrediction",
    }.items()
    for name in names.split()
}

__all__ = [
    "CleanupReport",
    "FitPrediction",
    "MemorySnapshot",
    "__version__",
    "diff",
    "find_batch_size",
    "fresh",
    "history",
    "isolated",
    "live_models",
    "load_ipython_extension",
    "predict_fit",
    "reset",
    "run_isolated",
    "sweep",
    "take_snapshot",
    "unload_ipython_extension",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kerasmagic' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext kerasmagic``: register the magics."""
    from kerasmagic._extension import load

    load(ipython)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Tell ``jupyter labextension develop`` where the built sidebar lives."""
    return [{"src": "labextension", "dest": "kerasmagic"}]


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext kerasmagic``: remove everything ``load_ipython_extension`` added."""
    from kerasmagic._extension import unload

    unload(ipython)
