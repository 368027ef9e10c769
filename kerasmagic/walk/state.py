"""What counts as model state: every Keras object that can hold an old model's tensors.

Models, layers, the functional API's symbolic tensors (``inputs``, ``h``, ``outputs``),
optimizers, metrics, losses, callbacks and variables (Keras's and TensorFlow's), of Keras 3
and of legacy tf-keras. This is the one definition the cleanup, the counts and the reports
read. Nothing here imports Keras or TensorFlow: classes are looked up in ``sys.modules``, and
objects are judged by ``type(obj)`` alone (``isinstance`` may run user code via ``__class__``).
"""

from __future__ import annotations

import sys
import types as pytypes
from dataclasses import dataclass, field
from typing import Any

from kerasmagic.origin import user_module

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
NAMES = {
    "model": "model",
    "metric": "metric",
    "layer": "layer",
    "tensor": "KerasTensor",
    "optimizer": "optimizer",
    "loss": "loss",
    "callback": "callback",
    "variable": "variable",
}


def _lookup(module_name: str, attr_path: str) -> type | None:
    obj: Any = sys.modules.get(module_name)
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
    except AttributeError:
        return None
    return attrs if type(attrs) is dict else None


def callback_model(callback: Any) -> Any:
    """Return the model a callback (or ``History``) points at, without Keras's property logic."""
    attrs = instance_dict(callback)
    return None if attrs is None else attrs.get("_model", attrs.get("model"))


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
