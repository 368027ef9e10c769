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

import ctypes
import functools
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MAX_MB = 32  # glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
ENV_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")  # the user's own choice, if set

_pinned_mb: int | None = None


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """Return the C library this process runs on (Linux), once."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None)  # the process's own symbols: libc's malloc is among them
    except OSError:
        return None


def malloc_trim() -> None:
    """Hand freed heap pages back to the OS (glibc), so RSS shows what was freed."""
    trim = getattr(_libc(), "malloc_trim", None)  # musl and others lack it
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        trim(0)


def _set_by_environment() -> bool:
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return "MALLOC_MMAP_THRESHOLD_" in os.environ or "glibc.malloc." in tunables


def pin_mmap_threshold(megabytes: int) -> str:
    """Pin glibc's mmap threshold at ``megabytes`` MiB (0: leave it); return what was done."""
    global _pinned_mb
    if not 0 <= megabytes <= MAX_MB:
        raise ValueError(f"mmap threshold must be 0 to {MAX_MB} MiB, not {megabytes}")
    if megabytes == 0:
        return "glibc's mmap threshold left dynamic"
    if _set_by_environment():
        return "glibc's malloc is configured by the environment: left as it is"
    if _pinned_mb == megabytes:
        return f"glibc's mmap threshold pinned at {megabytes} MiB"
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return "not glibc: the allocator is left as it is"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not mallopt(M_MMAP_THRESHOLD, megabytes * 2**20):
        return f"glibc refused an mmap threshold of {megabytes} MiB"
    _pinned_mb = megabytes
    return f"glibc's mmap threshold pinned at {megabytes} MiB"


def pinned_mb() -> int | None:
    """Return the threshold kerasmagic pinned in this process, in MiB, or None."""
    return _pinned_mb
