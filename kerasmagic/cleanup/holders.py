"""What holds memory, on demand: every live Keras model with its size and holders, and the
largest data (the sidebar's "Scan", ``%gpu_mem --deep``).

This walks ``gc.get_objects()`` (tens to hundreds of ms), so it runs only when asked, on the
main thread, between cells.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import types as pytypes
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kerasmagic.backends import traced
from kerasmagic.cleanup.loops import Freezer
from kerasmagic.cleanup.plan import frame_locals, stored_tracebacks
from kerasmagic.compat.registry import works
from kerasmagic.probes import Variable, largest_variables
from kerasmagic.walk.deep import (
    guarded,
    held_by,
    live_model_objects,
    model_size_bytes,
    own_objects,
    owned,
    paths_to,
)
from kerasmagic.walk.near import count_models, walk
from kerasmagic.walk.state import (
    callback_types,
    is_a,
    is_user_name,
    model_types,
    module_dicts,
    scan_order,
    state_types,
)


@dataclass(frozen=True)
class LiveModel:
    """One live model: its Keras name, class, bytes of weights and optimizer state, holders.

    ``traced_ops`` counts the ops of its traced functions' graphs; ``estimate_bytes`` is an
    estimate (not a measurement) of what they keep; ``freeable``: "Free memory" would free it.
    """

    name: str
    type: str
    size_bytes: int
    holders: tuple[str, ...]
    traced_ops: int | None = None
    estimate_bytes: int | None = None
    freeable: bool = False
    remedies: tuple[str, ...] = ()
    kind: str = "model"  # or the loose state's: "layer", "tensor", "optimizer", ...


def namespace_paths(namespace: Mapping[str, Any]) -> dict[int, list[str]]:
    """Return ``{id(obj): [paths]}`` for objects reachable from the namespace and tracebacks."""
    paths: dict[int, list[str]] = {}
    cbs = callback_types()
    for name in scan_order(namespace):
        for path, obj in walk(name, namespace.get(name), cbs):
            paths.setdefault(id(obj), []).append(path)
    for label, tb in stored_tracebacks():
        for root, value in frame_locals(label, tb, namespace):
            for path, obj in walk(root, value, cbs):
                paths.setdefault(id(obj), []).append(path)
    return paths


def holder_paths(namespace: Mapping[str, Any], models: list[Any]) -> dict[int, list[str]]:
    """Return ``namespace_paths``, plus a path for each of ``models`` held only deeper."""
    paths = namespace_paths(namespace)
    missing = {id(m) for m in models if id(m) not in paths}
    if missing:  # held deeper than the near walk looks: search from every name
        roots = [(name, namespace.get(name)) for name in scan_order(namespace)]
        deep = paths_to(roots, missing, callback_types(), model_types())
        paths.update((key, [path]) for key, path in deep.items())
    return paths


_TYPE_NAME = type.__dict__["__name__"]  # read past a metaclass's own __name__


def _type_name(kind: type) -> str:
    return str(_TYPE_NAME.__get__(kind))


_NOT_OWNERS = (dict, list, tuple, set, pytypes.FrameType, pytypes.FunctionType, pytypes.CellType)


def _dict_owner(attrs: dict[Any, Any], skip: set[int]) -> str:
    """Name the class or object whose attribute dict ``attrs`` is, if it is one."""
    owners = [
        owner
        for owner in gc.get_referrers(attrs)
        if id(owner) not in skip
        and not issubclass(type(owner), _NOT_OWNERS)
        and any(ref is attrs for ref in gc.get_referents(owner))
    ]
    for owner in owners:
        if issubclass(type(owner), type):
            return f"an attribute of class {_type_name(owner)}"
    for owner in owners:
        return f"an attribute of a {_type_name(type(owner))} object"
    return "a dict outside the namespace (a module global or object attribute)"


def _refers_directly(holder: Any, obj: Any) -> bool:
    """Return whether ``holder`` itself (not through a dict) refers to ``obj``. A function of
    its own: a generator over ``obj`` in ``referrer_kinds`` would make ``obj`` a closure cell
    there, one more referrer of it."""
    return any(ref is obj for ref in gc.get_referents(holder))


def referrer_kinds(obj: Any, ignore: tuple[Any, ...] = (), limit: int = 3) -> list[str]:
    """Describe what refers to ``obj`` when no namespace path does (slow; survivors only).

    Referrers inside the model's own object graph (its layers' dicts, its traced functions'
    closures, its ``History``) are not holders: only what holds it from outside is named.
    """
    if not (works("cpython.referrers") and works("cpython.frames")):  # said once, by compat
        return []
    kinds = []
    modules = module_dicts()
    skip = {id(x) for x in ignore} | {id(sys._getframe()), id(sys._getframe(1))}
    skip |= own_objects(obj, modules)
    for ref in gc.get_referrers(obj):
        kind = type(ref)
        if id(ref) in skip or (kind is pytypes.MethodType and ref.__self__ is obj):
            continue  # the object's own bound methods (Keras keeps some): not holders
        if kind is pytypes.FrameType:
            kinds.append(f"a running frame ({ref.f_code.co_name})")
        elif id(ref) in modules:
            kinds.append(f"a global of module {modules[id(ref)]}")
        elif issubclass(kind, dict):
            kinds.append(_dict_owner(ref, skip))
        elif issubclass(kind, (list, tuple, set)):
            kinds.append(f"a {_type_name(kind)} outside the namespace")
        elif kind is pytypes.CellType:
            kinds.append("a function closure")
        elif _refers_directly(ref, obj):  # inline attributes (Python 3.13), slots
            kinds.append(f"an attribute of a {_type_name(kind)} object")
        else:
            kinds.append(f"a {_type_name(kind)}")
        if len(kinds) >= limit:
            break
    return kinds or ["nothing gc can see (C++, a NumPy array of objects, a pending collection)"]


def _layers(model: Any) -> list[Any]:
    """A model's layers; none of a user's subclass whose ``layers`` fails."""
    return list(guarded(lambda: list(model.layers), []))


def _name(model: Any) -> str:
    return str(guarded(lambda: str(model.name), "?"))


def _size(model: Any) -> int:
    """A model's bytes; 0 for a user's model whose weights cannot be read."""
    return int(guarded(lambda: model_size_bytes(model), 0))


def holder_remedy(holder: str) -> tuple[str, bool]:
    """Return what frees a model held by ``holder`` (a path from ``namespace_paths``), and
    whether "Free memory" (the cleanup with nothing rebound) does it on its own."""
    root = holder.split("[", 1)[0].split(".", 1)[0].split(" ", 1)[0]
    if holder.startswith("sys.last"):
        return "a stored traceback: Free memory clears it", True
    if not is_user_name(root) and root:
        return "IPython's output cache: Free memory clears it", True
    if holder.endswith(".model"):
        return f"the link {holder}: Free memory cuts it (its numbers stay)", True
    if holder.startswith("layer of model"):
        return "part of another model: freed with it", False
    if " " in holder or not root.isidentifier():
        return "held outside the namespace (a module, closure or object): not freed here", False
    if root == holder:
        return f"del {root}, or rebind it in a %%fresh_model cell", False
    return f"kept in {root}: remove it there, or %%fresh_model --all", False


def _shell_namespace() -> Mapping[str, Any]:
    ipython = sys.modules.get("IPython")
    shell = None if ipython is None else ipython.get_ipython()
    namespace = getattr(shell, "user_ns", None)
    return namespace if isinstance(namespace, Mapping) else {}


def live_models(namespace: Mapping[str, Any] | None = None) -> list[LiveModel]:
    """Return every live Keras model, skipping the inner model a ``Sequential`` wraps, then
    the model state under the namespace's names that no live model owns (a ``KerasTensor``
    still holding a dropped model's layers, a layer, an optimizer, a variable).

    Holders are named from ``namespace``: by default IPython's user namespace, if any.
    """
    if namespace is None:
        namespace = _shell_namespace()
    types = model_types()
    if not types or not works("cpython.referrers"):  # moved: said once, by compat
        return []
    # A loop in this cell may have frozen the collector's old objects (cleanup/loops.py), and
    # gc.get_objects() lists no frozen object: thawed first, as before any cleanup, and what
    # is garbage collected, so that a model listed is one something holds.
    Freezer.thaw()
    gc.collect()
    models = live_model_objects(types)
    owners: dict[int, str] = {}
    for m in models:
        for layer in _layers(m):
            if is_a(layer, types):
                owners[id(layer)] = f"layer of model '{m.name}'"
    paths = holder_paths(namespace, models)
    out = []
    for m in models:
        held = paths.get(id(m)) or (
            [owners[id(m)]] if id(m) in owners else referrer_kinds(m, (models,))
        )
        ops, graph_bytes = traced(m)
        remedies = [holder_remedy(h) for h in held]
        out.append(
            LiveModel(
                _name(m),
                type(m).__name__,
                _size(m),
                tuple(held),
                ops,
                graph_bytes,
                freeable=all(free for _, free in remedies),
                remedies=tuple(r for r, _ in remedies),
            )
        )
    out += _loose_state(namespace, models, paths)
    del models
    return out


LOOSE_KINDS = ("layer", "tensor", "optimizer", "metric", "variable")
MAX_LOOSE = 50  # loose pieces of state listed


def _loose_state(
    namespace: Mapping[str, Any], models: list[Any], paths: Mapping[int, list[str]]
) -> list[LiveModel]:
    """Model state under the namespace's names (two levels in) that no live model owns."""
    types = state_types()
    found: dict[int, tuple[Any, str]] = {}
    for name in scan_order(namespace):
        for _, obj in walk(name, namespace.get(name), ()):
            kind = types.kind(type(obj))
            if kind in LOOSE_KINDS and id(obj) not in found:
                found[id(obj)] = (obj, kind)
    if not found:
        return []
    own = owned(models, types)
    out = []
    for obj, kind in found.values():
        if own.holds(obj, kind):
            continue
        held = held_by(obj, kind)
        holders = paths.get(id(obj), [])
        remedies = [holder_remedy(h) for h in holders]
        out.append(
            LiveModel(
                _name(obj),
                held.type,
                held.size_bytes,
                tuple(holders),
                freeable=bool(remedies) and all(free for _, free in remedies),
                remedies=tuple(r for r, _ in remedies),
                kind=kind,
            )
        )
    out.sort(key=lambda m: -m.size_bytes)
    return out[:MAX_LOOSE]


@dataclass(frozen=True)
class DeepScan:
    """Live models (with holders, remedies, and whether "Free memory" frees them), largest data."""

    models: tuple[LiveModel, ...]
    variables: tuple[Variable, ...]
    named_models: int | None = None  # the live models named in the notebook (count_models)

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"models": [...], "variables": [...], "named_models": n}``, JSON-able."""
        return {
            "models": [_plain(m) for m in self.models],
            "variables": [_plain(v) for v in self.variables],
            "named_models": self.named_models,
        }


def _plain(item: LiveModel | Variable) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(item).items()}


def deep_scan(namespace: Mapping[str, Any]) -> DeepScan:
    """Return every live model and the largest user variables (read-only: nothing is freed)."""
    models = tuple(live_models(namespace))
    return DeepScan(models, tuple(largest_variables(namespace)), count_models(namespace))
