"""The rebound walk: the models a rebound name's value holds, and that value without them.

A name a cell binds again (``model = build()`` re-run) lets go of what it held, but a container
or an object of the user's own classes bound to it may hold old models several levels down
(``runs[fold]["model"]``, ``trainer.model``). ``models_under`` finds them and ``strip`` takes
them out, both reading the same children (``children.contents``, ``REBOUND_DEPTH`` levels), so
what a report names as dropped is what is cut. ``strip`` writes through the built-in types'
own protocols, never a user method: lists, dicts and NumPy object arrays in place, an
instance's ``__dict__`` or slots, tuples and frozensets rebuilt.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kerasmagic.walk.children import REBOUND_DEPTH, contents, object_array, user_attrs, user_slots
from kerasmagic.walk.state import is_a


def models_under(
    path: str, obj: Any, types: tuple[type, ...], depth: int = 0
) -> Iterator[tuple[str, Any]]:
    """Yield ``(path, model)`` for the models ``strip`` would reach from ``obj``."""
    if is_a(obj, types):
        yield path, obj
        return
    if depth >= REBOUND_DEPTH:
        return
    for suffix, item in contents(obj):
        yield from models_under(path + suffix, item, types, depth + 1)


def strip(obj: Any, types: tuple[type, ...], kept: frozenset[int], depth: int = 0) -> Any:
    """Return ``obj`` with stale models replaced by None (lists, dicts and the user's objects in
    place, tuples and frozensets rebuilt). Models, containers and objects a kept name also
    reaches stay as they are."""
    if is_a(obj, types):
        return obj if id(obj) in kept else None
    if depth >= REBOUND_DEPTH or id(obj) in kept:
        return obj
    attrs, slots = user_attrs(obj), user_slots(obj)
    if attrs is not None or slots:
        for key, item in list((attrs or {}).items()):
            new = strip(item, types, kept, depth + 1)
            if new is not item and attrs is not None:
                attrs[key] = new
        for _, slot, item in slots:  # @dataclass(slots=True): through the slot's descriptor
            new = strip(item, types, kept, depth + 1)
            if new is not item:
                slot.__set__(obj, new)
    elif issubclass(type(obj), list):  # subclasses too, as models_under found them
        for i, item in enumerate(list(list.__iter__(obj))):
            new = strip(item, types, kept, depth + 1)
            if new is not item:
                list.__setitem__(obj, i, new)
    elif issubclass(type(obj), dict):  # defaultdict, OrderedDict: an existing key's value
        for key, item in list(dict.items(obj)):
            new = strip(item, types, kept, depth + 1)
            if new is not item:
                dict.__setitem__(obj, key, new)
    elif type(obj) is tuple or (issubclass(type(obj), tuple) and hasattr(type(obj), "_fields")):
        items = [strip(item, types, kept, depth + 1) for item in tuple.__iter__(obj)]
        if any(new is not old for new, old in zip(items, obj, strict=True)):
            return type(obj)(*items) if hasattr(type(obj), "_fields") else tuple(items)
    elif (array := object_array(obj)) is not None and array.flags.writeable:
        for i, item in enumerate(array.flat):
            new = strip(item, types, kept, depth + 1)
            if new is not item:
                array.flat[i] = new
    elif type(obj) in (set, frozenset):
        stale = [item for item in obj if is_a(item, types) and id(item) not in kept]
        if type(obj) is set:
            obj.difference_update(stale)
        elif stale:
            return frozenset(obj.difference(stale))
    return obj
