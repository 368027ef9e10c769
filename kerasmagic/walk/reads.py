"""What the notebook's code reads: a visitor of the walk for ``cells.reads``'s rule.

From a value, it walks to the notebook's functions it holds (those whose globals are the
namespace) and collects the globals their code loads, stores or deletes. The walk follows what
the garbage collector sees (``gc.get_referents``): closures, defaults, ``__wrapped__``, bound
methods, partials' functions and arguments, the items of containers, the attributes and class
of objects of the user's own classes. An object of an installed package (a ``tf.function``, a
``LambdaCallback``) is looked into one step, for the functions it stores. No user code runs;
past ``READS_VISITS`` objects it raises ``TooMuch``.
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

from kerasmagic.walk.children import READS_ITEMS as MAX_ITEMS
from kerasmagic.walk.children import READS_NESTING as MAX_NESTING
from kerasmagic.walk.children import READS_VISITS as MAX_VISITS
from kerasmagic.walk.children import module_dicts
from kerasmagic.walk.state import model_types, user_class

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
    """The globals read by what a cell used so far, grown one batch of names at a time."""

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
        """Yield the code of the notebook's functions ``root`` holds (see the module doc)."""
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
