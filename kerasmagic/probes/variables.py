"""The largest data in the user's namespace (arrays, DataFrames, tensors): read-only, by size.

Sizes come from the data types' own byte counts (``nbytes``, ``memory_usage``, shape times
item size), asked only of types recognised by ``type(obj)``: a user object's own methods are
never called, and nothing here is ever freed.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

from kerasmagic.walk.children import items_of
from kerasmagic.walk.names import scan_order

ITEMS_SIZED = 10_000  # items of one list/dict summed before the rest is extrapolated


@dataclass(frozen=True)
class Variable:
    """One namespace name, its type, and the bytes its data takes (an array's buffer...)."""

    name: str
    type: str
    size_bytes: int


def _module_of(obj: Any) -> str:
    return type(obj).__module__.split(".", 1)[0]


def _array_bytes(obj: Any) -> int | None:
    module = _module_of(obj)
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
