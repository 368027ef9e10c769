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
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


_process: psutil.Process | None = None


def _this_process() -> psutil.Process:
    """Return a cached ``psutil.Process`` for this PID (creating one reads /proc: ~0.3 ms)."""
    global _process
    if _process is None or _process.pid != os.getpid():  # new after a fork
        _process = psutil.Process()
    return _process


HOST_TTL_S = 1.0  # host totals change slowly; /proc/meminfo costs ~0.1 ms per read
_host: tuple[float, int, int] = (float("-inf"), 0, 0)  # (read at, total, available)


def _host_memory() -> tuple[int, int]:
    global _host
    now = time.monotonic()
    if now - _host[0] > HOST_TTL_S:
        vm = psutil.virtual_memory()
        _host = (now, int(vm.total), int(vm.available))
    return _host[1], _host[2]


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
    rss = int(_this_process().memory_info().rss)
    total, available = _host_memory()
    return ram_info(rss, _peak_rss_bytes(), total, available)


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
    counts = []
    state = sys.modules.get("keras.src.backend.common.global_state")
    if state is not None and works("keras.global_state") and works("keras.name_uids"):
        uids = state.get_global_attribute("object_name_uids")
        counts.append(int(sum(uids.values())) if uids else 0)
    legacy = getattr(sys.modules.get("tf_keras.src.backend"), "PER_GRAPH_OBJECT_NAME_UIDS", None)
    if legacy is not None and works("tf_keras.name_uids"):
        graphs = list(legacy.values())  # a copy: graphs may be collected meanwhile
        counts.append(sum(int(sum(uids.values())) for uids in graphs))
    return sum(counts) if counts else None


def read_keras(namespace: Mapping[str, Any] | None) -> KerasInfo:
    """Return Keras's state; models are counted only when a namespace is given."""
    if not model_types():
        return KerasInfo(imported=False, name_counter=None, live_models=None)
    live = None if namespace is None else count_models(namespace)
    return KerasInfo(imported=True, name_counter=name_counter(), live_models=live)


# -- the namespace's largest data ------------------------------------------------------------------
ITEMS_SIZED = 10_000  # items of one list/dict summed before the rest is extrapolated


@dataclass(frozen=True)
class Variable:
    """One namespace name, its type, and the bytes its data takes (an array's buffer...)."""

    name: str
    type: str
    size_bytes: int


def _array_bytes(obj: Any) -> int | None:
    module = type(obj).__module__.partition(".")[0]
    numpy = sys.modules.get("numpy")
    if numpy is not None and issubclass(type(obj), numpy.ndarray):
        return int(obj.nbytes)
    if module == "pandas" and type(obj).__name__ in ("DataFrame", "Series"):
        usage = obj.memory_usage(index=True, deep=False)
        return int(usage.sum() if type(obj).__name__ == "DataFrame" else usage)
    if module in ("tensorflow", "keras") and hasattr(type(obj), "dtype"):
        elements = obj.shape.num_elements()
        return None if elements is None else int(elements * obj.dtype.size)
    if module == "torch" and type(obj).__name__ in ("Tensor", "Parameter"):
        return int(obj.element_size() * obj.nelement())
    if module in ("jax", "jaxlib") and hasattr(type(obj), "nbytes"):
        return int(obj.nbytes)
    if type(obj) in (bytes, bytearray, str):
        return sys.getsizeof(obj)
    return None


def size_bytes(obj: Any, depth: int = 0) -> int | None:
    """Return the data bytes of ``obj`` (containers: of their items), or None if unknown."""
    try:
        own = _array_bytes(obj)
    except Exception:  # a recognised type that still could not say: unknown
        return None
    if own is not None or depth >= 2:
        return own
    items = items_of(obj, ITEMS_SIZED)
    if not items:
        return None
    sizes = [size_bytes(item, depth + 1) for _, item in items]
    known = [s for s in sizes if s is not None]
    if not known:
        return None
    total_items = _length(obj)
    return int(sum(known) * max(1.0, total_items / len(items)))


def _length(obj: Any) -> int:
    for base in (list, tuple, dict, set, frozenset):
        if issubclass(type(obj), base):
            return int(base.__len__(obj))
    return 0


def largest_variables(
    namespace: Mapping[str, Any], limit: int = 8, skip: frozenset[int] = frozenset()
) -> list[Variable]:
    """Return the ``limit`` largest user variables whose size is known, largest first."""
    found = []
    for name in islice(scan_order(namespace), 5000):
        if name[:1] == "_":
            continue
        obj = namespace.get(name)
        if id(obj) in skip:
            continue
        size = size_bytes(obj)
        if size is not None and size > 0:
            found.append(Variable(name, type(obj).__name__, size))
    found.sort(key=lambda v: v.size_bytes, reverse=True)
    return found[:limit]
