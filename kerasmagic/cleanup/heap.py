"""glibc's heap: hand freed pages back to the OS, and keep big blocks off the heap.

glibc serves a block of at least its mmap threshold (128 KiB at start) with its own ``mmap``,
returned to the OS when freed. But the threshold is dynamic: each freed mmapped block raises it
to that block's size (up to 32 MiB), so after the first big tensor is freed, blocks of a few MiB
land on the heap, and a heap only shrinks from its top. Re-run model cells then grow RSS in
steps the allocator keeps (``benchmarks/notebook_patterns.py``, a ``tf.data`` pipeline: 0.14 MB
per re-run while malloc's in-use bytes stay flat). Pinning the threshold at a few MiB keeps
blocks above it on ``mmap`` (0.03 MB per re-run) at no fit-time cost measured here; blocks
below it (batches, activations) still come from the heap, at heap speed. glibc has no call that
restores its dynamic mode, so a pin outlives ``%unload_ext``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
ENV_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")  # the user's own choice, if set

_pinned_mb: int | None = None


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def malloc_trim() -> None:
    """Hand freed heap pages back to the OS (glibc), so RSS shows what was freed."""
    libc = _libc()
    with contextlib.suppress(AttributeError):  # musl and others lack malloc_trim
        if libc is not None:
            libc.malloc_trim(0)


def pin_mmap_threshold(megabytes: int) -> str:
    """Pin glibc's mmap threshold at ``megabytes`` MiB (0: leave it); return what was done."""
    global _pinned_mb
    if megabytes <= 0:
        return "glibc's mmap threshold left dynamic"
    if any(name in os.environ for name in ENV_SETTINGS):
        return "glibc's malloc is configured by the environment: left as it is"
    if _pinned_mb == megabytes:
        return f"glibc's mmap threshold pinned at {megabytes} MiB"
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return "not glibc: the allocator is left as it is"
    if not mallopt(M_MMAP_THRESHOLD, megabytes * 2**20):
        return f"glibc refused an mmap threshold of {megabytes} MiB"
    _pinned_mb = megabytes
    return f"glibc's mmap threshold pinned at {megabytes} MiB"


def pinned_mb() -> int | None:
    """Return the threshold kerasmagic pinned in this process, in MiB, or None."""
    return _pinned_mb
