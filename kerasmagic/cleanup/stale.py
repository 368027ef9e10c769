"""Decide which model state in a namespace is stale and what to cut to let it go.

Model state is what ``kerasmagic.walk.state`` says: models, layers, symbolic tensors,
optimizers, metrics, losses, variables (and callbacks, whose ``.model`` link is cut, never the
callback itself). Pure planning: ``plan_cleanup`` only looks; the returned actions do the
cutting. Nothing here ever touches an object that is not model state: names bound to it are
unbound, it is taken out of rebound containers and rebound objects of the user's classes (the
rest stays), callbacks such as ``History`` (at any depth) lose their ``.model`` link and keep
their numbers, IPython's output cache forgets entries that hold it, and stored tracebacks drop
their frames' locals. What a kept name reaches, or a kept model owns (a shared layer, its
tensors and variables), is never stale.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from kerasmagic.cleanup.cuts import (
    clear_frames_of,
    cut_link,
    forget_output,
    forget_stored_errors,
    set_attr,
    set_item,
    strip_binding,
    unbind,
)
from kerasmagic.cleanup.tracebacks import frame_locals, stored_tracebacks
from kerasmagic.compat.reaches import broken
from kerasmagic.oom.detect import find_oom
from kerasmagic.walk.names import is_user_name, scan_order
from kerasmagic.walk.near import NearWalks
from kerasmagic.walk.ownership import Owned, held_by, node_layer, outbound_nodes, owned
from kerasmagic.walk.paths import callback_labels
from kerasmagic.walk.reach import reachable
from kerasmagic.walk.rebound import models_under
from kerasmagic.walk.state import StateTypes, callback_model, is_a, state_types

Action = tuple[str, Callable[[], None]]


@dataclass
class Plan:
    """What a cleanup would cut (``actions``), the state it frees and the models it keeps."""

    actions: list[Action] = field(default_factory=list)
    stale: dict[int, tuple[str, Any]] = field(default_factory=dict)  # all stale state
    kept: dict[int, tuple[str, Any]] = field(default_factory=dict)  # models kept (for reports)
    held: frozenset[int] = frozenset()  # every piece of state reachable from a kept name
    shared: frozenset[int] = frozenset()  # every object reachable from a kept name
    complete: bool = True  # False: kept names too large to walk; cut no container
    notes: list[str] = field(default_factory=list)
    unlinks: list[Callable[[], None]] = field(default_factory=list)  # not reported as dropped
    types: StateTypes | None = None
    roots: list[Any] = field(default_factory=list)  # the kept state whose ownership counts
    _owned: Owned | None = None

    def keeps(self, obj: Any) -> bool:
        """Return whether a kept name holds ``obj``, or kept state owns it (a shared layer)."""
        if id(obj) in self.held:
            return True
        kind = None if self.types is None else self.types.kind(type(obj))
        if self.types is None or kind in (None, "callback"):
            return False  # a model counts: one nested in a kept model is that model's
        if self._owned is None:  # read through Keras only when a candidate needs it
            self._owned = owned(self.roots, self.types)
        return self._owned.holds(obj, kind)

    def models(self) -> int:
        """Return how many stale objects are models."""
        types = self.types
        return sum(1 for _, o in self.stale.values() if types and types.kind(type(o)) == "model")


def _stale(plan: Plan, found: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Keep the state of ``found`` that nothing kept holds: only that is worth a cut."""
    return [(path, obj) for path, obj in found if not plan.keeps(obj)]


def _label(path: str, obj: Any, plan: Plan) -> str:
    """Name a dropped object: a model by its path, other state with what it held."""
    kind = plan.types.kind(type(obj)) if plan.types else None
    if kind in (None, "model"):
        return path
    if plan._owned is None and plan.roots and plan.types is not None:
        plan._owned = owned(plan.roots, plan.types)
    return f"{path} ({held_by(obj, kind, plan._owned).describe()})"


def _release_names(
    plan: Plan, ns: MutableMapping[str, Any], names: Iterable[str], types: tuple[type, ...]
) -> None:
    for name in names:
        value = ns.get(name)
        found_all = list(models_under(name, value, types))
        found = _stale(plan, found_all)
        for path, obj in found_all:  # also held under a kept name, at any depth: it stays
            if plan.types and plan.types.kind(type(obj)) == "model" and plan.keeps(obj):
                plan.kept.setdefault(id(obj), (f"{path} (also held by a kept name)", obj))
        if not found:
            continue
        if is_a(value, types):
            plan.actions.append((_label(name, value, plan), unbind(ns, name)))
        elif not plan.complete:
            plan.notes.append(f"kept names too large to scan: model state inside {name} not cut")
            continue
        else:
            more = f" (+{len(found) - 1})" if len(found) > 1 else ""
            plan.actions.append(
                (f"{found[0][0]}{more}", strip_binding(ns, name, types, plan.shared))
            )
        plan.stale.update((id(o), (p, o)) for p, o in found)


def _release_output_cache(
    plan: Plan, ns: MutableMapping[str, Any], types: tuple[type, ...], near: NearWalks
) -> None:
    out = ns.get("Out")
    if isinstance(out, dict):
        for key, value in list(out.items()):
            found = _stale(plan, near.state(f"Out[{key}]", value, types))
            if found:
                plan.stale.update((id(o), (p, o)) for p, o in found)
                plan.actions.append((f"Out[{key}]", forget_output(ns, out, key)))
    for name in ("_", "__", "___"):
        found = _stale(plan, near.state(name, ns.get(name), types))
        if found:
            plan.stale.update((id(o), (p, o)) for p, o in found)
            plan.actions.append((name, set_item(ns, name, "")))


def _release_tracebacks(
    plan: Plan,
    ns: MutableMapping[str, Any],
    types: tuple[type, ...],
    shell: Any | None,
    near: NearWalks,
) -> None:
    """Stored errors drop their frames' locals where those hold stale model state. An
    out-of-memory error goes altogether: its frames hold the batch and the tensors that ran out,
    and the functions they ran (Keras's ``predict`` closes over the model) keep the model after
    it is rebound. Its traceback was shown; ``%tb`` has nothing to show after."""
    oom = _stored_oom()
    for label, tb in stored_tracebacks():
        found = [
            o for path, value in frame_locals(label, tb, ns) for o in near.state(path, value, types)
        ]
        found = _stale(plan, found)
        if found:
            plan.stale.update((id(o), (p, o)) for p, o in found)
        if found or oom:  # an OOM's is said once, below
            plan.actions.append(("" if oom else label, clear_frames_of(tb)))
    if oom:
        plan.actions.append(("the stored out-of-memory error", forget_stored_errors(shell)))


def _stored_oom() -> bool:
    """Return whether the stored error (``sys.last_value``, ``sys.last_exc``) is an OOM."""
    return any(
        find_oom(getattr(sys, name, None)) is not None for name in ("last_value", "last_exc")
    )


def _cut_callback_links(
    plan: Plan,
    ns: MutableMapping[str, Any],
    types: StateTypes,
    deeper: Iterable[tuple[str, Any]],
    near: NearWalks,
) -> None:
    """Cut callbacks' links to models nothing kept holds, at any depth of the namespace."""
    seen: set[int] = set()  # one callback under many names (Out[7], _, _7): its first path
    cbs = types.callbacks

    def first(pairs: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
        out = []
        for label, obj in pairs:
            if id(obj) not in seen:
                seen.add(id(obj))
                out.append((label, obj))
        return out

    close = first(
        (f"{path}.model", obj)
        for name in scan_order(ns)  # the user's names first
        for path, obj in near.callbacks(name, ns.get(name))
    )
    for label, obj in close + callback_labels(ns, first(deeper), types.models, cbs):
        model = callback_model(obj)
        if not is_a(model, types.models) or id(model) in plan.held:
            continue
        plan.stale[id(model)] = (label, model)
        plan.actions.append((label, cut_link(obj)))


def _release_shell(plan: Plan, shell: Any, types: tuple[type, ...], near: NearWalks) -> None:
    """IPython keeps its own references: the display hook's ``_``s and the last result."""
    hook = getattr(shell, "displayhook", None)
    for name in ("_", "__", "___"):
        if _stale(plan, near.state(name, getattr(hook, name, None), types)):
            plan.actions.append((f"displayhook.{name}", set_attr(hook, name, "")))
    hidden = getattr(shell, "user_ns_hidden", None)  # push(interactive=False) copies _, _N here
    if isinstance(hidden, dict):
        for name, value in list(hidden.items()):
            if re.fullmatch(r"_+|_\d+", name) and _stale(plan, near.state(name, value, types)):
                plan.actions.append((f"displayhook.{name}", set_item(hidden, name, "")))
    last = getattr(shell, "last_execution_result", None)
    found = _stale(plan, near.state("last result", getattr(last, "result", None), types))
    if found:
        plan.stale.update((id(o), (p, o)) for p, o in found)
        plan.actions.append(("last result", set_attr(last, "result", None)))


def _unlink_from_kept_layers(plan: Plan) -> None:
    """A kept layer (a base model) records every later call on its outputs in its outbound
    nodes, so a kept base held every head ever built on it, and their weights. Unlink the
    nodes of layers and operations no kept model owns (a kept model's ``keras.ops`` calls
    stay); Keras never reads that list to compute anything."""
    if plan.types is None or not plan.roots:
        return
    if plan._owned is None:
        plan._owned = owned(plan.roots, plan.types)
    kept = plan._owned.layers
    cut: dict[int, tuple[list[Any], list[Any]]] = {}
    for layer in plan._owned.layer_objects:
        nodes = _nodes_of(layer, plan.types)
        ops = [node_layer(n) for n in nodes or ()]
        if any(op is None for op in ops):  # a node whose operation cannot be read: cut nothing
            broken(_reach_of(layer, "outbound_nodes"), "moved Node.operation")
            continue
        stale = [n for n, op in zip(nodes or (), ops, strict=True) if not _kept(plan, op, kept)]
        if nodes is not None and stale:
            cut[id(nodes)] = (nodes, stale)
    if cut:
        count = sum(len(stale) for _, stale in cut.values())
        calls = "a layer" if count == 1 else f"{count} layers"
        plan.notes.append(f"unlinked {calls} no kept model uses from the graphs of kept models")
        plan.unlinks.append(functools.partial(_remove_nodes, list(cut.values())))


def _kept(plan: Plan, op: Any, kept: frozenset[int]) -> bool:
    return id(op) in kept or plan.keeps(op)


def _nodes_of(layer: Any, types: StateTypes) -> list[Any] | None:
    """Return a Keras layer's outbound nodes; a Keras layer without them is said (once)."""
    nodes = outbound_nodes(layer)
    if nodes is None and types.kind(type(layer)) in ("model", "layer"):
        broken(_reach_of(layer, "outbound_nodes"), "moved Operation._outbound_nodes")
    return nodes


def _reach_of(layer: Any, what: str) -> str:
    """Return the name of Keras 3's or tf-keras's reach ``what`` for ``layer``'s class."""
    module = type(layer).__module__ or ""
    return f"tf_keras.{what}" if module.startswith("tf_keras") else f"keras.{what}"


def _remove_nodes(found: list[tuple[list[Any], list[Any]]]) -> None:
    for nodes, stale in found:
        ids = {id(n) for n in stale}
        nodes[:] = [n for n in nodes if id(n) not in ids]


def droppable(types: StateTypes) -> tuple[type, ...]:
    """Return the classes of state a cleanup drops: all but callbacks (whose link is cut)."""
    return tuple(c for kind, classes in types.by_kind if kind != "callback" for c in classes)


def plan_cleanup(
    ns: MutableMapping[str, Any],
    *,
    rebinding: Iterable[str] = (),
    keep: Iterable[str] = (),
    drop_all: bool = False,
    shell: Any | None = None,
) -> Plan:
    """Plan the release of stale model state in ``ns`` (see the module docstring)."""
    types = state_types()
    plan = Plan(types=types)
    if not types.models:
        return plan
    state = droppable(types)
    users = [name for name in list(ns) if is_user_name(name)]
    release = (set(users) if drop_all else set(rebinding) & set(ns)) - set(keep)
    kept_names = [name for name in users if name not in release]
    near = NearWalks(types.callbacks)  # each object near the namespace walked once, here
    for name in kept_names:
        found = near.state(name, ns.get(name), types.models)
        plan.kept.update((id(m), (p, m)) for p, m in found)
    kept_roots = ((n, ns[n]) for n in kept_names if n in ns)
    reach = reachable(kept_roots, types.all, types.callbacks, skip=(ns,))
    plan.held = reach.models | frozenset(plan.kept)
    plan.roots = [obj for obj in reach.found if types.kind(type(obj)) != "callback"]
    plan.shared = reach.objects
    plan.complete = reach.complete
    released_roots = ((n, ns[n]) for n in sorted(release) if n in ns)
    released = reachable(released_roots, types.models, types.callbacks, (ns,))
    _release_names(plan, ns, sorted(release), state)
    _release_output_cache(plan, ns, state, near)
    _release_tracebacks(plan, ns, state, shell, near)
    if shell is not None:
        _release_shell(plan, shell, state, near)
    _cut_callback_links(plan, ns, types, reach.callbacks + released.callbacks, near)
    _unlink_from_kept_layers(plan)
    for key in plan.held:
        plan.stale.pop(key, None)
    return plan
