"""What counts as model state, and every walk that finds it or what holds it.

Model state is every Keras object that can hold an old model's tensors: models, layers, the
functional API's symbolic tensors, optimizers, metrics, losses, callbacks and variables (Keras
3's, legacy tf-keras's, TensorFlow's). Nothing here imports Keras or TensorFlow: classes are
looked up in ``sys.modules`` and objects judged by ``type(obj)`` alone (``isinstance`` may run
user code through ``__class__``).

A walk never calls a user object's methods: containers are read through the built-in types'
own protocols, instances through ``object.__getattribute__`` of their ``__dict__``, the rest
through what the C types expose to the collector (``gc.get_referents``). Per cell: the near walk
(the names, two levels into their containers), ``count_models`` and the reads walk
(``GlobalReads``, for the rebinding rule). On demand: what kept names reach (``reachable``),
paths to a holder (``paths_to``), what a rebound name holds (``models_under``, ``strip``), what
a model reaches (``own_objects``) and owns through Keras's guarded API (``owned``, ``held_by``).
Paths to a holder, what a rebound name holds, what a model reaches, the ``tf.function`` search
and a tensor's upstream graph all walk down through ``descend``, each with its own children.
"""

from __future__ import annotations

import dis
import functools
import gc
import math
import re
import sys
import types as pytypes
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from kerasmagic.compat.registry import broken, works
from kerasmagic.imports import user_module
from kerasmagic.units import fmt_bytes

# kind -> its classes, "module:attribute.path" each (Keras 3's, tf-keras's, TensorFlow's). The
# order decides: tf-keras's Metric is a Layer, Keras's Model is a Layer: the first kind names it.
KINDS: tuple[tuple[str, str], ...] = (
    ("model", "keras:Model tf_keras:Model"),
    ("metric", "keras:metrics.Metric tf_keras:metrics.Metric"),
    ("layer", "keras:layers.Layer tf_keras:layers.Layer"),
    ("tensor", "keras:KerasTensor tf_keras.src.engine.keras_tensor:KerasTensor"),
    ("optimizer", "keras:optimizers.Optimizer tf_keras:optimizers.Optimizer"),
    ("optimizer", "tf_keras.src.optimizers.legacy.optimizer_v2:OptimizerV2"),
    ("loss", "keras:losses.Loss tf_keras:losses.Loss"),
    ("callback", "keras:callbacks.Callback tf_keras:callbacks.Callback"),
    ("variable", "keras.src.backend.common.variables:Variable"),
    ("variable", "keras.src.backend.common.variables:KerasVariable"),  # Keras before 3.6
    ("variable", "tensorflow.python.ops.variables:Variable"),
)


def _classes(kind: str) -> tuple[type, ...]:
    found = []
    for spec in " ".join(specs for name, specs in KINDS if name == kind).split():
        module, path = spec.split(":")
        obj: Any = sys.modules.get(module)
        if module.endswith("common.variables") and not works("keras.variables"):
            continue  # moved: said once, by compat
        for attr in path.split("."):
            obj = getattr(obj, attr, None)
        if isinstance(obj, type):
            found.append(obj)
    return tuple(found)


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
        if kind not in self._kinds:
            found = (name for name, classes in self.by_kind if issubclass(kind, classes))
            self._kinds[kind] = next(found, None)
        return self._kinds[kind]


def state_types() -> StateTypes:
    """Return the model-state classes of what is imported now (cheap: a few lookups)."""
    by_kind = tuple((kind, _classes(kind)) for kind in dict(KINDS))
    kinds = dict(by_kind)
    every = tuple(c for _, classes in by_kind for c in classes)
    return StateTypes(by_kind, kinds["model"], kinds["callback"], every)


def is_a(obj: Any, types: tuple[type, ...]) -> bool:
    """Return ``isinstance(obj, types)`` judged by ``type(obj)`` alone (``isinstance`` reads
    ``obj.__class__``: a dead ``weakref.proxy`` raises, a lazy proxy may run anything)."""
    return bool(types) and issubclass(type(obj), types)


def instance_dict(obj: Any) -> dict[str, Any] | None:
    """Return an instance's own ``__dict__`` through the C slot of its classes (no property or
    ``__getattr__`` runs), else None (slots only, a class, a ``__dict__`` of the user's)."""
    for klass in _MRO.__get__(type(obj)):
        slot = _CLASS_DICT.__get__(klass).get("__dict__")
        if type(slot) in _C_DICTS:  # a member: SimpleNamespace's
            try:
                attrs = slot.__get__(obj)
            except Exception:
                return None
            return attrs if type(attrs) is dict else None
        if slot is not None:  # a class of the user's own making defines __dict__: leave it
            return None
    return None


def callback_model(callback: Any) -> Any:
    """Return the model a callback (or ``History``) points at, without Keras's property logic."""
    attrs = instance_dict(callback) or {}
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
    dunder = type(name) is str and name.startswith("__") and name.endswith("__")
    return type(name) is str and not (_NOT_USER.match(name) or dunder)


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
MAX_NODES = 10_000  # functional-graph nodes followed upstream of one tensor

# Never walked into: everything shares them (a function's globals are the namespace itself).
_ROUTINES = (pytypes.FunctionType, pytypes.BuiltinFunctionType, pytypes.MethodType)
_SHARED = (type, pytypes.ModuleType, pytypes.FrameType, pytypes.CodeType)
_WEAK = (weakref.ref, weakref.ProxyType, weakref.CallableProxyType)
OPAQUE: tuple[type, ...] = (*_SHARED, *_ROUTINES, pytypes.TracebackType, *_WEAK)
CONTAINERS = frozenset({list, tuple, dict, set, frozenset})
_ITEM_FORMATS: dict[Any, str] = {list: "[{}]", tuple: "[{}]", set: "{{{}}}", frozenset: "{{{}}}"}
_PLAIN_KEYS = frozenset({str, int, float, bool, bytes, type(None)})
_MODULE_DICT: Any = vars(pytypes.ModuleType)["__dict__"]  # past a subclass's own __dict__
_CLASS_DICT: Any = vars(type)["__dict__"]  # a class's own dict, past a metaclass's
_MRO: Any = vars(type)["__mro__"]
_C_DICTS = (pytypes.GetSetDescriptorType, pytypes.MemberDescriptorType)


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
    if issubclass(kind, dict):
        return [(f"[{safe_key(k)}]", v) for k, v in islice(dict.items(obj), limit)]
    base = next((b for b in _ITEM_FORMATS if issubclass(kind, b)), None)
    if base is not None:
        items, fmt = base.__iter__(obj), _ITEM_FORMATS[base]
    elif (array := object_array(obj)) is not None:
        items, fmt = array.flat, "[{}]" if array.ndim == 1 else ".flat[{}]"
    else:
        return None
    return [(fmt.format(i), v) for i, v in enumerate(islice(items, limit))]


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


def user_parts(obj: Any) -> tuple[dict[str, Any] | None, list[tuple[str, Any, Any]]]:
    """Return the ``__dict__`` of an instance of a user class and ``[(name, descriptor,
    value)]`` of its set slots (``@dataclass(slots=True)``), read through the C descriptors and
    no user code; ``(None, [])`` for anything else."""
    kind = type(obj)
    if issubclass(kind, type) or not user_class(kind):
        return None, []
    slots: list[tuple[str, Any, Any]] = []
    for klass in _MRO.__get__(kind):
        for name, slot in _CLASS_DICT.__get__(klass).items():
            if type(slot) is pytypes.MemberDescriptorType and name != "__dict__":
                try:
                    slots.append((name, slot, slot.__get__(obj, kind)))
                except AttributeError:  # a slot never set
                    continue
    return instance_dict(obj), slots


def contents(obj: Any, limit: int = NEAR_ITEMS) -> list[tuple[str, Any]]:
    """Return what a rebound or searched object holds: a user object's attributes (``.name``,
    slots too), else a container's items (``[i]``), else nothing."""
    attrs, slots = user_parts(obj)
    if attrs is not None or slots:
        found = [(f".{key}", value) for key, value in (attrs or {}).items()]
        return found + [(f".{name}", value) for name, _, value in slots]
    return items_of(obj, limit) or []


def _cells(fn: pytypes.FunctionType) -> Iterator[Any]:
    """Yield the contents of a function's closure cells (empty ones skipped)."""
    for cell in fn.__closure__ or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue


def module_dicts() -> dict[int, str]:
    """Return ``{id(module.__dict__): name}`` for the imported modules (lazy ones included,
    without running their code)."""
    return {
        id(_MODULE_DICT.__get__(module)): name
        for name, module in list(sys.modules.items())
        if issubclass(type(module), pytypes.ModuleType) and type(name) is str
    }


def descend(
    roots: Iterable[tuple[str, Any]],
    children: Callable[[Any], Iterable[tuple[str, Any]]],
    depth: float,
    seen: set[int] | None = None,
    limit: int = 0,
) -> Iterator[tuple[str, Any]]:
    """The one walk down from holders to what they hold: yield ``(path, object)`` for each of
    the ``(path, object)`` roots and, depth first and in order, what ``children(object)``
    gives (``[(suffix, child)]``), up to ``depth`` levels down. With ``seen`` (ids), each
    object once, and none past ``limit`` objects seen."""
    stack = [(path, obj, 0) for path, obj in reversed(list(roots))]
    while stack:
        path, obj, level = stack.pop()
        if seen is not None:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if len(seen) > limit:
                return
        yield path, obj
        if level < depth:
            stack.extend((path + s, c, level + 1) for s, c in reversed(list(children(obj))))


def closure_objects(obj: Any, depth: int, containers: bool = False) -> Iterator[Any]:
    """Yield ``obj`` and what it holds ``depth`` levels down: a Python function's closure
    contents and, with ``containers``, the items of lists, tuples, dicts and sets (TF's gradient
    functions close over their graph's tensors; Keras's ``train_function`` over a
    ``tf.function``: found by reading closure cells, never by calling anything)."""

    def inside(item: Any) -> Iterable[tuple[str, Any]]:
        if type(item) is pytypes.FunctionType:
            return [("", cell) for cell in _cells(item)]
        return (items_of(item) or ()) if containers else ()

    return (found for _, found in descend([("", obj)], inside, depth))


# -- the near walk: per cell, from the names, two levels into their containers ------------------


def walk(
    path: str, obj: Any, callbacks: tuple[type, ...], depth: int = 0
) -> Iterator[tuple[str, Any, bool]]:
    """Yield ``(path, object, linked)`` for ``obj``, its container items and callbacks' models
    (``linked``: reached through a callback's ``.model``)."""
    yield path, obj, False
    if is_a(obj, callbacks):
        model = callback_model(obj)
        if model is not None:
            yield f"{path}.model", model, True
    elif depth < NEAR_DEPTH:
        for suffix, item in items_of(obj) or ():
            yield from walk(path + suffix, item, callbacks, depth + 1)


class NearWalks:
    """Each object's near walk, taken once for one cleanup plan, which asks about the same
    objects under many names (``model``, ``Out[7]``, ``_7``, ``_``). It holds every object it
    walked, so it lives only while the plan is made."""

    def __init__(self, callbacks: tuple[type, ...]) -> None:
        self._callbacks = callbacks
        self._walks: dict[int, tuple[Any, list[tuple[str, Any, bool]]]] = {}

    def state(self, path: str, obj: Any, types: tuple[type, ...]) -> list[tuple[str, Any]]:
        """Return ``(path, object)`` for the objects of ``types`` in ``obj`` and its containers
        (not through a callback's ``.model`` link)."""
        if id(obj) not in self._walks:  # the object is kept with its walk: its id stays its own
            self._walks[id(obj)] = (obj, list(walk("", obj, self._callbacks)))
        walked = self._walks[id(obj)][1]
        return [(path + s, o) for s, o, link in walked if not link and is_a(o, types)]


def instances_near(namespace: Mapping[str, Any], cls: type) -> list[tuple[str, Any]]:
    """Return ``(first path, object)`` for each instance of ``cls`` bound to a user name or one
    level in: a container's item, an instance's attribute, what a function names or closes
    over (a ``tf.function`` a training helper calls)."""

    def inside(value: Any) -> Iterable[tuple[str, Any]]:
        if issubclass(type(value), cls):
            return ()
        if type(value) is pytypes.FunctionType:  # the globals its code names, its closure
            names = islice(value.__code__.co_names, NEAR_ITEMS)
            named = [(f"→{n}", value.__globals__[n]) for n in names if n in value.__globals__]
            return named + [("→<closure>", content) for content in _cells(value)]
        # an instance's attributes through the C slot: no property or __getattr__ runs
        attrs = dict.items(instance_dict(value) or {})
        return items_of(value) or [(f".{key}", item) for key, item in attrs]

    roots = [(name, namespace.get(name)) for name in list(namespace) if is_user_name(name)]
    found: dict[int, tuple[str, Any]] = {}
    for path, obj in descend(roots, inside, 1):
        if issubclass(type(obj), cls):
            found.setdefault(id(obj), (path, obj))
    return list(found.values())


_SKIPPED = SKIP - {"_oh"}  # IPython's input lists and the like; ``_oh`` is ``Out``, counted
_NEVER_MODELS = frozenset({str, bytes, int, float, bool, complex, type(None), type, *_ROUTINES})
_NEVER_MODELS |= {pytypes.ModuleType}


def count_models(namespace: Mapping[str, Any]) -> int:
    """Count the live models named in the notebook: those of ``live_model_objects`` reached
    from the names, ``Out``, callbacks' links and the attributes of the user's own objects
    (``trainer.model``), two levels in (without building paths).

    This runs after every cell (the live monitor), so it is a flat loop over one level at a
    time, not ``walk``, and looks at the first ``COUNT_ITEMS`` items of each container.
    """
    types, callbacks = model_types(), callback_types()
    if not types:
        return 0
    found: set[int] = set()
    # Not scan_order(): IPython adds an _iN name per cell, so a per-name check grows with the
    # session; judging the values alone by type skips them (strings) at a fraction of the cost
    # (10,000 cells in: 0.23 ms a cell, against 0.52 ms over the names and values).
    skipped = {id(namespace.get(name)) for name in _SKIPPED}
    values = list(namespace.values())
    level = [v for v in values if type(v) not in _NEVER_MODELS and id(v) not in skipped]
    users: dict[type, bool] = {}  # per kind: a class of the user's (``trainer.model`` counts)
    for depth in range(NEAR_DEPTH + 1):
        deeper: list[Any] = []
        for obj in level:
            kind = type(obj)
            if kind in CONTAINERS:
                if depth < NEAR_DEPTH:
                    deeper.extend(islice(obj.values() if kind is dict else obj, COUNT_ITEMS))
            elif kind in _NEVER_MODELS:
                continue
            elif issubclass(kind, types):
                found.add(id(obj))
            elif callbacks and issubclass(kind, callbacks):
                model = callback_model(obj)
                if is_a(model, types):
                    found.add(id(model))
            elif depth < NEAR_DEPTH:
                if kind not in users:
                    users[kind] = not issubclass(kind, type) and user_class(kind)
                if users[kind]:
                    deeper.extend(islice(dict.values(instance_dict(obj) or {}), COUNT_ITEMS))
        level = deeper
    return len(found)


# -- the reads walk: the globals the notebook's functions read, for the rebinding rule ----------

_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"})
_CALLABLES = (pytypes.FunctionType, pytypes.MethodType)
_WALKED = (*_CALLABLES, functools.partial, pytypes.CellType)  # their referents are walked
_SUSPENDED = (pytypes.GeneratorType, pytypes.CoroutineType, pytypes.AsyncGeneratorType)
_SUSPENDED_PREFIX = {pytypes.GeneratorType: "gi_", pytypes.CoroutineType: "cr_"}
_DESCRIPTORS = (staticmethod, classmethod, property)
_NOT_READ = (pytypes.ModuleType, pytypes.CodeType, pytypes.FrameType, pytypes.TracebackType)
_CONTAINER_TYPES = (list, tuple, dict, set, frozenset)


class TooMuch(Exception):
    """More objects than ``READS_VISITS``: the caller keeps what was not decided yet."""


class GlobalReads:
    """The globals read by what a cell used so far, grown one batch of names at a time.

    From a value, it walks to the notebook's functions it holds (those whose globals are the
    namespace) and collects the globals their code loads, stores or deletes. It follows what
    the collector sees: closures, defaults, ``__wrapped__``, bound methods, partials, container
    items, the attributes and class of objects of the user's own classes. An object of an
    installed package (a ``tf.function``, a ``LambdaCallback``) is looked into one step, for
    the functions it stores. No user code runs; past ``READS_VISITS`` objects: ``TooMuch``.
    """

    def __init__(self, ns: Mapping[str, Any]) -> None:
        self.ns = ns
        self.names: set[str] = set()
        self.followed: set[str] = set()  # namespace names whose values were walked
        self.seen: set[int] = {id(ns), *module_dicts()}  # functions' globals: not walked
        self.models = model_types()
        self.limit = len(self.seen) + READS_VISITS
        self.owned: dict[type, bool] = {}

    def add(self, used: Iterable[str]) -> None:
        todo = list(used)
        while todo:
            name = todo.pop()
            self.names.add(name)
            if name in self.followed or name not in self.ns:
                continue
            self.followed.add(name)
            for code in self._codes(self.ns[name]):
                todo.extend(_globals_of(code) - self.names)

    def _codes(self, root: Any) -> Iterator[pytypes.CodeType]:
        """Yield the code of the notebook's functions ``root`` holds (see the class doc)."""
        stack: list[tuple[Any, int]] = [(root, 0)]
        while stack:
            obj, nesting = stack.pop()
            if id(obj) in self.seen:
                continue
            self.seen.add(id(obj))
            if len(self.seen) > self.limit:
                raise TooMuch
            kind = type(obj)
            if kind is pytypes.FunctionType and obj.__globals__ is self.ns:
                yield obj.__code__
            if issubclass(kind, _SUSPENDED):  # gi_, cr_ or ag_ frame and code
                prefix = _SUSPENDED_PREFIX.get(kind, "ag_")
                frame = getattr(obj, prefix + "frame")
                if frame is not None and frame.f_globals is self.ns:
                    yield getattr(obj, prefix + "code")
            elif issubclass(kind, _NOT_READ):
                continue
            elif self.models and issubclass(kind, self.models):
                if self._own(kind):  # a model's insides are Keras's; its methods are the user's
                    stack.append((kind, nesting))
                continue
            elif issubclass(kind, _CONTAINER_TYPES):
                if nesting < READS_NESTING:
                    items = dict.values(obj) if issubclass(kind, dict) else obj
                    tracked = islice(filter(gc.is_tracked, items), READS_ITEMS)
                    stack.extend((item, nesting + 1) for item in tracked)
                continue
            elif issubclass(kind, type):
                if not self._own(obj):
                    continue
            elif not issubclass(kind, _WALKED) and not self._own(kind):
                stack.extend((fn, nesting) for fn in _stored_functions(obj))
                continue
            stack.extend((ref, nesting) for ref in gc.get_referents(obj) if gc.is_tracked(ref))

    def _own(self, klass: type) -> bool:
        """Return whether ``klass`` is the user's: from the notebook or the user's modules."""
        if klass not in self.owned:
            attrs = _CLASS_DICT.__get__(klass)  # past a metaclass's own __dict__
            functions = (
                fn
                for value in attrs.values()
                for fn in (gc.get_referents(value) if type(value) in _DESCRIPTORS else (value,))
            )
            self.owned[klass] = user_class(klass) or any(
                type(fn) is pytypes.FunctionType and fn.__globals__ is self.ns for fn in functions
            )
        return self.owned[klass]


def _stored_functions(obj: Any) -> list[Any]:
    """The functions an object of an installed package stores in its attributes (a
    ``tf.function``'s Python function, a ``LambdaCallback``'s lambdas, ``__wrapped__``)."""
    out: list[Any] = []
    for ref in gc.get_referents(obj):
        values = dict.values(ref) if type(ref) is dict else (ref,)
        out.extend(v for v in values if issubclass(type(v), _CALLABLES))
    return out


@functools.lru_cache(maxsize=4096)
def _globals_of(code: pytypes.CodeType) -> frozenset[str]:
    """Return the global names ``code`` (and the code nested in it) loads, stores or deletes."""
    names: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        ops = dis.get_instructions(current)
        names.update(str(op.argval) for op in ops if op.opname in _GLOBAL_OPS)
        stack.extend(c for c in current.co_consts if type(c) is pytypes.CodeType)
    return frozenset(names)


# -- the deep walks, on demand (a cleanup plan, a report) ---------------------------------------


def live_model_objects(types: tuple[type, ...]) -> list[Any]:
    """Return every live Keras model: each model object the collector tracks, less the inner
    model a ``Sequential`` wraps (one model to its user). Every view counts these;
    ``count_models`` is their subset named in the notebook."""
    models = [obj for obj in gc.get_objects() if is_a(obj, types)]
    if not works("keras.sequential_inner"):  # moved: said once, by compat; listed twice
        return models
    inner = {id(getattr(m, "_functional", None)) for m in models}
    return [m for m in models if id(m) not in inner]


@dataclass(frozen=True)
class Reach:
    """What the roots reach: the ids of the state objects found (``models``; the walk stops at
    them) and of every object, whether the walk finished, each callback met with the label of
    its root, and the state objects (``found``)."""

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
    """Return what is reachable from the ``(label, root)`` pairs, at any depth.

    It follows ``gc.get_referents`` (container items, instance attributes) and the items of
    NumPy object arrays, which the collector does not see. It does not go into ``OPAQUE``
    objects, into ``models`` (the classes it stops at: their insides are theirs) or through a
    callback's ``.model`` (a link cleanup may cut); a callback is met, not stopped at. A bound
    method leads to its object (``predict = trainer.predict`` keeps the trainer).
    """
    seen: set[int] = {id(obj) for obj in skip}
    limit = len(seen) + max_visits
    found: dict[int, Any] = {}
    met: list[tuple[str, Any]] = []
    tracked, referents = gc.is_tracked, gc.get_referents  # the loop runs per object
    ndarray = getattr(sys.modules.get("numpy"), "ndarray", None)
    arrays = frozenset({ndarray}) if isinstance(ndarray, type) else frozenset()
    complete = True
    for label, root in roots:
        level = [root] if complete else []  # breadth first: one C call per level's referents
        while level and complete:
            expand: list[Any] = []
            deeper: list[Any] = []
            for obj in level:
                key = id(obj)
                if key in seen:
                    continue
                seen.add(key)
                if len(seen) > limit:
                    complete = False
                    break
                kind = type(obj)
                if callbacks and issubclass(kind, callbacks):
                    met.append((label, obj))
                elif models and issubclass(kind, models):
                    found[key] = obj
                elif kind is pytypes.MethodType:  # predict = trainer.predict keeps the trainer
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
    return Reach(frozenset(found), frozenset(seen), complete, tuple(met), tuple(found.values()))


def _array_holdings(array: Any, wanted: tuple[type, ...], limit: int) -> list[Any]:
    """The items of an object array to walk: all that can hold something of a small one; of a
    big one (a column of 2M token lists), only the models and callbacks stored in it."""
    plain = object_array(array)
    items = [] if plain is None else list(islice(plain.flat, limit))
    if len(items) <= SMALL_ARRAY:
        return list(filter(gc.is_tracked, items))
    kinds = [kind for kind in set(map(type, items)) if wanted and issubclass(kind, wanted)]
    return [item for item in items if type(item) in kinds] if kinds else []


def paths_to(
    roots: Iterable[tuple[str, Any]],
    targets: set[int],
    callbacks: tuple[type, ...] = (),
    models: tuple[type, ...] = (),
) -> dict[int, str]:
    """Return ``{id: path}`` for each of ``targets`` found from the ``(name, value)`` roots:
    a holder deeper than the near walk looks (``log['runs'][3]['history'].model``), through
    containers, the user's objects, bound methods and callbacks' ``.model`` links; not into
    ``models`` nor past ``PATH_DEPTH``."""

    def inside(obj: Any) -> Iterable[tuple[str, Any]]:
        if is_a(obj, models):
            return ()
        if type(obj) is pytypes.MethodType:  # predict = model.predict keeps its model
            return [(".__self__", obj.__self__)]
        if is_a(obj, callbacks):
            model = callback_model(obj)
            return () if model is None else [(".model", model)]
        return contents(obj)

    found: dict[int, str] = {}
    for path, obj in descend(roots, inside, PATH_DEPTH, set(), PATH_VISITS):
        if id(obj) in targets:
            found[id(obj)] = path
            if len(found) == len(targets):
                break
    return found


def models_under(path: str, obj: Any, types: tuple[type, ...]) -> list[tuple[str, Any]]:
    """Return ``(path, model)`` for the models ``strip`` would reach from ``obj``: a rebound
    name's containers and user objects may hold old models several levels down
    (``runs[fold]["model"]``, ``trainer.model``). Both read ``contents``, ``REBOUND_DEPTH``
    levels, so what a report names as dropped is what is cut."""

    def inside(item: Any) -> Iterable[tuple[str, Any]]:
        return () if is_a(item, types) else contents(item)

    return [(p, o) for p, o in descend([(path, obj)], inside, REBOUND_DEPTH) if is_a(o, types)]


def strip(obj: Any, types: tuple[type, ...], kept: frozenset[int], depth: int = 0) -> Any:
    """Return ``obj`` with stale models replaced by None (lists, dicts, NumPy object arrays and
    the user's objects in place, tuples and frozensets rebuilt), written through the built-in
    types' own protocols, never a user method. Models, containers and objects a kept name also
    reaches stay as they are."""
    if is_a(obj, types):
        return obj if id(obj) in kept else None
    if depth >= REBOUND_DEPTH or id(obj) in kept:
        return obj

    def new(item: Any) -> Any:
        return strip(item, types, kept, depth + 1)

    kind = type(obj)
    attrs, slots = user_parts(obj)
    if attrs is not None or slots:
        for key, item in list((attrs or {}).items()):
            if attrs is not None and (value := new(item)) is not item:
                attrs[key] = value
        for _, slot, item in slots:  # @dataclass(slots=True): through the slot's descriptor
            if (value := new(item)) is not item:
                slot.__set__(obj, value)
    elif issubclass(kind, list):  # subclasses too, as models_under found them
        for i, item in enumerate(list(list.__iter__(obj))):
            if (value := new(item)) is not item:
                list.__setitem__(obj, i, value)
    elif issubclass(kind, dict):  # defaultdict, OrderedDict: an existing key's value
        for key, item in list(dict.items(obj)):
            if (value := new(item)) is not item:
                dict.__setitem__(obj, key, value)
    elif kind is tuple or (issubclass(kind, tuple) and hasattr(kind, "_fields")):
        items = [new(item) for item in tuple.__iter__(obj)]
        if any(value is not old for value, old in zip(items, obj, strict=True)):
            return kind(*items) if hasattr(kind, "_fields") else tuple(items)
    elif (array := object_array(obj)) is not None and array.flags.writeable:
        for i, item in enumerate(array.flat):
            if (value := new(item)) is not item:
                array.flat[i] = value
    elif kind in (set, frozenset):
        stale = [item for item in obj if is_a(item, types) and id(item) not in kept]
        if kind is set:
            obj.difference_update(stale)
        elif stale:
            return frozenset(obj.difference(stale))
    return obj


def own_objects(obj: Any, modules: Mapping[int, str]) -> set[int]:
    """Return the ids of what ``obj`` reaches, functions included, not going into modules
    (``modules``: the ids of their dicts), classes, code or frames, which everything shares: a
    referrer in there is part of the model (its layers, traced functions), not a holder."""

    def inside(item: Any) -> Iterable[tuple[str, Any]]:
        refs = filter(gc.is_tracked, gc.get_referents(item))
        return [("", r) for r in refs if id(r) not in modules and not issubclass(type(r), _SHARED)]

    seen: set[int] = set()
    for _ in descend([("", obj)], inside, math.inf, seen, OWN_VISITS):
        pass
    return seen


# -- what model state owns, read through Keras's API (guarded: Keras's code runs) ---------------


@dataclass(frozen=True)
class Owned:
    """The layers (and operations) some roots own, by id, and the ids of the rest they own:
    variables, optimizers, metrics."""

    layers: dict[int, Any]
    others: frozenset[int]

    def holds(self, obj: Any, kind: str | None) -> bool:
        """Return whether ``obj`` (model state of ``kind``) is owned: a tensor is when the
        layer that computed it is."""
        if id(obj) in self.layers or id(obj) in self.others:
            return True
        op = keras_history(obj)[0] if kind == "tensor" else None
        return op is not None and id(op) in self.layers


def guarded(read: Any, default: Any) -> Any:
    """Return ``read()``, or ``default`` when it raises (Keras's and the user's code runs)."""
    try:
        return read()
    except Exception:  # a half-built model, a user subclass whose property fails
        return default


def _weights(layer: Any) -> list[Any]:
    return list(guarded(lambda: list(layer.weights), []))


def keras_history(tensor: Any) -> tuple[Any, int]:
    """Return the operation that computed a symbolic tensor and its node index, or (None, 0)
    (a ``_keras_history`` of another shape: said once by ``compat``, owned by nothing known)."""
    history = getattr(tensor, "_keras_history", None)
    if not history or not works("keras.keras_history"):  # moved: said once, by compat
        return None, 0
    try:
        op, index = history[0], history[1]
    except Exception as exc:
        broken("keras.keras_history", f"changed KerasTensor._keras_history ({exc})")
        return None, 0
    return op, index if type(index) is int else 0


def layers_of(obj: Any) -> list[Any]:
    """Return a layer's (or model's) layers, itself included, at any depth (itself alone when
    Keras moved ``_flatten_layers``: said once, ``compat``)."""
    flatten = getattr(obj, "_flatten_layers", None)
    if flatten is None or not works("keras.flatten_layers"):
        return [obj]
    return list(guarded(lambda: list(flatten(include_self=True, recursive=True)), [obj]))


def upstream_layers(tensor: Any) -> list[Any]:
    """Return the layers a symbolic tensor was computed through (its functional graph)."""
    layer, node_index = keras_history(tensor)
    if layer is None:
        return []
    start = []
    if works("keras.outbound_nodes"):  # moved: said once, by compat; the layer alone
        start = [("", guarded(lambda: layer._inbound_nodes[node_index], None))]

    def parents(node: Any) -> Iterable[tuple[str, Any]]:
        return [("", parent) for parent in guarded(lambda: list(node.parent_nodes), [])]

    nodes = descend(start, parents, MAX_NODES, set(), MAX_NODES)
    ops = (getattr(node, "operation", None) or getattr(node, "layer", None) for _, node in nodes)
    return list({id(op): op for op in (layer, *ops) if op is not None}.values())


def _layers_held(obj: Any, kind: str | None, operations: bool = False) -> list[Any]:
    """Return the layers model state of ``kind`` holds: a tensor's upstream ones, a layer's
    own; with ``operations``, a functional model's ``keras.ops`` calls (``expand_dims``) too."""
    if kind == "tensor":
        found = (x for layer in upstream_layers(obj) for x in layers_of(layer))
        return list({id(x): x for x in found}.values())
    if kind not in ("model", "layer", "metric"):
        return []
    layers = layers_of(obj)
    for layer in list(layers) if operations else ():
        if isinstance(getattr(type(layer), "operations", None), property):
            layers.extend(guarded(lambda x=layer: list(x.operations), []))
    return layers


def owned(roots: Iterable[Any], types: StateTypes) -> Owned:
    """Return what ``roots`` (kept models, layers, tensors, optimizers) own."""
    layers: dict[int, Any] = {}
    others: set[int] = set()
    for root in roots:
        kind = types.kind(type(root))
        layers.update((id(x), x) for x in _layers_held(root, kind, operations=True))
        if kind == "model":
            optimizer = guarded(lambda r=root: r.optimizer, None)
            if optimizer is not None:
                others.add(id(optimizer))
                others.update(id(v) for v in guarded(lambda o=optimizer: list(o.variables), []))
            others.update(id(m) for m in guarded(lambda r=root: list(r.metrics), []))
    wrapped = bool(layers) and works("keras.variables")  # moved: said once; the outer ones alone
    for layer in layers.values():
        for variable in _weights(layer):  # and the tf.Variable each Keras variable wraps, on TF
            inner = getattr(variable, "_value", None) if wrapped else None
            others.update({id(variable)} if inner is None else {id(variable), id(inner)})
    return Owned(layers, frozenset(others))


def outbound_nodes(layer: Any) -> list[Any] | None:
    """Return the list in which a layer records every later call on its outputs (Keras 3's
    ``_outbound_nodes``, tf-keras's ``_outbound_nodes_value``), or None."""
    attrs = instance_dict(layer) or {}
    for name in ("_outbound_nodes", "_outbound_nodes_value"):
        found = attrs.get(name)
        if issubclass(type(found), list):  # TF's tracking wraps a layer's lists in a subclass
            return found
    return None


def node_layer(node: Any) -> Any:
    """Return the layer a functional-graph node is a call of (Keras 3 or tf-keras)."""
    attrs = instance_dict(node) or {}
    return attrs.get("operation", attrs.get("layer"))


def variables_bytes(variables: Iterable[Any]) -> int:
    """Return the bytes of distinct variables (by shape and dtype; unknown shapes count 0)."""
    total = 0
    for var in {id(v): v for v in variables}.values():
        try:
            count = math.prod(int(d) for d in var.shape)
            size = getattr(var.dtype, "size", None)  # tf.DType
            if not isinstance(size, int):
                import numpy as np

                size = int(np.dtype(str(var.dtype)).itemsize)
            total += count * size
        except (TypeError, ValueError):  # unknown shape or exotic dtype
            continue
    return total


def model_size_bytes(model: Any) -> int:
    """Return the bytes of a model's weights plus its optimizer's variables."""
    variables = list(getattr(model, "weights", []))
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        variables += list(getattr(optimizer, "variables", []) or [])
    return variables_bytes(variables)


@dataclass(frozen=True)
class Held:
    """What one piece of model state holds: its kind, class, layers with weights, bytes."""

    kind: str
    type: str
    layers: int
    size_bytes: int

    def describe(self) -> str:
        """Return it in words: ``a KerasTensor holding 3 layers, 9.8 MB``, ``a Dense layer,
        2.3 MB``, ``a variable, 4.0 KB``."""
        size, plural = fmt_bytes(self.size_bytes), "" if self.layers == 1 else "s"
        if self.kind == "tensor" and not self.layers:
            return "a KerasTensor, no weights"
        if self.kind == "tensor":
            return f"a KerasTensor holding {self.layers} layer{plural}, {size}"
        if self.kind in ("layer", "metric"):
            return f"a {self.type} {self.kind}, {size}"
        if self.kind == "optimizer":
            return f"an optimizer ({self.type}), {size}"
        if self.kind in ("variable", "model"):
            return f"a {self.kind}, {size}"
        return f"a {self.type}"


def held_by(obj: Any, kind: str, kept: Owned | None = None) -> Held:
    """Return what ``obj``, model state of ``kind``, holds beside what ``kept`` state owns."""
    layers = _layers_held(obj, kind)
    if kept is not None:
        layers = [x for x in layers if id(x) not in kept.layers]
    weighted = [x for x in layers if _weights(x)]
    if kind == "optimizer":
        size = variables_bytes(guarded(lambda: list(obj.variables), []))
    elif kind == "variable":
        size = variables_bytes([obj])
    else:
        size = variables_bytes(w for x in weighted for w in _weights(x))
    return Held(kind, type(obj).__name__, len(weighted), size)
