"""Pure, typed memory probes: each returns a frozen dataclass and never raises for "absent".

What is measured whatever the backend: this process's RAM (psutil), NVML's GPUs (``nvml``),
Keras's state (its name counter, the live models) and the namespace's largest data. Backend
internals (TensorFlow's allocator and graphs, JAX, PyTorch) are in ``kerasmagic.backends``.
No probe imports IPython, TensorFlow or NVML at import time.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

import psutil

from kerasmagic.compat.registry import works
from kerasmagic.probes.nvml import GpuDevice, GpuInfo, read_gpus
from kerasmagic.walk import count_models, items_of, model_types, scan_order

__all__ = [
    "GpuDevice",
    "GpuInfo",
    "KerasInfo",
    "RamInfo",
    "Variable",
    "largest_variables",
    "read_gpus",
    "read_keras",
    "read_ram",
]


# -- this process's RAM ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RamInfo:
    """Resident memory of this process and of the host, in bytes."""

    rss_bytes: int
    peak_rss_bytes: int | None
    total_bytes: int
    available_bytes: int


def _peak_rss_bytes() -> int | None:
    """Return the process's peak resident set size, or None where unknown."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB, macOS bytes


HOST_TTL_S = 1.0  # host totals change slowly; /proc/meminfo costs ~0.1 ms per read
_host: tuple[float, int, int] = (float("-inf"), 0, 0)  # (read at, total, available)
_process: psutil.Process | None = None  # cached: creating one reads /proc (~0.3 ms)


def ram_info(rss_bytes: int, peak_rss_bytes: int | None, total: int, available: int) -> RamInfo:
    """Return a reading whose peak is never below its RSS.

    Linux keeps the peak (``ru_maxrss``) from RSS counters it syncs lazily (per thread, per
    CPU), so it can read a little below the RSS ``/proc`` gives a moment earlier (800.6 MB
    against 800.8 MB): the RSS just read is then the peak.
    """
    peak = None if peak_rss_bytes is None else max(peak_rss_bytes, rss_bytes)
    return RamInfo(rss_bytes, peak, total, available)


def read_ram() -> RamInfo:
    """Return this process's RSS and peak, and the host's total and available memory."""
    global _process, _host
    if _process is None or _process.pid != os.getpid():  # new after a fork
        _process = psutil.Process()
    rss = int(_process.memory_info().rss)
    if (now := time.monotonic()) - _host[0] > HOST_TTL_S:
        vm = psutil.virtual_memory()
        _host = (now, int(vm.total), int(vm.available))
    return ram_info(rss, _peak_rss_bytes(), *_host[1:])


# -- Keras's state ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class KerasInfo:
    """Whether Keras is imported, its auto-name counter, and the live models named in the
    notebook (``walk.state.count_models``: the subset of every live model that is cheap to count
    after each cell; the deep scan counts them all)."""

    imported: bool
    name_counter: int | None
    live_models: int | None  # named in the notebook: every view labels it so


def name_counter() -> int | None:
    """Return the total of Keras's auto-name counters (``dense_57`` makes it grow).

    Keras 3 keeps them in its global state; legacy tf-keras per graph, in
    ``tf_keras.src.backend.PER_GRAPH_OBJECT_NAME_UIDS`` (a weak dict graph -> counters).
    """
    counts: list[int] = []
    state = sys.modules.get("keras.src.backend.common.global_state")
    if state is not None and works("keras.global_state") and works("keras.name_uids"):
        counts.append(int(sum((state.get_global_attribute("object_name_uids") or {}).values())))
    legacy = getattr(sys.modules.get("tf_keras.src.backend"), "PER_GRAPH_OBJECT_NAME_UIDS", None)
    if legacy is not None and works("tf_keras.name_uids"):
        # A copy of the graphs' counters: graphs may be collected meanwhile.
        counts.append(sum(int(sum(uids.values())) for uids in list(legacy.values())))
    return sum(counts) if counts else None


def read_keras(namespace: Mapping[str, Any] | None) -> KerasInfo:
    """Return Keras's state; models are counted only when a namespace is given."""
    if not model_types():
        return KerasInfo(imported=False, name_counter=None, live_models=None)
    return KerasInfo(True, name_counter(), None if namespace is None else count_models(namespace))


# -- the namespace's largest data ------------------------------------------------------------------
ITEMS_SIZED = 10_000  # items of one list/dict summed before the rest is extrapolated


@dataclass(frozen=True)
class Variable:
    """One namespace name, its type, and the bytes its data takes (an array's buffer...)."""

    name: str
    type: str
    size_bytes: int


def _array_bytes(obj: Any) -> int | None:
    kind = type(obj)
    module, name = kind.__module__.partition(".")[0], kind.__name__
    ndarray = getattr(sys.modules.get("numpy"), "ndarray", ())  # () matches no type
    if issubclass(kind, ndarray) or (module in ("jax", "jaxlib") and hasattr(kind, "nbytes")):
        return int(obj.nbytes)
    if module == "pandas" and name in ("DataFrame", "Series"):
        usage = obj.memory_usage(index=True, deep=False)
        return int(usage.sum() if name == "DataFrame" else usage)
    if module in ("tensorflow", "keras") and hasattr(kind, "dtype"):
        return None if (n := obj.shape.num_elements()) is None else int(n * obj.dtype.size)
    if module == "torch" and name in ("Tensor", "Parameter"):
        return int(obj.element_size() * obj.nelement())
    return sys.getsizeof(obj) if kind in (bytes, bytearray, str) else None


def size_bytes(obj: Any, depth: int = 0) -> int | None:
    """Return the data bytes of ``obj`` (containers: of their items, extrapolated past
    ``ITEMS_SIZED``), or None if unknown."""
    try:
        own = _array_bytes(obj)
    except Exception:  # a recognised type that still could not say: unknown
        return None
    if own is not None or depth >= 2 or not (items := items_of(obj, ITEMS_SIZED)):
        return own
    known = [s for _, item in items if (s := size_bytes(item, depth + 1)) is not None]
    # items_of only lists these (NumPy arrays have their own size above), read past subclasses
    bases = (list, tuple, dict, set, frozenset)
    length = next((int(b.__len__(obj)) for b in bases if issubclass(type(obj), b)), 0)
    return int(sum(known) * max(1.0, length / len(items))) if known else None


def largest_variables(
    namespace: Mapping[str, Any], limit: int = 8, skip: frozenset[int] = frozenset()
) -> list[Variable]:
    """Return the ``limit`` largest user variables whose size is known, largest first."""
    found = []
    for name in islice(scan_order(namespace), 5000):
        obj = namespace.get(name)
        if name[:1] != "_" and id(obj) not in skip and (size := size_bytes(obj) or 0) > 0:
            found.append(Variable(name, type(obj).__name__, size))
    return sorted(found, key=lambda v: v.size_bytes, reverse=True)[:limit]
