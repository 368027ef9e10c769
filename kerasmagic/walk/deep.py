"""The deep walks, on demand (a cleanup plan, a report), where ``near`` stops two levels in.

What a live model is (``live_model_objects``): the one definition every view counts by.
What kept names reach at any depth (``reachable``), a path to a holder found deep
(``paths_to``), the models a rebound name's value holds and that value without them
(``models_under``, ``strip``), what a model reaches itself (``own_objects``), and what model
state owns read through Keras's own API (``owned``, ``held_by``): a kept model's layers,
variables, optimizer and metrics, the layers upstream of a symbolic tensor, and their bytes.
Keras's methods run only in that last part, never the user's: every read there is guarded, and
a model that cannot be read owns nothing known.
"""

from __future__ import annotations

import gc
import math
import sys
import types as pytypes
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from types import MethodType
from typing import Any

from kerasmagic.compat.registry import broken, works
from kerasmagic.units import fmt_bytes
from kerasmagic.walk.state import (
    OPAQUE,
    OWN_VISITS,
    PATH_DEPTH,
    PATH_VISITS,
    REACH_VISITS,
    REBOUND_DEPTH,
    SMALL_ARRAY,
    StateTypes,
    callback_model,
    contents,
    instance_dict,
    is_a,
    object_array,
    user_attrs,
    user_slots,
)


def live_model_objects(types: tuple[type, ...]) -> list[Any]:
    """Return every live Keras model: each model object the garbage collector tracks, less the
    inner model a ``Sequential`` wraps (one model to its user). Every view counts these; the
    figure taken after every cell (``near.count_models``) is their subset named in the
    notebook: under its names, two levels into their containers, ``Out``, a callback's link."""
    models = [obj for obj in gc.get_objects() if is_a(obj, types)]
    if not works("keras.sequential_inner"):  # moved: said once, by compat; listed twice
        return models
    inner = {id(getattr(m, "_functional", None)) for m in models}
    return [m for m in models if id(m) not in inner]


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
    """Return what is reachable from the ``(label, root)`` pairs: which models the user still
    holds, at any depth.

    The walk follows what the C types expose to the garbage collector (``gc.get_referents``):
    container items and instance attributes (``__dict__`` and slots), and the items of NumPy
    arrays of objects (a pandas column of models), which the collector does not see. It does
    not go into functions, classes, modules or frames (a function's globals are the namespace
    itself), into models (their insides are theirs) or through a callback's ``.model`` (a link
    that cleanup may cut); a bound method leads to its object (``predict = trainer.predict``
    keeps the trainer). ``models`` are the classes the walk stops at (models, or all model
    state); a callback is met, not stopped at, even when its class is among them.
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
    plain = object_array(array)
    items = [] if plain is None else list(islice(plain.flat, limit))
    if len(items) <= SMALL_ARRAY:
        return list(filter(gc.is_tracked, items))
    kinds = [kind for kind in set(map(type, items)) if wanted and issubclass(kind, wanted)]
    return [item for item in items if type(item) in kinds] if kinds else []


def _children(obj: Any, callbacks: tuple[type, ...]) -> list[tuple[str, Any]]:
    if type(obj) is pytypes.MethodType:  # predict = model.predict keeps its model
        return [(".__self__", obj.__self__)]
    if is_a(obj, callbacks):
        model = callback_model(obj)
        return [] if model is None else [(".model", model)]
    return contents(obj)


def paths_to(
    roots: Iterable[tuple[str, Any]],
    targets: set[int],
    callbacks: tuple[type, ...] = (),
    models: tuple[type, ...] = (),
) -> dict[int, str]:
    """Return ``{id: path}`` for each of ``targets`` found from the ``(name, value)`` roots.

    The per-cell walks look two levels deep; a report or a deep scan that must name a holder
    found deeper (``log['exp']['runs'][3]['history'].model``) searches from its root name,
    through containers, the attributes of the user's own objects, bound methods and callbacks'
    ``.model`` links. It does not go into models (their insides are theirs) nor past
    ``PATH_DEPTH``.
    """
    found: dict[int, str] = {}
    seen: set[int] = set()
    for name, value in roots:
        stack: list[tuple[str, Any, int]] = [(name, value, 0)]
        while stack and len(found) < len(targets):
            path, obj, depth = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if len(seen) > PATH_VISITS:
                return found
            if id(obj) in targets:
                found[id(obj)] = path
            if depth >= PATH_DEPTH or is_a(obj, models):
                continue
            stack.extend(
                (path + suffix, child, depth + 1)
                for suffix, child in reversed(_children(obj, callbacks))
            )
    return found


def callback_labels(
    ns: Mapping[str, Any],
    deep: list[tuple[str, Any]],
    types: tuple[type, ...],
    cbs: tuple[type, ...],
) -> list[tuple[str, Any]]:
    """Label the ``(root name, callback)`` pairs by the path of their ``.model`` link
    (``results['folds'][3]['history'].model``), or by their root name past the search's reach."""
    if not deep:
        return []
    roots = [(r, ns[r]) for r in dict.fromkeys(root for root, _ in deep) if r in ns]
    paths = paths_to(roots, {id(obj) for _, obj in deep}, cbs, types)
    out = []
    for root, obj in deep:
        path = paths.get(id(obj))
        out.append((f"{path}.model" if path else f"a {type(obj).__name__} in {root}", obj))
    return out


def models_under(
    path: str, obj: Any, types: tuple[type, ...], depth: int = 0
) -> Iterator[tuple[str, Any]]:
    """Yield ``(path, model)`` for the models ``strip`` would reach from ``obj``.

    A name a cell binds again (``model = build()`` re-run) lets go of what it held, but a
    container or an object of the user's own classes bound to it may hold old models several
    levels down (``runs[fold]["model"]``, ``trainer.model``). This and ``strip`` read the same
    children (``contents``, ``REBOUND_DEPTH`` levels), so what a report names as dropped is
    what is cut.
    """
    if is_a(obj, types):
        yield path, obj
        return
    if depth >= REBOUND_DEPTH:
        return
    for suffix, item in contents(obj):
        yield from models_under(path + suffix, item, types, depth + 1)


def strip(obj: Any, types: tuple[type, ...], kept: frozenset[int], depth: int = 0) -> Any:
    """Return ``obj`` with stale models replaced by None (lists, dicts, NumPy object arrays and
    the user's objects in place, tuples and frozensets rebuilt), written through the built-in
    types' own protocols, never a user method. Models, containers and objects a kept name also
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


_SHARED = (type, pytypes.ModuleType, pytypes.FrameType, pytypes.CodeType)  # everyone's


def own_objects(obj: Any, modules: Mapping[int, str]) -> set[int]:
    """Return the ids of what ``obj`` reaches, not going into modules (``modules``: the ids of
    their dicts), classes, code or frames, which everything shares.

    A model reaches its layers, variables, traced functions and their closures: a referrer
    found in there is part of the model, not a holder of it (a report names only what holds a
    model from outside). Unlike the namespace walks this one goes into functions.
    """
    seen = {id(obj)}
    stack = [obj]
    while stack and len(seen) < OWN_VISITS:
        for ref in gc.get_referents(stack.pop()):
            key = id(ref)
            if key in seen or key in modules or not gc.is_tracked(ref):
                continue
            if not issubclass(type(ref), _SHARED):
                seen.add(key)
                stack.append(ref)
    return seen


MAX_NODES = 10_000  # functional-graph nodes followed upstream of one tensor


@dataclass(frozen=True)
class Owned:
    """Ids of the layers, variables and other state that some roots own."""

    layers: frozenset[int]
    variables: frozenset[int]
    others: frozenset[int]  # optimizers, metrics
    layer_objects: tuple[Any, ...] = ()

    def holds(self, obj: Any, kind: str | None) -> bool:
        """Return whether ``obj`` (model state of ``kind``) is owned: a tensor is when the
        layer that computed it is."""
        key = id(obj)
        if key in self.layers or key in self.variables or key in self.others:
            return True
        if kind != "tensor":
            return False
        op, _ = keras_history(obj)
        return op is not None and id(op) in self.layers


def guarded(read: Any, default: Any) -> Any:
    """Return ``read()``, or ``default`` when it raises (Keras's and the user's code runs)."""
    try:
        return read()
    except Exception:  # a half-built model, a user subclass whose property fails
        return default


def keras_history(tensor: Any) -> tuple[Any, int]:
    """Return the operation that computed a symbolic tensor and its node index, or (None, 0).

    A ``_keras_history`` of another shape means Keras changed it: said once (``compat``),
    and the tensor is then owned by nothing known.
    """
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


def with_operations(layers: list[Any]) -> list[Any]:
    """Return ``layers`` and the operations of the functional ones among them: a functional
    model's graph holds calls of ``keras.ops`` functions (``expand_dims``) beside its layers."""
    out = list(layers)
    for layer in layers:
        if isinstance(getattr(type(layer), "operations", None), property):
            out.extend(guarded(lambda x=layer: list(x.operations), []))
    return out


def variables_of(layer: Any) -> list[Any]:
    """Return a layer's variables, and the TensorFlow variable each Keras variable wraps."""
    out = []
    wrapped = works("keras.variables")  # moved: said once, by compat; the outer ones alone
    for variable in guarded(lambda: list(layer.weights), []):
        out.append(variable)
        inner = getattr(variable, "_value", None) if wrapped else None  # a tf.Variable, on TF
        if inner is not None:
            out.append(inner)
    return out


def upstream_layers(tensor: Any) -> list[Any]:
    """Return the layers a symbolic tensor was computed through (its functional graph)."""
    layer, node_index = keras_history(tensor)
    if layer is None:
        return []
    start = None
    if works("keras.outbound_nodes"):  # moved: said once, by compat; the layer alone
        start = guarded(lambda: layer._inbound_nodes[node_index], None)
    layers: dict[int, Any] = {} if layer is None else {id(layer): layer}
    todo = [start] if start is not None else []
    seen: set[int] = set()
    while todo and len(seen) < MAX_NODES:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        op = getattr(node, "operation", None) or getattr(node, "layer", None)
        if op is not None:
            layers.setdefault(id(op), op)
        todo.extend(guarded(lambda n=node: list(n.parent_nodes), []))
    return list(layers.values())


def owned(roots: Iterable[Any], types: StateTypes) -> Owned:
    """Return what ``roots`` (kept models, layers, tensors, optimizers) own."""
    layers: dict[int, Any] = {}
    others: set[int] = set()
    for root in roots:
        kind = types.kind(type(root))
        if kind in ("model", "layer", "metric"):
            layers.update((id(x), x) for x in with_operations(layers_of(root)))
        elif kind == "tensor":
            for layer in upstream_layers(root):
                layers.update((id(x), x) for x in layers_of(layer))
        if kind == "model":
            optimizer = guarded(lambda r=root: r.optimizer, None)
            if optimizer is not None:
                others.add(id(optimizer))
                others.update(id(v) for v in guarded(lambda o=optimizer: list(o.variables), []))
            others.update(id(m) for m in guarded(lambda r=root: list(r.metrics), []))
    variables = {id(v) for layer in layers.values() for v in variables_of(layer)}
    return Owned(frozenset(layers), frozenset(variables), frozenset(others), tuple(layers.values()))


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


def _itemsize(dtype: Any) -> int:
    size = getattr(dtype, "size", None)  # tf.DType
    if isinstance(size, int):
        return size
    import numpy as np

    return int(np.dtype(str(dtype)).itemsize)


def variables_bytes(variables: Iterable[Any]) -> int:
    """Return the bytes of distinct variables (by shape and dtype; unknown shapes count 0)."""
    seen: set[int] = set()
    total = 0
    for var in variables:
        if id(var) in seen:
            continue
        seen.add(id(var))
        try:
            total += math.prod(int(d) for d in var.shape) * _itemsize(var.dtype)
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


def _keras_weights(layers: Iterable[Any]) -> Iterator[Any]:
    for layer in layers:
        yield from guarded(lambda x=layer: list(x.weights), [])


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
        size = fmt_bytes(self.size_bytes)
        if self.kind == "tensor":
            if not self.layers:
                return "a KerasTensor, no weights"
            plural = "" if self.layers == 1 else "s"
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
    name = type(obj).__name__
    if kind == "tensor":
        found = [x for layer in upstream_layers(obj) for x in layers_of(layer)]
        layers = list({id(x): x for x in found}.values())
    elif kind in ("layer", "metric", "model"):
        layers = layers_of(obj)
    else:
        layers = []
    if kept is not None:
        layers = [x for x in layers if id(x) not in kept.layers]
    weighted = [x for x in layers if guarded(lambda x=x: list(x.weights), [])]
    if kind == "optimizer":
        size = variables_bytes(guarded(lambda: list(obj.variables), []))
    elif kind == "variable":
        size = variables_bytes([obj])
    else:
        size = variables_bytes(_keras_weights(weighted))
    return Held(kind, name, len(weighted), size)
