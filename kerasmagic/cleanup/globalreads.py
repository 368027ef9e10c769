"""The notebook globals that functions from earlier cells read, for the rebinding rule.

``model = keep_training()``, where ``keep_training`` (an earlier cell) fits the global
``model``, reads ``model`` before rebinding it: dropping it first would leave the function a
``NameError`` and the user without the model. So each name a cell reads before rebinding a
name is resolved in the namespace, and the globals its code reads count as reads too: a
function defined in the notebook, a lambda, a bound method, a ``functools.partial``, a
decorated function (``__wrapped__``, or the functions in the wrapper's closure), a
``tf.function`` (its Python function), a class of the notebook (its methods) and an object of
one; through the notebook functions those read, and so on. Only code objects, closures and
dicts are looked at: no user code runs.
"""

from __future__ import annotations

import dis
import functools
import types as pytypes
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kerasmagic.cleanup.cellparse import Rebinding

MAX_CODES = 2_000  # code objects looked at per cell; past this every name counts as read
MAX_WRAPPING = 8  # decorators, partials and methods followed into one another
_FUNCTIONS = (pytypes.FunctionType, pytypes.MethodType, functools.partial)
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"})
_cache: OrderedDict[pytypes.CodeType, frozenset[str]] = OrderedDict()
MAX_CACHED = 4_096


class _TooMuchCode(Exception):
    pass


def rebound_now(ns: Mapping[str, Any], rebinding: Rebinding) -> frozenset[str]:
    """Return the names of ``rebinding`` that nothing the cell uses before reads first."""
    reads = _Reads(ns)
    done = 0
    out: set[str] = set()
    try:
        for name in sorted(rebinding.names, key=lambda n: rebinding.read_before.get(n, 0)):
            upto = rebinding.read_before.get(name, 0)
            reads.add(rebinding.read_order[done:upto])
            done = upto
            if name not in reads.names:
                out.add(name)
    except _TooMuchCode:  # a notebook too large to follow: keep what was not decided yet
        pass
    return frozenset(out)


class _Reads:
    """The globals read by what a cell used so far, grown one batch of names at a time."""

    def __init__(self, ns: Mapping[str, Any]) -> None:
        self.ns = ns
        self.names: set[str] = set()
        self.followed: set[str] = set()  # namespace names whose values were looked into
        self.codes = 0

    def add(self, used: Iterable[str]) -> None:
        todo = list(used)
        while todo:
            name = todo.pop()
            self.names.add(name)
            if name in self.followed:
                continue
            self.followed.add(name)
            for code in _codes_of(self.ns.get(name), self.ns):
                self.codes += 1
                if self.codes > MAX_CODES:
                    raise _TooMuchCode
                todo.extend(_globals_of(code) - self.names)


def _codes_of(obj: Any, ns: Mapping[str, Any], depth: int = 0) -> Iterator[pytypes.CodeType]:
    """Yield the code objects of the notebook's functions that ``obj`` runs when used."""
    if depth > MAX_WRAPPING:
        return
    kind = type(obj)
    inner = _wrapped(obj)
    if kind is pytypes.FunctionType:
        if obj.__globals__ is ns:
            yield obj.__code__
    elif not inner:  # a class of the notebook, or an object of one: its methods
        klass = obj if issubclass(kind, type) else kind
        try:
            mro = type.__getattribute__(klass, "__mro__")
        except Exception:
            return
        for base in mro:
            if _own_class(base, ns):
                for method in _methods(base):
                    yield from _codes_of(method, ns, depth + 1)
    for item in inner:
        yield from _codes_of(item, ns, depth + 1)


def _wrapped(obj: Any) -> list[Any]:
    """Return what ``obj`` calls when it wraps a function: a bound method's function, a
    partial's, a decorator's (``__wrapped__``, or a function in its closure), a
    ``tf.function``'s Python function."""
    kind = type(obj)
    if kind is pytypes.MethodType:
        return [obj.__func__]
    if kind is functools.partial:
        return [obj.func]
    out = []
    if kind is pytypes.FunctionType:
        for cell in obj.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # a closure variable not bound yet
                continue
            if type(value) in _FUNCTIONS:
                out.append(value)
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except Exception:
        attrs = None
    if type(attrs) is dict:
        out.extend(attrs[key] for key in ("__wrapped__", "_python_function") if key in attrs)
    return out


def _own_class(klass: type, ns: Mapping[str, Any]) -> bool:
    """Return whether ``klass`` was defined in the notebook (its methods' globals are ``ns``)."""
    return any(
        type(value) is pytypes.FunctionType and value.__globals__ is ns for value in _methods(klass)
    )


def _methods(klass: type) -> Iterator[Any]:
    for value in _class_dict(klass).values():
        if type(value) in (staticmethod, classmethod):
            value = value.__func__
        elif type(value) is property:
            value = value.fget
        if type(value) in _FUNCTIONS:
            yield value


def _class_dict(klass: type) -> Mapping[str, Any]:
    try:
        attrs = type.__getattribute__(klass, "__dict__")
    except Exception:
        return {}
    return attrs if isinstance(attrs, Mapping) else {}


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
