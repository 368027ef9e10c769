"""Find the comm manager a frontend's comms reach, on every ipykernel kerasmagic supports.

ipykernel >= 6.18 hands its manager to the ``comm`` package, so ``comm.get_comm_manager()``
is the kernel's. ipykernel 6.17 (Colab's and Kaggle's) predates that package: its manager is
``kernel.comm_manager``, and on Kaggle, where ``comm`` is installed beside it, the package's
manager is a stand-in that no frontend message ever reaches. So the kernel's own manager comes
first; the ``comm`` package's serves a shell without a kernel (tests, a terminal IPython).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any


def comm_manager(shell: Any) -> Any | None:
    """Return the comm manager of ``shell``'s kernel, else the ``comm`` package's, else None."""
    manager = getattr(getattr(shell, "kernel", None), "comm_manager", None)
    if manager is not None:
        return manager
    try:
        import comm
    except ImportError:  # ipykernel 6.17 without the comm package, and no kernel: no comms
        return None
    return comm.get_comm_manager()


def open_comm(shell: Any, target: str, data: dict[str, Any]) -> Any | None:
    """Open a comm from the kernel to the frontend's ``target``, with ``data``; None without a
    kernel. Through the ``comm`` package where the kernel handed it its manager, else with
    ipykernel 6.17's own class (on Kaggle the package's would reach no frontend)."""
    kernel = getattr(shell, "kernel", None)
    manager = getattr(kernel, "comm_manager", None)
    if kernel is None or manager is None:
        return None
    package: Any = sys.modules.get("comm")
    if package is None and importlib.util.find_spec("comm") is not None:
        import comm as package
    if package is not None and package.get_comm_manager() is manager:
        return package.create_comm(target_name=target, data=data)
    from ipykernel.comm import Comm

    return Comm(target_name=target, data=data, kernel=kernel)  # type: ignore[no-untyped-call]


def sent_by_jupyterlab(kernel: Any) -> bool:
    """Return whether the request the kernel is handling came from a JupyterLab-family frontend
    (JupyterLab, Notebook 7): they send the cell's ``cellId`` with it. Classic Notebook and
    Colab do not, and log an error for a comm whose target they do not know."""
    try:
        parent = kernel.get_parent("shell")
    except Exception:  # an ipykernel without per-channel parents
        return False
    metadata = parent.get("metadata") if isinstance(parent, dict) else None
    return isinstance(metadata, dict) and isinstance(metadata.get("cellId"), str)
