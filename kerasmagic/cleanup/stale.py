"""Decide which models in a namespace are stale and what to cut to let them go.

Pure planning: ``plan_cleanup`` only looks; the returned actions do the cutting. Nothing here
ever touches an object that is not model state: names bound to a model are unbound, models are
taken out of rebound containers and rebound objects of the user's classes (the rest stays),
callbacks such as ``History`` (at any depth) lose their ``.model`` link and keep their numbers,
IPython's output cache forgets entries that hold a model, and stored tracebacks drop their
frames' locals.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from kerasmagic.cleanup.cuts import (
    clear_frames_of,
    cut_link,
    forget_output,
    models_under,
    set_attr,
    set_item,
    strip_binding,
    unbind,
)
from kerasmagic.cleanup.paths import callback_labels
from kerasmagic.cleanup.reach import reachable
from kerasmagic.cleanup.tracebacks import frame_locals, stored_tracebacks
from kerasmagic.probes.keras_state import (
    callback_model,
    callback_types,
    is_a,
    is_user_name,
    model_types,
    scan_order,
    walk,
)

Action = tuple[str, Callable[[], None]]


@dataclass
class Plan:
    """What a cleanup would cut (``actions``), which models it frees and which it keeps."""

    actions: list[Action] = field(default_factory=list)
    stale: dict[int, tuple[str, Any]] = field(default_factory=dict)
    kept: dict[int, tuple[str, Any]] = field(default_factory=dict)
    held: frozenset[int] = frozenset()  # every model reachable from a kept name, any depth
    shared: frozenset[int] = frozenset()  # every object reachable from a kept name
    complete: bool = True  # False: kept names too large to walk; cut no container
    notes: list[str] = field(default_factory=list)


def _stale(plan: Plan, found: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Keep the models of ``found`` that no kept name holds: only those are worth a cut."""
    return [(path, model) for path, model in found if id(model) not in plan.held]


def _models_in(
    obj: Any, path: str, types: tuple[type, ...], cbs: tuple[type, ...], depth: int = 2
) -> list[tuple[str, Any]]:
    return [(p, o) for p, o in walk(path, obj, cbs, max_depth=depth) if is_a(o, types)]


def _release_names(
    plan: Plan, ns: MutableMapping[str, Any], names: Iterable[str], types: tuple[type, ...]
) -> None:
    for name in names:
        value = ns.get(name)
        models = list(models_under(name, value, types))
        found = _stale(plan, models)
        for path, model in models:  # also held under a kept name, at any depth: it stays
            if id(model) in plan.held and id(model) not in plan.kept:
                plan.kept[id(model)] = (f"{path} (also held by a kept name)", model)
        if not found:
            continue
        if is_a(value, types):
            plan.actions.append((name, unbind(ns, name)))
        elif not plan.complete:
            plan.notes.append(f"kept names too large to scan: models inside {name} not cut")
            continue
        else:
            plan.actions.append(
                (
                    f"{found[0][0]}" + (f" (+{len(found) - 1})" if len(found) > 1 else ""),
                    strip_binding(ns, name, types, plan.shared),
                )
            )
        plan.stale.update((id(m), (p, m)) for p, m in found)


def _release_output_cache(
    plan: Plan, ns: MutableMapping[str, Any], types: tuple[type, ...], cbs: tuple[type, ...]
) -> None:
    out = ns.get("Out")
    if isinstance(out, dict):
        for key, value in list(out.items()):
            found = _stale(plan, _models_in(value, f"Out[{key}]", types, ()))
            if found:
                plan.stale.update((id(m), (p, m)) for p, m in found)
                plan.actions.append((f"Out[{key}]", forget_output(ns, out, key)))
    for name in ("_", "__", "___"):
        found = _stale(plan, _models_in(ns.get(name), name, types, ()))
        if found:
            plan.stale.update((id(m), (p, m)) for p, m in found)
            plan.actions.append((name, set_item(ns, name, "")))


def _release_tracebacks(plan: Plan, ns: MutableMapping[str, Any], types: tuple[type, ...]) -> None:
    for label, tb in stored_tracebacks():
        found = [
            m
            for path, value in frame_locals(label, tb, ns)
            for m in _models_in(value, path, types, ())
        ]
        found = _stale(plan, found)
        if found:
            plan.stale.update((id(m), (p, m)) for p, m in found)
            plan.actions.append((label, clear_frames_of(tb)))


def _cut_callback_links(
    plan: Plan,
    ns: MutableMapping[str, Any],
    types: tuple[type, ...],
    cbs: tuple[type, ...],
    deeper: Iterable[tuple[str, Any]],
) -> None:
    """Cut callbacks' links to models nothing kept holds, at any depth of the namespace."""
    seen: set[int] = set()  # one callback under many names (Out[7], _, _7): its first path

    def first(pairs: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
        out = []
        for label, obj in pairs:
            if id(obj) not in seen:
                seen.add(id(obj))
                out.append((label, obj))
        return out

    near = first(
        (f"{path}.model", obj)
        for name in scan_order(ns)  # the user's names first
        for path, obj in walk(name, ns.get(name), cbs)
        if is_a(obj, cbs)
    )
    for label, obj in near + callback_labels(ns, first(deeper), types, cbs):
        model = callback_model(obj)
        if not is_a(model, types) or id(model) in plan.held:
            continue
        plan.stale[id(model)] = (label, model)
        plan.actions.append((label, cut_link(obj)))


def _release_shell(plan: Plan, shell: Any, types: tuple[type, ...]) -> None:
    """IPython keeps its own references: the display hook's ``_``s and the last result."""
    hook = getattr(shell, "displayhook", None)
    for name in ("_", "__", "___"):
        if _stale(plan, _models_in(getattr(hook, name, None), name, types, ())):
            plan.actions.append((f"displayhook.{name}", set_attr(hook, name, "")))
    hidden = getattr(shell, "user_ns_hidden", None)  # push(interactive=False) copies _, _N here
    if isinstance(hidden, dict):
        for name, value in list(hidden.items()):
            if re.fullmatch(r"_+|_\d+", name) and _stale(plan, _models_in(value, name, types, ())):
                plan.actions.append((f"displayhook.{name}", set_item(hidden, name, "")))
    last = getattr(shell, "last_execution_result", None)
    found = _stale(plan, _models_in(getattr(last, "result", None), "last result", types, ()))
    if found:
        plan.stale.update((id(m), (p, m)) for p, m in found)
        plan.actions.append(("last result", set_attr(last, "result", None)))


def plan_cleanup(
    ns: MutableMapping[str, Any],
    *,
    rebinding: Iterable[str] = (),
    keep: Iterable[str] = (),
    drop_all: bool = False,
    shell: Any | None = None,
) -> Plan:
    """Plan the release of stale models in ``ns`` (see the module docstring)."""
    plan = Plan()
    types, cbs = model_types(), callback_types()
    if types:
        users = [name for name in list(ns) if is_user_name(name)]
        release = (set(users) if drop_all else set(rebinding) & set(ns)) - set(keep)
        kept_names = [name for name in users if name not in release]
        for name in kept_names:
            plan.kept.update((id(m), (p, m)) for p, m in _models_in(ns.get(name), name, types, ()))
        reach = reachable(((n, ns[n]) for n in kept_names if n in ns), types, cbs, skip=(ns,))
        plan.held = reach.models | frozenset(plan.kept)
        plan.shared = reach.objects
        plan.complete = reach.complete
        released = reachable(((n, ns[n]) for n in sorted(release) if n in ns), types, cbs, (ns,))
        _release_names(plan, ns, sorted(release), types)
        _release_output_cache(plan, ns, types, cbs)
        _release_tracebacks(plan, ns, types)
        if shell is not None:
            _release_shell(plan, shell, types)
        _cut_callback_links(plan, ns, types, cbs, reach.callbacks + released.callbacks)
        for key in plan.held:
            plan.stale.pop(key, None)
    return plan
