"""The cuts a cleanup plan makes: each returns a callable that does one cut when called.

Planning (``stale.py``) only looks; these closures do the cutting, and only to model state: a
name is unbound, a model inside a rebound container becomes ``None`` (``walk/rebound.py``:
lists, dicts and NumPy object arrays in place, tuples and frozensets rebuilt), and so does a
model in an attribute of an object of the user's own classes bound to a rebound name
(``trainer = Trainer()`` re-run: the old trainer's model); an output-cache entry is
forgotten, a stored traceback's frames drop their locals, a callback loses its ``.model``
link. Containers and objects a kept name also reaches are never touched.
"""

from __future__ import annotations

import types as pytypes
from collections.abc import Callable, MutableMapping
from typing import Any

from kerasmagic.cleanup.tracebacks import clear_frames, drop_stored_errors
from kerasmagic.compat.reaches import broken
from kerasmagic.walk.rebound import strip
from kerasmagic.walk.state import instance_dict


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
