"""Which models the user still holds: every model reachable from kept names, at any depth.

The walk follows what the C types expose to the garbage collector (``gc.get_referents``):
container items and instance attributes (``__dict__`` and slots), and the items of NumPy
arrays of objects (a pandas column of models), which the collector does not see. It never
calls a user object's methods, so odd objects (dead ``weakref.proxy``, lazy proxies,
``__getattr__`` that returns anything) cannot break or slow it. It does not go into
functions, classes, modules or frames (a function's globals are the namespace itself), into
models (their insides are theirs) or through a callback's ``.model`` (a link that cleanup may cut);
a bound method leads to its object (``predict = trainer.predict`` keeps the trainer).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from types import MethodType
from typing import Any

from kerasmagic.walk.children import OPAQUE, REACH_VISITS, SMALL_ARRAY, object_array_items


@dataclass(frozen=True)
class Reach:
    """Ids of the model state (and of every object) found from the roots; whether the walk
    finished.

    ``models`` holds the ids of the state objects found (the walk stops at them: their insides
    are theirs) and ``found`` the objects; ``callbacks`` each callback met (``History`` and the
    like), at any depth, with the label of the root it was found from.
    """

    models: frozenset[int]
    objects: frozenset[int]
    complete: bool
    callbacks: tuple[tuple[str, Any], ...] = ()
    found: tuple[Any, ...] = ()


def reachable(
    roots: Iterable[tuple[str, Any]],
    models: tuple[type, ...],
    callbacks: tuple[type, ...] = (),
    skip: Iterable[Any] = (),
    max_visits: int = REACH_VISITS,
) -> Reach:
    """Return what is reachable from the ``(label, root)`` pairs (see the module docstring).

    ``models`` are the classes the walk stops at (models, or all model state); a callback is
    met, not stopped at, even when its class is among them.
    """
    seen: set[int] = {id(obj) for obj in skip}
    found: dict[int, Any] = {}
    met: list[tuple[str, Any]] = []
    visits = 0
    tracked, referents = gc.is_tracked, gc.get_referents  # the loop runs per object
    arrays = _array_types()
    for label, root in roots:
        level = [root]  # breadth first: one C call gathers the referents of a whole level
        while level:
            expand: list[Any] = []
            deeper: list[Any] = []
            for obj in level:
                key = id(obj)
                if key in seen:
                    continue
                seen.add(key)
                visits += 1
                if visits > max_visits:
                    return _result(found, seen, False, met)
                kind = type(obj)
                if callbacks and issubclass(kind, callbacks):
                    met.append((label, obj))
                elif models and issubclass(kind, models):
                    found[key] = obj
                elif kind is MethodType:  # predict = trainer.predict keeps the trainer
                    deeper.append(obj.__self__)
                elif tracked(obj) and not issubclass(kind, OPAQUE):
                    expand.append(obj)
                elif arrays and kind in arrays:
                    deeper.extend(_array_holdings(obj, models + callbacks, max_visits))
            refs = referents(*expand)
            # Untracked objects (numbers, strings, tuples and dicts of them) hold no model,
            # callback or container of one: filtered in C, a list of 1M floats costs one visit.
            # NumPy arrays are untracked too, and one of dtype object may hold models.
            deeper.extend(filter(tracked, refs))
            if arrays and not arrays.isdisjoint(map(type, refs)):
                deeper.extend(ref for ref in refs if type(ref) in arrays)
            level = deeper
    return _result(found, seen, True, met)


def _result(found: dict[int, Any], seen: set[int], complete: bool, met: list[Any]) -> Reach:
    return Reach(frozenset(found), frozenset(seen), complete, tuple(met), tuple(found.values()))


def _array_types() -> frozenset[type]:
    """Return NumPy's array class if NumPy is imported (arrays of objects can hold models)."""
    ndarray = getattr(sys.modules.get("numpy"), "ndarray", None)
    return frozenset({ndarray}) if isinstance(ndarray, type) else frozenset()


def _array_holdings(array: Any, wanted: tuple[type, ...], limit: int) -> list[Any]:
    """The items of an object array to walk: all that can hold something of a small one; of a
    big one (a column of 2M token lists), only the models and callbacks stored in it."""
    items = object_array_items(array, limit) or []
    if len(items) <= SMALL_ARRAY:
        return list(filter(gc.is_tracked, items))
    kinds = [kind for kind in set(map(type, items)) if wanted and issubclass(kind, wanted)]
    return [item for item in items if type(item) in kinds] if kinds else []
