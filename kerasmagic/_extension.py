"""Load and unload the IPython extension symmetrically.

Optional parts (the live monitor, the sidebar comm) are modules listed in ``PARTS``; each has
``load(shell, magics)`` and ``unload(shell)`` and is imported only when the extension loads.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from kerasmagic.backends.tensorflow import stack as tfstack
from kerasmagic.cells.runner import RUNNERS
from kerasmagic.native.heap import pin_mmap_threshold

PARTS: tuple[str, ...] = (
    "kerasmagic.live",
    "kerasmagic.views.comm",
    "kerasmagic.oom",
    "kerasmagic.cleanup.loops",
    "kerasmagic.cells.awaiting",
    "kerasmagic.interrupts.lost",
    "kerasmagic.interrupts.gradmode",
    "kerasmagic.interrupts.kernelguard",  # last: its callbacks run after the other parts'
)
log = logging.getLogger(__name__)
_loaded: dict[int, Any] = {}  # id(shell) -> KerasMagics instance


def load(shell: Any) -> None:
    """Register the magics and parts (once per shell); patch TF stack traces if TF is up."""
    from kerasmagic.magics import KerasMagics

    if id(shell) in _loaded:
        return
    magics = KerasMagics(shell=shell)
    shell.register_magics(magics)
    _loaded[id(shell)] = magics
    for part in PARTS:
        importlib.import_module(part).load(shell, magics)
    for runner in (*RUNNERS, getattr(type(shell), "run_code", None)):
        code = getattr(runner, "__code__", None)
        if code is not None:
            tfstack.stop_at(code)  # op stack traces end at the cell, not the kernel above it
    if magics.patch_stack_traces and "tensorflow" in sys.modules:
        tfstack.install()
    said = pin_mmap_threshold(magics.mmap_threshold_mb)  # big freed blocks go back to the OS
    if "refused" in said:
        log.warning("kerasmagic: %s", said)


def unload(shell: Any) -> None:
    """Remove the magics, the parts and every patch; leave the user's namespace as it is."""
    magics = _loaded.pop(id(shell), None)
    if magics is None:
        return
    for part in reversed(PARTS):
        importlib.import_module(part).unload(shell)
    manager = shell.magics_manager
    for kind, names in magics.magics.items():
        for name in names:
            manager.magics[kind].pop(name, None)
    manager.registry.pop(type(magics).__name__, None)
    configurables = getattr(shell, "configurables", [])  # Magics.__init__ appended it there
    if magics in configurables:
        configurables.remove(magics)
    if not _loaded:
        tfstack.uninstall()
        if "kerasmagic.probes.nvml" in sys.modules:  # never imported: nothing to stop
            sys.modules["kerasmagic.probes.nvml"].stop()


def magics_for(shell: Any) -> Any | None:
    """Return the loaded KerasMagics of ``shell``, or None if the extension is not loaded."""
    return _loaded.get(id(shell))
