"""Decide which model state in a namespace is stale, and the cuts that let it go.

Model state is what ``kerasmagic.walk.state`` says: models, layers, symbolic tensors,
optimizers, metrics, losses, variables (and callbacks, whose ``.model`` link is cut, never the
callback itself). Pure planning: ``plan_cleanup`` only looks; the returned actions do the
cutting, each a closure that does one cut when called. Nothing here ever touches an object that
is not model state: names bound to it are unbound, it becomes ``None`` inside rebound
containers and rebound objects of the user's classes (``walk.deep.strip``: the rest stays),
callbacks such as ``History`` (at any depth) lose their ``.model`` link and keep their numbers,
IPython's output cache forgets entries that hold it, and stored tracebacks (``sys.last_*``)
drop their frames' locals. What a kept name reaches, or a kept model owns (a shared layer, its
tensors and variables), is never stale.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import sys
import types as pytypes
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from kerasmagic.backends.oom import find_oom
from kerasmagic.compat.registry import broken, works
from kerasmagic.walk.deep import (
    Owned,
    callback_labels,
    held_by,
    models_under,
    node_layer,
    outbound_nodes,
    owned,
    reachable,
    strip,
)
from kerasmagic.walk.near import NearWalks
from kerasmagic.walk.state import (
    StateTypes,
    callback_model,
    instance_dict,
    is_a,
    is_user_name,
    scan_order,
    state_types,
)

Action = tuple[str, Callable[[], object]]  # a label (empty: not reported) and the cut


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
        return self.owned_by_kept().holds(obj, kind)

    def owned_by_kept(self) -> Owned:
        """Return what the kept state owns, read through Keras once, when first needed."""
        if self._owned is None:
            assert self.types is not None
            self._owned = owned(self.roots, self.types)
        return self._owned

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
    return f"{path} ({held_by(obj, kind, plan.owned_by_kept()).describe()})"


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
            plan.actions.append(("" if oom else label, functools.partial(clear_frames, tb)))
    if oom:
        plan.actions.append(("the stored out-of-memory error", lambda: drop_stored_errors(shell)))


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
    cache = works("ipython.output_cache", shell)  # moved: said once, by compat; left as is
    hook = getattr(shell, "displayhook", None)
    for name in ("_", "__", "___") if cache else ():
        if _stale(plan, near.state(name, getattr(hook, name, None), types)):
            plan.actions.append((f"displayhook.{name}", set_attr(hook, name, "")))
    hidden = getattr(shell, "user_ns_hidden", None)  # push(interactive=False) copies _, _N here
    if cache and isinstance(hidden, dict):
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
    kept = plan.owned_by_kept().layers
    cut: dict[int, tuple[list[Any], list[Any]]] = {}
    for layer in plan.owned_by_kept().layer_objects:
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
    if not works(_reach_of(layer, "outbound_nodes")):  # moved: said once, by compat
        return None
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


# The cuts: each returns a callable that does one cut when called.


def unbind(ns: MutableMapping[str, Any], name: str) -> Callable[[], None]:
    """Cut: remove ``name`` from the namespace."""
    return lambda: ns.pop(name, None)


def strip_binding(
    ns: MutableMapping[str, Any], name: str, types: tuple[type, ...], kept: frozenset[int]
) -> Callable[[], None]:
    """Cut: the stale models out of the container bound to ``name`` (see ``strip``)."""

    def act() -> None:
        if name in ns:
            ns[name] = strip(ns[name], types, kept)

    return act


def forget_output(
    ns: MutableMapping[str, Any], out: dict[Any, Any], key: Any
) -> Callable[[], None]:
    """Cut: IPython's ``Out[key]`` and its ``_key`` alias."""

    def act() -> None:
        value = out.pop(key, None)
        if value is not None and ns.get(f"_{key}") is value:
            del ns[f"_{key}"]

    return act


def set_item(ns: MutableMapping[str, Any], name: str, value: Any) -> Callable[[], None]:
    """Cut: ``ns[name] = value`` (IPython's ``_``, ``__``, ``___`` become "")."""
    return lambda: ns.__setitem__(name, value)


def cut_link(callback: Any) -> Callable[[], None]:
    """Cut: a callback's (``History``'s) ``.model`` link; its numbers stay.

    Keras 3 keeps it in ``_model`` behind a ``model`` property, tf-keras in ``model``: the key
    that holds it is cleared. Neither there means Keras moved it: said once, nothing written
    (a ``model`` entry would hide behind the property and cut nothing).
    """

    def act() -> None:
        attrs = instance_dict(callback) or {}
        key = next((k for k in ("_model", "model") if k in attrs), None)
        if key is None or (key == "_model" and not works("keras.callback_model")):
            broken("keras.callback_model", "moved Callback._model")
            return
        attrs[key] = None

    return act


def set_attr(obj: Any, name: str, value: Any) -> Callable[[], None]:
    """Cut: ``obj.name = value`` (the display hook's copies, the last execution result)."""
    return lambda: setattr(obj, name, value)


# Stored tracebacks (``sys.last_*``): the locals they keep alive, and letting those go.


def stored_tracebacks() -> Iterator[tuple[str, pytypes.TracebackType]]:
    """Yield ``("sys.last_...", traceback)`` for each stored error and the errors it chains."""
    seen: set[int] = set()  # errors (and tracebacks) already followed
    yielded: set[int] = set()  # tracebacks already yielded: one error has up to three names
    for attr in ("last_traceback", "last_value", "last_exc"):
        obj = getattr(sys, attr, None)
        while obj is not None and id(obj) not in seen:
            seen.add(id(obj))
            tb = (
                obj
                if isinstance(obj, pytypes.TracebackType)
                else getattr(obj, "__traceback__", None)
            )
            if tb is not None and id(tb) not in yielded:
                yielded.add(id(tb))
                yield f"sys.{attr}", tb
            obj = getattr(obj, "__context__", None) if isinstance(obj, BaseException) else None


_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
MAX_CALLERS = 1000


def _cell_boundaries() -> set[pytypes.CodeType]:
    """Return IPython's ``run_code``: a failed cell's frames end below it."""
    if not works("ipython.run_code"):  # moved: said once, by compat; the frames go to the top
        return set()
    shell = getattr(sys.modules.get("IPython.core.interactiveshell"), "InteractiveShell", None)
    code = getattr(getattr(shell, "run_code", None), "__code__", None)
    return {code} if code is not None else set()


def kept_frames(tb: pytypes.TracebackType) -> Iterator[pytypes.FrameType]:
    """Yield the frames ``tb`` keeps alive: its own, and the callers each of them links to.

    A library that rewrites tracebacks (Keras filters its own frames out) leaves those frames
    out of ``tb`` but not dead: the frames still in it reach them through ``f_back``, with the
    model in their locals. The walk up stops at the cell's runner, at a generator or coroutine
    (a long-lived one, such as the kernel's dispatch loop, must never be finalized) and after
    ``MAX_CALLERS`` frames.
    """
    stops = _cell_boundaries()
    seen: set[int] = set()
    walker: pytypes.TracebackType | None = tb
    while walker is not None:
        frame: pytypes.FrameType | None = walker.tb_frame
        own = True
        for _ in range(MAX_CALLERS):
            if frame is None or id(frame) in seen:
                break
            if not own and (frame.f_code in stops or frame.f_code.co_flags & _SUSPENDABLE):
                break
            seen.add(id(frame))
            yield frame
            frame, own = frame.f_back, False
        walker = walker.tb_next


def frame_locals(
    label: str, tb: pytypes.TracebackType, namespace: Mapping[str, Any]
) -> Iterator[tuple[str, Any]]:
    """Yield ``("sys.last_traceback (fn: name)", value)`` for the locals a traceback keeps.

    A cell's own frame is skipped (its locals are the user namespace itself), and so is the
    namespace wherever a runner's frame holds it, as a local or in its ``*args``: its names are
    looked at as names, not once more for every frame that passed it on.
    """
    for frame in kept_frames(tb):
        if frame.f_locals is namespace:
            continue
        for name, value in list(frame.f_locals.items()):
            where = f"{label} ({frame.f_code.co_name}: {name})"
            if value is namespace:
                continue
            if type(value) is tuple and any(item is namespace for item in value):
                yield from (
                    (f"{where}[{i}]", item) for i, item in enumerate(value) if item is not namespace
                )
            else:
                yield where, value


def clear_frames(tb: pytypes.TracebackType) -> None:
    """Drop the locals of every finished frame ``tb`` keeps (the error text stays for ``%tb``)."""
    for frame in list(kept_frames(tb)):
        with contextlib.suppress(RuntimeError):  # a frame still running stays as it is
            frame.clear()
        if frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            _ = frame.f_locals  # Python 3.11 keeps a stale locals dict until re-synced


def drop_stored_errors(shell: Any | None) -> bool:
    """Forget the stored error: ``sys.last_*``, the shell's last result's error and the
    traceback IPython's formatter keeps; return whether there was one.

    Its frames keep the functions they ran even with their locals dropped, and an error while
    TensorFlow traced ``fit`` ran a function Keras made for that model alone.
    """
    found = False
    for attr in ("last_type", "last_value", "last_traceback", "last_exc"):
        if getattr(sys, attr, None) is not None:
            found = True
            setattr(sys, attr, None)
    result: Any = getattr(shell, "last_execution_result", None)
    if getattr(result, "error_in_exec", None) is not None:
        result.error_in_exec = None
    formatter: Any = getattr(shell, "InteractiveTB", None)
    if getattr(formatter, "tb", None) is not None and works("ipython.traceback", shell):
        formatter.tb = None  # IPython's own "lingering reference" (ultratb's words)
    return found
