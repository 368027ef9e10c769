"""The walks run per cell, from the namespace's names and bounded so that they stay cheap.

The near walk: the namespace's names and two levels into their containers. It yields every
object on the way with its path (``results['cv'][2]``) and follows a callback's ``.model`` link;
``NearWalks`` keeps each object's walk for one cleanup plan, which asks about the same objects
under many names (``model``, ``Out[7]``, ``_``); ``count_models`` is the same walk reduced to a
count, for the figure taken after every cell; ``instances_near`` the one-level search for
instances of one class (the ``tf.function`` objects whose traces a cleanup clears).

The reads walk (``GlobalReads``): the globals the notebook's functions read, for the rebinding
rule of ``%%fresh_model`` (``cells.rebinding``).
"""

from __future__ import annotations

import dis
import functools
import gc
import types as pytypes
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Any

from kerasmagic.walk.state import (
    CONTAINERS,
    COUNT_ITEMS,
    NEAR_DEPTH,
    SKIP,
    attributes,
    callback_model,
    callback_types,
    function_refs,
    is_a,
    is_user_name,
    items_of,
    model_types,
    module_dicts,
    user_class,
)
from kerasmagic.walk.state import READS_ITEMS as MAX_ITEMS
from kerasmagic.walk.state import READS_NESTING as MAX_NESTING
from kerasmagic.walk.state import READS_VISITS as MAX_VISITS


def walk(
    path: str, obj: Any, callbacks: tuple[type, ...], depth: int = 0, max_depth: int = NEAR_DEPTH
) -> Iterator[tuple[str, Any]]:
    """Yield ``(path, object)`` for ``obj``, its container items and callbacks' models."""
    for found_path, found, _ in _walk(path, obj, callbacks, depth, max_depth):
        yield found_path, found


def _walk(
    path: str, obj: Any, callbacks: tuple[type, ...], depth: int, max_depth: int
) -> Iterator[tuple[str, Any, bool]]:
    """``walk``, each entry saying whether it was reached through a callback's link."""
    yield path, obj, False
    if is_a(obj, callbacks):
        model = callback_model(obj)
        if model is not None:
            yield f"{path}.model", model, True
        return
    if depth >= max_depth:
        return
    for suffix, item in items_of(obj) or ():
        yield from _walk(path + suffix, item, callbacks, depth + 1, max_depth)


class NearWalks:
    """Each object's near walk, taken once for one cleanup plan: the plan asks about the same
    objects under many names (``model``, ``Out[7]``, ``_7``, ``_``, the display hook's ``_``).
    It holds every object it walked, so it lives only while the plan is made."""

    def __init__(self, callbacks: tuple[type, ...]) -> None:
        self._callbacks = callbacks
        self._walks: dict[int, tuple[Any, list[tuple[str, Any, bool]]]] = {}

    def _walk(self, obj: Any) -> list[tuple[str, Any, bool]]:
        """Return ``(suffix, object, through a callback's link)`` for ``obj``'s near walk."""
        done = self._walks.get(id(obj))
        if done is None:  # the object is kept with its walk: its id stays its own
            done = self._walks[id(obj)] = (
                obj,
                list(_walk("", obj, self._callbacks, 0, NEAR_DEPTH)),
            )
        return done[1]

    def state(self, path: str, obj: Any, types: tuple[type, ...]) -> list[tuple[str, Any]]:
        """Return ``(path, object)`` for the objects of ``types`` in ``obj`` and its containers
        (not through a callback's ``.model`` link)."""
        return [
            (path + suffix, found)
            for suffix, found, link in self._walk(obj)
            if not link and is_a(found, types)
        ]

    def callbacks(self, path: str, obj: Any) -> list[tuple[str, Any]]:
        """Return ``(path, callback)`` for the callbacks in ``obj`` and its containers."""
        return [
            (path + suffix, found)
            for suffix, found, link in self._walk(obj)
            if not link and is_a(found, self._callbacks)
        ]


def _one_level(value: Any) -> list[tuple[str, Any]]:
    """Return (suffix, item) one level into a container, an instance or a function (the
    globals it names and its closure: what it calls or closes over)."""
    if type(value) is pytypes.FunctionType:
        return function_refs(value)
    return items_of(value) or attributes(value)


def instances_near(namespace: Mapping[str, Any], cls: type) -> list[tuple[str, Any]]:
    """Return ``(first path, object)`` for each instance of ``cls`` bound to a user name or one
    level in: a container's item, an instance's attribute, what a function names or closes
    over (a ``tf.function`` a training helper calls)."""
    found: dict[int, tuple[str, Any]] = {}
    for name in [n for n in list(namespace) if is_user_name(n)]:
        value = namespace.get(name)
        if issubclass(type(value), cls):
            found.setdefault(id(value), (name, value))
            continue
        for suffix, item in _one_level(value):
            if issubclass(type(item), cls):
                found.setdefault(id(item), (name + suffix, item))
    return list(found.values())


def count_models(namespace: Mapping[str, Any]) -> int:
    """Count the live models named in the notebook: those of ``deep.live_model_objects`` that
    ``walk`` reaches from the names, ``Out`` and callbacks' links (without building paths).

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
    level: list[Any] = [
        obj
        for obj in list(namespace.values())
        if type(obj) not in _NEVER_MODELS and id(obj) not in skipped
    ]
    for depth in range(NEAR_DEPTH + 1):
        deeper: list[Any] = []
        for obj in level:
            kind = type(obj)
            if kind in CONTAINERS:
                if depth < NEAR_DEPTH:
                    deeper.extend(islice(obj.values() if kind is dict else obj, COUNT_ITEMS))
            elif issubclass(kind, types):
                found.add(id(obj))
            elif callbacks and issubclass(kind, callbacks):
                model = callback_model(obj)
                if is_a(model, types):
                    found.add(id(model))
        level = deeper
    return len(found)


_SKIPPED = SKIP - {"_oh"}  # IPython's input lists and the like; ``_oh`` is ``Out``, counted
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


_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"})
_CONTAINERS = (list, tuple, dict, set, frozenset)
_CALLABLES = (pytypes.FunctionType, pytypes.MethodType)
_WALKED = (*_CALLABLES, functools.partial, pytypes.CellType)  # their referents are walked
_OPAQUE = (pytypes.ModuleType, pytypes.CodeType, pytypes.FrameType, pytypes.TracebackType)
_SUSPENDED = (pytypes.GeneratorType, pytypes.CoroutineType, pytypes.AsyncGeneratorType)
_cache: OrderedDict[pytypes.CodeType, frozenset[str]] = OrderedDict()
MAX_CACHED = 4_096


class TooMuch(Exception):
    """More objects than ``READS_VISITS``: the caller keeps what was not decided yet."""


class GlobalReads:
    """The globals read by what a cell used so far, grown one batch of names at a time.

    From a value, it walks to the notebook's functions it holds (those whose globals are the
    namespace) and collects the globals their code loads, stores or deletes. The walk follows
    what the garbage collector sees (``gc.get_referents``): closures, defaults,
    ``__wrapped__``, bound methods, partials' functions and arguments, the items of containers,
    the attributes and class of objects of the user's own classes. An object of an installed
    package (a ``tf.function``, a ``LambdaCallback``) is looked into one step, for the
    functions it stores. No user code runs; past ``READS_VISITS`` objects it raises
    ``TooMuch``.
    """

    def __init__(self, ns: Mapping[str, Any]) -> None:
        self.ns = ns
        self.names: set[str] = set()
        self.followed: set[str] = set()  # namespace names whose values were walked
        self.seen: set[int] = {id(ns), *module_dicts()}  # functions' globals: not walked
        self.models = model_types()
        self.visits = 0
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
            self.visits += 1
            if self.visits > MAX_VISITS:
                raise TooMuch
            kind = type(obj)
            if kind is pytypes.FunctionType and obj.__globals__ is self.ns:
                yield obj.__code__
            if issubclass(kind, _SUSPENDED):
                code, frame = _suspended(obj)
                if frame is not None and frame.f_globals is self.ns:
                    yield code
            elif issubclass(kind, _OPAQUE):
                continue
            elif self.models and issubclass(kind, self.models):
                if self._own(kind):  # a model's insides are Keras's; its methods are the user's
                    stack.append((kind, nesting))
                continue
            elif issubclass(kind, _CONTAINERS):
                if nesting < MAX_NESTING:
                    items = dict.values(obj) if issubclass(kind, dict) else obj
                    stack.extend((item, nesting + 1) for item in _tracked(items))
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
        owned = self.owned.get(klass)
        if owned is None:
            owned = self.owned[klass] = self._defined_here(klass)
        return owned

    def _defined_here(self, klass: type) -> bool:
        if user_class(klass):
            return True
        attrs = _CLASS_DICT.__get__(klass)  # past a metaclass's own __dict__
        functions = (
            fn
            for value in attrs.values()
            for fn in (gc.get_referents(value) if type(value) in _DESCRIPTORS else (value,))
        )
        return any(
            type(fn) is pytypes.FunctionType and fn.__globals__ is self.ns for fn in functions
        )


_CLASS_DICT = vars(type)["__dict__"]
_DESCRIPTORS = (staticmethod, classmethod, property)


def _tracked(items: Iterable[Any]) -> Iterator[Any]:
    """The first ``MAX_ITEMS`` tracked items (a function is tracked, a number never)."""
    return islice(filter(gc.is_tracked, items), MAX_ITEMS)


def _stored_functions(obj: Any) -> list[Any]:
    """The functions an object of an installed package stores in its attributes (a
    ``tf.function``'s Python function, a ``LambdaCallback``'s lambdas, ``__wrapped__``)."""
    out: list[Any] = []
    for ref in gc.get_referents(obj):
        values = dict.values(ref) if type(ref) is dict else (ref,)
        out.extend(v for v in values if issubclass(type(v), _CALLABLES))
    return out


def _suspended(obj: Any) -> tuple[pytypes.CodeType, Any]:
    if type(obj) is pytypes.GeneratorType:
        return obj.gi_code, obj.gi_frame
    if type(obj) is pytypes.CoroutineType:
        return obj.cr_code, obj.cr_frame
    return obj.ag_code, obj.ag_frame


def _globals_of(code: pytypes.CodeType) -> frozenset[str]:
    """Return the global names ``code`` (and the code nested in it) loads, stores or deletes."""
    found = _cache.get(code)
    if found is None:
        names: set[str] = set()
        stack = [code]
        while stack:
            current = stack.pop()
            names.update(
                str(op.argval) for op in dis.get_instructions(current) if op.opname in _GLOBAL_OPS
            )
            stack.extend(c for c in current.co_consts if type(c) is pytypes.CodeType)
        found = frozenset(names)
        _cache[code] = found
        if len(_cache) > MAX_CACHED:
            _cache.popitem(last=False)
    else:
        _cache.move_to_end(code)
    return found
