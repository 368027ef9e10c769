"""``as_dict``: ``dataclasses.asdict`` for the snapshot types, at a fraction of its cost.

``asdict`` deep-copies every leaf (``copy.deepcopy`` of each int) and looks up the fields of
each instance anew; a snapshot has ~100 leaves and is serialised after every cell for the
sidebar. The snapshot types hold only numbers, strings, None, tuples, lists, dicts and more of
themselves, so those are rebuilt directly and anything else is deep-copied as ``asdict`` does.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

_LEAVES = frozenset({int, float, str, bool, type(None)})
_FIELDS: dict[type, tuple[str, ...]] = {}


def as_dict(obj: Any) -> Any:
    """Return what ``dataclasses.asdict(obj)`` returns (for a dataclass instance ``obj``)."""
    kind = type(obj)
    if kind in _LEAVES:
        return obj
    names = _FIELDS.get(kind)
    if names is None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(obj))
    if names is not None:
        return {name: as_dict(getattr(obj, name)) for name in names}
    if kind is tuple or kind is list:
        return kind(as_dict(item) for item in obj)
    if kind is dict:
        return {as_dict(key): as_dict(value) for key, value in obj.items()}
    return copy.deepcopy(obj)
