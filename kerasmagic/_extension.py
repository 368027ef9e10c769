"""Load and unload the IPython extension symmetrically."""

from __future__ import annotations

import sys
from typing import Any

from kerasmagic import tfstack

_loaded: dict[int, Any] = {}  # id(shell) -> KerasMagics instance


def load(shell: Any) -> None:
    """Register the magics (once per shell) and install the TF stack-trace patch if TF is up."""
    from kerasmagic.magics import KerasMagics

    if id(shell) in _loaded:
        return
    magics = KerasMagics(shell=shell)
    shell.register_magics(magics)
    _loaded[id(shell)] = magics
    if magics.patch_stack_traces and "tensorflow" in sys.modules:
        tfstack.install()


def unload(shell: Any) -> None:
    """Remove the magics and every patch; leave the user's namespace as it is."""
    magics = _loaded.pop(id(shell), None)
    if magics is None:
        return
    manager = shell.magics_manager
    for kind, names in magics.magics.items():
        for name in names:
            manager.magics[kind].pop(name, None)
    manager.registry.pop(type(magics).__name__, None)
    if not _loaded:
        tfstack.uninstall()


def is_loaded(shell: Any) -> bool:
    """Return True if the extension is loaded in ``shell``."""
    return id(shell) in _loaded
