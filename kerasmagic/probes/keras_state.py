"""Keras models reachable from a namespace, and Keras's layer-name counter.

Nothing here imports Keras: a model can only exist once the user has imported it, so the model
classes are looked up in ``sys.modules``.
"""

from __future__ import annotations

import re
import sys
import types as pytypes
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

MAX_DEPTH = 2  # how far into lists, tuples, dicts and sets of the namespace we look
MAX_ITEMS = 256  # how many items of one container we look at (keeps the scan O(names))
COUNT_ITEMS = 64  # the same for the count taken after every cell, which must stay cheap
_NOT_USER = re.compile(r"^(_|__|___|_\d+|_i+|_i\d+|_ih|_oh|_dh|In|Out|exit|quit|get_ipython)$")
_INPUT = re.compile(r"^_i+$|^_i\d+$")  # IPython's copies of cell sources: never models
IPYTHON_PLAIN = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
SKIP = frozenset({"_oh", "_ih", "In", "_dh", "__builtins__", "__builtin__"})  # aliases, no models


@dataclass(frozen=True)
class KerasInfo:
    """Whether Keras is imported, its auto-name counter, and models found in the namespace."""

    imported: bool
    name_counter: int | None
    live_models: int | None


def _classes(module_name: str, attr_path: str) -> list[type]:
    out: list[type] = []
    for name in (module_name, f"tf_{module_name}"):  # Keras 3 and legacy tf-keras
        obj: Any = sys.modules.get(name)
        for attr in attr_path.split("."):
            obj = getattr(obj, attr, None)
        if isinstance(obj, type):
            out.append(obj)
    return out


def model_types() -> tuple[type, ...]:
    """Return the Keras model classes of the Keras packages already imported."""
    return tuple(_classes("keras", "Model"))


def callback_types() -> tuple[type, ...]:
    """Return the Keras callback classes (``History`` among them) already imported."""
    return tuple(_classes("keras", "callbacks.Callback"))


def is_user_name(name: Any) -> bool:
    """Return False for IPython's own names (``Out``, ``_7``, ``_i3``), dunders and non-strings."""
    if type(name) is not str:
        return False
    return not (_NOT_USER.match(name) or (name.startswith("__") and name.endswith("__")))


def scan_order(namespace: Mapping[str, Any]) -> list[str]:
    """Return the names worth scanning, the user's own first (so paths read ``model``)."""
    user: list[str] = []
    ipython: list[str] = []
    for name in list(namespace):
        if type(name) is not str:
            continue  # globals()[1] = ...: not a name a cell can use
        if name[:1] != "_" and name not in SKIP and name not in IPYTHON_PLAIN:
            user.append(name)  # fast path: most user names start with a letter
        elif name[:2] == "_i" and (name[2:].isdigit() or _INPUT.match(name)):
            continue  # _i/_ii/_i12: IPython's copies of the input, one more per cell
        elif name not in SKIP:
            (user if is_user_name(name) else ipython).append(name)
    return user + ipython


def is_a(obj: Any, types: tuple[type, ...]) -> bool:
    """Return ``isinstance(obj, types)`` judged by ``type(obj)`` alone.

    ``isinstance`` falls back to ``obj.__class__``, which runs user code: a dead
    ``weakref.proxy`` raises ``ReferenceError`` and a lazy proxy may raise anything.
    """
    return bool(types) and issubclass(type(obj), types)


def callback_model(callback: Any) -> Any:
    """Return the model a callback (or ``History``) points at, without Keras's property logic."""
    try:
        attrs = object.__getattribute__(callback, "__dict__")
    except AttributeError:
        return None
    return attrs.get("_model", attrs.get("model")) if type(attrs) is dict else None


def safe_key(key: Any) -> str:
    """Return ``repr(key)`` for plain keys, and only the type's name for others (no user code)."""
    if type(key) in _PLAIN_KEYS:
        text = repr(key)
        return text if len(text) <= 80 else text[:77] + "..."
    return f"<{type(key).__name__}>"


_PLAIN_KEYS = frozenset({str, int, float, bool, bytes, type(None)})


def items_of(obj: Any, limit: int = MAX_ITEMS) -> list[tuple[str, Any]] | None:
    """Return ``[(suffix, item)]`` of a list, tuple, dict or set (subclasses too) without
    calling their Python-level methods, or None if ``obj`` is no such container."""
    kind = type(obj)
    if issubclass(kind, list):
        return [(f"[{i}]", v) for i, v in enumerate(islice(list.__iter__(obj), limit))]
    if issubclass(kind, tuple):
        return [(f"[{i}]", v) for i, v in enumerate(islice(tuple.__iter__(obj), limit))]
    if issubclass(kind, dict):
        pairs = islice(dict.items(obj), limit)
        return [(f"[{safe_key(k)}]", v) for k, v in pairs]
    if issubclass(kind, (set, frozenset)):
        it = set.__iter__(obj) if issubclass(kind, set) else frozenset.__iter__(obj)
        return [(f"{{{i}}}", v) for i, v in enumerate(islice(it, limit))]
    array = object_array(obj)
    if array is not None:
        items = list(islice(array.flat, limit))
        one_d = array.ndim == 1
        return [(f"[{i}]" if one_d else f".flat[{i}]", v) for i, v in enumerate(items)]
    return None


def object_array(obj: Any) -> Any:
    """Return a plain ``ndarray`` view of a NumPy array of Python objects (what a pandas column
    of models is made of), or None for anything else; no subclass code runs."""
    numpy: Any = sys.modules.get("numpy")
    ndarray: Any = getattr(numpy, "ndarray", None)
    if not isinstance(ndarray, type) or not issubclass(type(obj), ndarray):
        return None
    try:
        plain = numpy.ndarray.view(obj, ndarray)  # the base class's view: no __array_finalize__
        return plain if plain.dtype.kind == "O" else None
    except Exception:
        return None


def object_array_items(obj: Any, limit: int) -> list[Any] | None:
    """Return the first ``limit`` items of ``object_array(obj)``, or None if it is none."""
    array = object_array(obj)
    return None if array is None else list(islice(array.flat, limit))


_MODULE_DICT: Any = vars(pytypes.ModuleType)["__dict__"]  # past a subclass's own __dict__


def module_dicts() -> dict[int, str]:
    """Return ``{id(module.__dict__): name}`` for the imported modules (lazy ones included,
    without running their code)."""
    out: dict[int, str] = {}
    for name, module in list(sys.modules.items()):
        if issubclass(type(module), pytypes.ModuleType) and type(name) is str:
            out[id(_MODULE_DICT.__get__(module))] = name
    return out


_INSTALLED = ("site-packages", "dist-packages")


def user_class(kind: type) -> bool:
    """Return whether ``kind`` is the user's: defined in a notebook cell or a module of the
    user's (not an installed package, not the standard library), or a ``SimpleNamespace``."""
    if kind is pytypes.SimpleNamespace:
        return True
    try:  # the class's and the module's own dicts: no metaclass or lazy-module code runs
        name = type.__getattribute__(kind, "__dict__").get("__module__")
        module = sys.modules.get(name) if type(name) is str else None
        path = object.__getattribute__(module, "__dict__").get("__file__") if module else None
    except Exception:
        return False
    if module is None or name.split(".")[0] in ("builtins", "kerasmagic"):
        return False
    if name == "__main__":
        return True
    if type(path) is not str or any(part in path for part in _INSTALLED):
        return False
    return not path.startswith(sys.base_prefix) and not path.startswith(sys.prefix)


def user_attrs(obj: Any) -> dict[str, Any] | None:
    """Return the ``__dict__`` of an instance of a user class (no user code runs), else None."""
    kind = type(obj)
    if issubclass(kind, type) or not user_class(kind):
        return None
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except Exception:  # no __dict__ (slots), or an odd class
        return None
    return attrs if type(attrs) is dict else None


def walk(
    path: str, obj: Any, callbacks: tuple[type, ...], depth: int = 0, max_depth: int = MAX_DEPTH
) -> Iterator[tuple[str, Any]]:
    """Yield ``(path, object)`` for ``obj``, its container items and callbacks' models.

    Only built-in container protocols are used (never the object's own methods), so a user
    object whose attributes, ``__len__`` or ``__iter__`` raise cannot break the walk.
    """
    yield path, obj
    if is_a(obj, callbacks):
        model = callback_model(obj)
        if model is not None:
            yield f"{path}.model", model
        return
    if depth >= max_depth:
        return
    for suffix, item in items_of(obj) or ():
        yield from walk(path + suffix, item, callbacks, depth + 1, max_depth)


def namespace_models(namespace: Mapping[str, Any]) -> dict[int, tuple[str, Any]]:
    """Return ``{id: (first path, model)}`` for every model reachable from the namespace."""
    types = model_types()
    if not types:
        return {}
    callbacks = callback_types()
    found: dict[int, tuple[str, Any]] = {}
    for name in scan_order(namespace):
        for path, obj in walk(name, namespace.get(name), callbacks):
            if is_a(obj, types) and id(obj) not in found:
                found[id(obj)] = (path, obj)
    return found


def count_models(namespace: Mapping[str, Any]) -> int:
    """Count distinct models reachable as ``walk`` reaches them, without building paths.

    This runs after every cell (the live monitor), so it is a flat loop over one level at a
    time, not ``walk``, and looks at the first ``COUNT_ITEMS`` items of each container.
    """
    types, callbacks = model_types(), callback_types()
    if not types:
        return 0
    found: set[int] = set()
    # Not scan_order(): IPython adds an _iN name per cell, so a per-name check grows with the
    # session; judging the values by type skips them (strings) at a fraction of the cost.
    level: list[Any] = [
        obj
        for name, obj in list(namespace.items())
        if type(obj) not in _NEVER_MODELS and name not in SKIP
    ]
    for depth in range(MAX_DEPTH + 1):
        deeper: list[Any] = []
        for obj in level:
            kind = type(obj)
            if kind in _CONTAINERS:
                if depth < MAX_DEPTH:
                    deeper.extend(islice(obj.values() if kind is dict else obj, COUNT_ITEMS))
            elif issubclass(kind, types):
                found.add(id(obj))
            elif callbacks and issubclass(kind, callbacks):
                model = callback_model(obj)
                if is_a(model, types):
                    found.add(id(model))
        level = deeper
    return len(found)


_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})
_NEVER_MODELS = frozenset(
    {
        str,
        bytes,
        int,
        float,
        bool,
        complex,
        type(None),
        type,
        pytypes.FunctionType,
        pytypes.ModuleType,
        pytypes.BuiltinFunctionType,
        pytypes.MethodType,
    }
)


def name_counter() -> int | None:
    """Return the total of Keras's auto-name counters (``dense_57`` makes it grow).

    Keras 3 keeps them in its global state; legacy tf-keras per graph, in
    ``tf_keras.src.backend.PER_GRAPH_OBJECT_NAME_UIDS`` (a weak dict graph -> counters).
    """
    counts = []
    state = sys.modules.get("keras.src.backend.common.global_state")
    getter = getattr(state, "get_global_attribute", None)
    if getter is not None:
        uids = getter("object_name_uids")
        counts.append(int(sum(uids.values())) if uids else 0)
    legacy = getattr(sys.modules.get("tf_keras.src.backend"), "PER_GRAPH_OBJECT_NAME_UIDS", None)
    if legacy is not None:
        graphs = list(legacy.values())  # a copy: graphs may be collected meanwhile
        counts.append(sum(int(sum(uids.values())) for uids in graphs))
    return sum(counts) if counts else None


def read_keras(namespace: Mapping[str, Any] | None) -> KerasInfo:
    """Return Keras's state; models are counted only when a namespace is given."""
    if not model_types():
        return KerasInfo(imported=False, name_counter=None, live_models=None)
    live = None if namespace is None else count_models(namespace)
    return KerasInfo(imported=True, name_counter=name_counter(), live_models=live)
