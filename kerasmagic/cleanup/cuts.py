"""The cuts a cleanup plan makes: each returns a callable that does one cut when called.

Planning (``stale.py``) only looks; these closures do the cutting, and only to model state: a
name is unbound, a model inside a rebound container becomes ``None`` (lists, dicts and NumPy
object arrays in place, tuples and frozensets rebuilt), and so does a model in an attribute
of an object of the user's own classes bound to a rebound name (``trainer = Trainer()``
re-run: the old trainer's model); an output-cache entry is forgotten, a stored traceback's
frames drop their locals, a callback loses its ``.model`` link. Containers and objects a kept
name also reaches are never touched.
"""

from __future__ import annotations

import types as pytypes
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from kerasmagic.cleanup.tracebacks import clear_frames, drop_stored_errors
from kerasmagic.compat.reaches import broken
from kerasmagic.walk.children import (
    REBOUND_DEPTH,
    contents,
    object_array,
    user_attrs,
    user_slots,
)
from kerasmagic.walk.state import instance_dict, is_a


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


def unbind(ns: MutableMapping[str, Any], name: str) -> Callable[[], None]:
    """Cut: remove ``name`` from the namespace."""
    return lambda: ns.pop(name, None)


def strip_binding(
    ns: MutableMapping[str, Any], name: str, types: tuple[type, ...], kept: frozenset[int]
) -> Callable[[], None]:
    """Cut: the stale models out of the container bound to ``name`` (see ``strip``)."""

    def act() -> None:
        if name in ns:
            ns[name] = strip(ns[name], types, kept)

    return act


def forget_output(
    ns: MutableMapping[str, Any], out: dict[Any, Any], key: Any
) -> Callable[[], None]:
    """Cut: IPython's ``Out[key]`` and its ``_key`` alias."""

    def act() -> None:
        value = out.pop(key, None)
        if value is not None and ns.get(f"_{key}") is value:
            del ns[f"_{key}"]

    return act


def set_item(ns: MutableMapping[str, Any], name: str, value: Any) -> Callable[[], None]:
    """Cut: ``ns[name] = value`` (IPython's ``_``, ``__``, ``___`` become "")."""
    return lambda: ns.__setitem__(name, value)


def clear_frames_of(tb: pytypes.TracebackType) -> Callable[[], None]:
    """Cut: the locals of a stored traceback's finished frames."""
    return lambda: clear_frames(tb)


def forget_stored_errors(shell: Any | None) -> Callable[[], None]:
    """Cut: the stored error itself (``sys.last_*``, the shell's and IPython's formatter's)."""

    def act() -> None:
        drop_stored_errors(shell)

    return act


def cut_link(callback: Any) -> Callable[[], None]:
    """Cut: a callback's (``History``'s) ``.model`` link; its numbers stay.

    Keras 3 keeps it in ``_model`` behind a ``model`` property, tf-keras in ``model``: the key
    that holds it is cleared. Neither there means Keras moved it: said once, nothing written
    (a ``model`` entry would hide behind the property and cut nothing).
    """

    def act() -> None:
        attrs = instance_dict(callback) or {}
        key = next((k for k in ("_model", "model") if k in attrs), None)
        if key is None:
            broken("keras.callback_model", "moved Callback._model")
            return
        attrs[key] = None

    return act


def set_attr(obj: Any, name: str, value: Any) -> Callable[[], None]:
    """Cut: ``obj.name = value`` (the display hook's copies, the last execution result)."""
    return lambda: setattr(obj, name, value)
