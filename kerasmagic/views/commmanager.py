"""Find the comm manager a frontend's comms reach, on every ipykernel kerasmagic supports.

ipykernel >= 6.18 hands its manager to the ``comm`` package, so ``comm.get_comm_manager()``
is the kernel's. ipykernel 6.17 (Colab's and Kaggle's) predates that package: its manager is
``kernel.comm_manager``, and on Kaggle, where ``comm`` is installed beside it, the package's
manager is a stand-in that no frontend message ever reaches. So the kernel's own manager comes
first; the ``comm`` package's serves a shell without a kernel (tests, a terminal IPython).
"""

from __future__ import annotations

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
