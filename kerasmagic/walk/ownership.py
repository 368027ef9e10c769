"""What model state owns, read through Keras's own API: a model's layers and variables, its
optimizer and metrics, the layers upstream of a symbolic tensor, and their bytes.

Used to keep what a kept model owns (a layer shared with it, its tensors) and to say what a
dropped object held ("h: a KerasTensor holding 3 layers, 9.8 MB"). Keras's methods run here,
never the user's: every read is guarded, and a model that cannot be read owns nothing known.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kerasmagic.compat.reaches import broken, works
from kerasmagic.units import fmt_bytes
from kerasmagic.walk.state import StateTypes, instance_dict

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


def _guarded(read: Any, default: Any) -> Any:
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
    if not history:
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
    return list(_guarded(lambda: list(flatten(include_self=True, recursive=True)), [obj]))


def with_operations(layers: list[Any]) -> list[Any]:
    """Return ``layers`` and the operations of the functional ones among them: a functional
    model's graph holds calls of ``keras.ops`` functions (``expand_dims``) beside its layers."""
    out = list(layers)
    for layer in layers:
        if isinstance(getattr(type(layer), "operations", None), property):
            out.extend(_guarded(lambda x=layer: list(x.operations), []))
    return out


def variables_of(layer: Any) -> list[Any]:
    """Return a layer's variables, and the TensorFlow variable each Keras variable wraps."""
    out = []
    for variable in _guarded(lambda: list(layer.weights), []):
        out.append(variable)
        inner = getattr(variable, "_value", None)  # Keras 3 on TensorFlow wraps a tf.Variable
        if inner is not None:
            out.append(inner)
    return out


def upstream_layers(tensor: Any) -> list[Any]:
    """Return the layers a symbolic tensor was computed through (its functional graph)."""
    layer, node_index = keras_history(tensor)
    if layer is None:
        return []
    start = _guarded(lambda: layer._inbound_nodes[node_index], None)
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
        todo.extend(_guarded(lambda n=node: list(n.parent_nodes), []))
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
            optimizer = _guarded(lambda r=root: r.optimizer, None)
            if optimizer is not None:
                others.add(id(optimizer))
                others.update(id(v) for v in _guarded(lambda o=optimizer: list(o.variables), []))
            others.update(id(m) for m in _guarded(lambda r=root: list(r.metrics), []))
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
        yield from _guarded(lambda x=layer: list(x.weights), [])


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
    weighted = [x for x in layers if _guarded(lambda x=x: list(x.weights), [])]
    if kind == "optimizer":
        size = variables_bytes(_guarded(lambda: list(obj.variables), []))
    elif kind == "variable":
        size = variables_bytes([obj])
    else:
        size = variables_bytes(_keras_weights(weighted))
    return Held(kind, name, len(weighted), size)
