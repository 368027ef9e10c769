"""What counts as model state, and the rules every walk of it shares.

Model state is every Keras object that can hold an old model's tensors: models, layers, the
functional API's symbolic tensors (``inputs``, ``h``, ``outputs``), optimizers, metrics, losses,
callbacks and variables (Keras's and TensorFlow's), of Keras 3 and of legacy tf-keras. This is
the one definition the cleanup, the counts and the reports read. Nothing here imports Keras or
TensorFlow: classes are looked up in ``sys.modules``, and objects are judged by ``type(obj)``
alone (``isinstance`` may run user code via ``__class__``).

The rules all walks share: which names are the user's, what a child is, what is opaque, and how
far every walk goes. A walk never calls a user object's methods: containers are read through
the built-in types' own protocols (``list.__iter__``, ``dict.items``), instances through
``object.__getattribute__`` of their ``__dict__``, everything else through what the C types
expose to the garbage collector (``gc.get_referents``). So a dead ``weakref.proxy``, a lazy
proxy or a ``__getattr__`` that returns anything cannot break or stall one.
"""

from __future__ import annotations

import gc
import re
import sys
import types as pytypes
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from kerasmagic.compat.registry import works
from kerasmagic.imports import user_module

# kind -> (module, attribute path) of its classes; the order decides (tf-keras's Metric is a
# Layer, Keras's Model is a Layer: the first kind that matches names the object).
KINDS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("model", (("keras", "Model"), ("tf_keras", "Model"))),
    ("metric", (("keras", "metrics.Metric"), ("tf_keras", "metrics.Metric"))),
    ("layer", (("keras", "layers.Layer"), ("tf_keras", "layers.Layer"))),
    ("tensor", (("keras", "KerasTensor"), ("tf_keras.src.engine.keras_tensor", "KerasTensor"))),
    (
        "optimizer",
        (
            ("keras", "optimizers.Optimizer"),
            ("tf_keras", "optimizers.Optimizer"),
            ("tf_keras.src.optimizers.legacy.optimizer_v2", "OptimizerV2"),
        ),
    ),
    ("loss", (("keras", "losses.Loss"), ("tf_keras", "losses.Loss"))),
    ("callback", (("keras", "callbacks.Callback"), ("tf_keras", "callbacks.Callback"))),
    (
        "variable",
        (
            ("keras.src.backend.common.variables", "Variable"),
            ("keras.src.backend.common.variables", "KerasVariable"),  # Keras before 3.6
            ("tensorflow.python.ops.variables", "Variable"),
        ),
    ),
)


def _lookup(module_name: str, attr_path: str) -> type | None:
    obj: Any = sys.modules.get(module_name)
    if module_name.endswith("common.variables") and not works("keras.variables"):
        return None  # moved: said once, by compat
    for attr in attr_path.split("."):
        obj = getattr(obj, attr, None)
    return obj if isinstance(obj, type) else None


def _classes(kind: str) -> tuple[type, ...]:
    specs = dict(KINDS)[kind]
    return tuple(c for c in (_lookup(m, a) for m, a in specs) if c is not None)


def model_types() -> tuple[type, ...]:
    """Return the Keras model classes of the Keras packages already imported."""
    return _classes("model")


def callback_types() -> tuple[type, ...]:
    """Return the Keras callback classes (``History`` among them) already imported."""
    return _classes("callback")


@dataclass
class StateTypes:
    """The model-state classes imported now, and each type's kind (remembered per type)."""

    by_kind: tuple[tuple[str, tuple[type, ...]], ...]
    models: tuple[type, ...]
    callbacks: tuple[type, ...]
    all: tuple[type, ...]
    _kinds: dict[type, str | None] = field(default_factory=dict)

    def kind(self, kind: type) -> str | None:
        """Return the kind of model state ``kind`` is ("model", "layer", ...), else None."""
        try:
            return self._kinds[kind]
        except KeyError:
            pass
        found = None
        if self.all and issubclass(kind, self.all):
            found = next(name for name, classes in self.by_kind if issubclass(kind, classes))
        self._kinds[kind] = found
        return found


def state_types() -> StateTypes:
    """Return the model-state classes of what is imported now (cheap: a few lookups)."""
    by_kind = tuple((kind, _classes(kind)) for kind, _ in KINDS)
    every = tuple(c for _, classes in by_kind for c in classes)
    kinds = dict(by_kind)
    return StateTypes(by_kind, kinds["model"], kinds["callback"], every)


def is_a(obj: Any, types: tuple[type, ...]) -> bool:
    """Return ``isinstance(obj, types)`` judged by ``type(obj)`` alone.

    ``isinstance`` falls back to ``obj.__class__``, which runs user code: a dead
    ``weakref.proxy`` raises ``ReferenceError`` and a lazy proxy may raise anything.
    """
    return bool(types) and issubclass(type(obj), types)


def instance_dict(obj: Any) -> dict[str, Any] | None:
    """Return an object's own ``__dict__`` without running its class's code, else None."""
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except Exception:  # no __dict__ (slots), or an odd class
        return None
    return attrs if type(attrs) is dict else None


def callback_model(callback: Any) -> Any:
    """Return the model a callback (or ``History``) points at, without Keras's property logic."""
    attrs = instance_dict(callback)
    if attrs is None:
        return None
    if "_model" in attrs and works("keras.callback_model"):  # moved: said once, by compat
        return attrs["_model"]
    return attrs.get("model")


def user_class(kind: type) -> bool:
    """Return whether ``kind`` is the user's: defined in a notebook cell or a module of the
    user's (not an installed package, not the standard library), or a ``SimpleNamespace``."""
    if kind is pytypes.SimpleNamespace:
        return True
    try:  # the class's own dict: no metaclass code runs
        name = type.__getattribute__(kind, "__dict__").get("__module__")
    except Exception:
        return False
    return user_module(name)


# The namespace's names: the user's own, and IPython's (``Out``, ``_7``, ``_i3``).
_NOT_USER = re.compile(r"^(_|__|___|_\d+|_i+|_i\d+|_ih|_oh|_dh|In|Out|exit|quit|get_ipython)$")
_INPUT = re.compile(r"^_i+$|^_i\d+$")  # IPython's copies of cell sources: never model state
IPYTHON_PLAIN = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
SKIP = frozenset({"_oh", "_ih", "In", "_dh", "__builtins__", "__builtin__"})  # aliases, no state


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


# The limits, one place for all walks.
NEAR_DEPTH = 2  # the per-cell walk: how far into the namespace's lists, tuples, dicts, sets
NEAR_ITEMS = 256  # items of one container a near walk looks at (keeps it O(names))
COUNT_ITEMS = 64  # the same for the count taken after every cell, which must stay cheap
REBOUND_DEPTH = 6  # how far into a rebound name's containers and objects model state is cut
PATH_DEPTH = 12  # how deep a path to a holder is searched for
PATH_VISITS = 200_000  # objects a path search looks at before it gives up
REACH_VISITS = 2_000_000  # objects the kept-names walk looks at; past this it is incomplete
SMALL_ARRAY = 10_000  # NumPy object arrays up to this size are walked item by item
OWN_VISITS = 200_000  # objects of one model's own graph looked at (a Keras model: ~5,000)
READS_VISITS = 50_000  # objects the rebinding rule's reads walk looks at per cell
READS_ITEMS = 256  # items of one container it looks at
READS_NESTING = 4  # containers inside containers it follows

# Never walked into: everything shares them (a function's globals are the namespace itself).
OPAQUE: tuple[type, ...] = (
    type,
    pytypes.ModuleType,
    pytypes.FunctionType,
    pytypes.BuiltinFunctionType,
    pytypes.MethodType,
    pytypes.FrameType,
    pytypes.CodeType,
    pytypes.TracebackType,
    weakref.ref,
    weakref.ProxyType,
    weakref.CallableProxyType,
)
CONTAINERS = frozenset({list, tuple, dict, set, frozenset})
_PLAIN_KEYS = frozenset({str, int, float, bool, bytes, type(None)})
_MODULE_DICT: Any = vars(pytypes.ModuleType)["__dict__"]  # past a subclass's own __dict__
_CLASS_DICT: Any = vars(type)["__dict__"]  # a class's own dict, past a metaclass's
_MRO: Any = vars(type)["__mro__"]


def safe_key(key: Any) -> str:
    """Return ``repr(key)`` for plain keys, and only the type's name for others (no user code)."""
    if type(key) in _PLAIN_KEYS:
        text = repr(key)
        return text if len(text) <= 80 else text[:77] + "..."
    return f"<{type(key).__name__}>"


def items_of(obj: Any, limit: int = NEAR_ITEMS) -> list[tuple[str, Any]] | None:
    """Return ``[(suffix, item)]`` of a list, tuple, dict, set (subclasses too) or NumPy array of
    objects without calling their Python-level methods, or None if ``obj`` is none of those."""
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


def user_attrs(obj: Any) -> dict[str, Any] | None:
    """Return the ``__dict__`` of an instance of a user class (no user code runs), else None."""
    kind = type(obj)
    return None if issubclass(kind, type) or not user_class(kind) else instance_dict(obj)


def user_slots(obj: Any) -> list[tuple[str, Any, Any]]:
    """Return ``[(name, descriptor, value)]`` of the set slots of an instance of a user class
    (``@dataclass(slots=True)``), read through the slots' own C descriptors; else []."""
    kind = type(obj)
    if issubclass(kind, type) or not user_class(kind):
        return []
    out: list[tuple[str, Any, Any]] = []
    for klass in _MRO.__get__(kind):
        for name, slot in _CLASS_DICT.__get__(klass).items():
            if type(slot) is pytypes.MemberDescriptorType:
                try:
                    out.append((name, slot, slot.__get__(obj, kind)))
                except AttributeError:  # a slot never set
                    continue
    return out


def contents(obj: Any, limit: int = NEAR_ITEMS) -> list[tuple[str, Any]]:
    """Return what a rebound or searched object holds: a user object's attributes (``.name``,
    slots too), else a container's items (``[i]``), else nothing."""
    attrs, slots = user_attrs(obj), user_slots(obj)
    if attrs is not None or slots:
        found = [(f".{key}", value) for key, value in (attrs or {}).items()]
        return found + [(f".{name}", value) for name, _, value in slots]
    return items_of(obj, limit) or []


def attributes(obj: Any, limit: int = NEAR_ITEMS) -> list[tuple[str, Any]]:
    """Return ``[(".name", value)]`` of any instance's ``__dict__`` as the collector sees it
    (installed packages' objects too: no ``__getattr__`` or property runs); nothing for
    classes, modules and functions."""
    if issubclass(type(obj), OPAQUE):
        return []
    dicts = [ref for ref in gc.get_referents(obj) if type(ref) is dict]
    if not dicts:  # Python 3.11+ keeps attributes inline until __dict__ is asked for
        attrs = _managed_dict(obj)
        dicts = [] if attrs is None else [attrs]
    out: list[tuple[str, Any]] = []
    for ref in dicts:
        out.extend(
            (f".{key}" if type(key) is str else f"[{safe_key(key)}]", value)
            for key, value in islice(dict.items(ref), limit)
        )
    return out


def _managed_dict(obj: Any) -> dict[str, Any] | None:
    """Return an instance's ``__dict__`` through the C slot of its classes (no property or
    ``__getattr__`` of the user's runs), else None."""
    for klass in _MRO.__get__(type(obj)):
        slot = _CLASS_DICT.__get__(klass).get("__dict__")
        if type(slot) is pytypes.GetSetDescriptorType:
            try:
                attrs = slot.__get__(obj)
            except Exception:
                return None
            return attrs if type(attrs) is dict else None
        if slot is not None:  # a class of the user's own making defines __dict__: leave it
            return None
    return None


def function_refs(fn: pytypes.FunctionType, limit: int = NEAR_ITEMS) -> list[tuple[str, Any]]:
    """Return what a function reaches when it runs: the globals its code names
    (``→name``) and its closure's contents (``→<closure>``)."""
    out = [
        (f"→{name}", fn.__globals__[name])
        for name in islice(fn.__code__.co_names, limit)
        if name in fn.__globals__
    ]
    for cell in fn.__closure__ or ():
        try:
            out.append(("→<closure>", cell.cell_contents))
        except ValueError:  # an empty cell
            continue
    return out


def module_dicts() -> dict[int, str]:
    """Return ``{id(module.__dict__): name}`` for the imported modules (lazy ones included,
    without running their code)."""
    out: dict[int, str] = {}
    for name, module in list(sys.modules.items()):
        if issubclass(type(module), pytypes.ModuleType) and type(name) is str:
            out[id(_MODULE_DICT.__get__(module))] = name
    return out


def closure_objects(obj: Any, depth: int, containers: bool = False) -> Iterator[Any]:
    """Yield ``obj`` and what it holds ``depth`` levels down: a Python function's closure
    contents and, with ``containers``, the items of lists, tuples, dicts and sets.

    TensorFlow's registered gradient functions close over the tensors of the graph they were
    traced in, and Keras's ``train_function`` is a Python function closing over a
    ``tf.function``: both are found by reading closure cells, never by calling anything.
    """
    yield obj
    if depth <= 0:
        return
    if type(obj) is pytypes.FunctionType:
        for cell in obj.__closure__ or ():
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            yield from closure_objects(content, depth - 1, containers)
    elif containers:
        for _, item in items_of(obj) or ():
            yield from closure_objects(item, depth - 1, containers)
