"""What holds model state: the cleanup's plan of what is stale and the cuts that let it go, and
every live model with its size and holders (the sidebar's "Scan", ``%gpu_mem --deep``).

Model state is what ``kerasmagic.walk`` says. ``plan_cleanup`` only looks; its actions
do the cutting, each a callable that does one cut. Nothing but model state is ever touched:
names bound to it are unbound, it becomes ``None`` inside rebound containers and rebound
objects of the user's classes (``strip``: the rest stays), callbacks such as ``History`` (at
any depth) lose their ``.model`` link and keep their numbers, IPython's output cache forgets
entries that hold it, and stored tracebacks (``sys.last_*``) drop their frames' locals. What a
kept name reaches, or a kept model owns (a shared layer, its tensors and variables), is never
stale. ``live_models`` walks ``gc.get_objects()`` (tens to hundreds of ms): only when asked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import inspect
import re
import sys
import types as pytypes
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from kerasmagic import walk as state
from kerasmagic.backends import traced
from kerasmagic.backends.oom import find_oom
from kerasmagic.cleanup.loops import Freezer
from kerasmagic.compat.registry import broken, works
from kerasmagic.probes import Variable, largest_variables

Cut = Callable[[], object]
Action = tuple[str, Cut]  # a label (empty: not reported) and the cut


@dataclass
class Plan:
    """What a cleanup would cut (``actions``), the state it frees and the models it keeps.
    ``plan_cleanup`` makes it, each method looking at one kind of holder."""

    types: state.StateTypes
    ns: MutableMapping[str, Any]
    near: state.NearWalks  # each object near the namespace walked once, while planning
    shell: Any = None
    actions: list[Action] = field(default_factory=list)
    stale: dict[int, tuple[str, Any]] = field(default_factory=dict)  # all stale state
    kept: dict[int, tuple[str, Any]] = field(default_factory=dict)  # models kept (for reports)
    held: frozenset[int] = frozenset()  # every piece of state reachable from a kept name
    shared: frozenset[int] = frozenset()  # every object reachable from a kept name
    complete: bool = True  # False: kept names too large to walk; cut no container
    notes: list[str] = field(default_factory=list)
    unlinks: list[Callable[[], None]] = field(default_factory=list)  # not reported as dropped
    roots: list[Any] = field(default_factory=list)  # the kept state whose ownership counts
    droppable: tuple[type, ...] = ()  # what a cleanup drops: all model state but callbacks
    _owned: state.Owned | None = None

    def keeps(self, obj: Any) -> bool:
        """Return whether a kept name holds ``obj``, or kept state owns it (a shared layer)."""
        if id(obj) in self.held:
            return True
        kind = self.types.kind(type(obj))  # a model counts: one nested in a kept model is its
        return kind not in (None, "callback") and self.owned_by_kept().holds(obj, kind)

    def owned_by_kept(self) -> state.Owned:
        """Return what the kept state owns, read through Keras once, when first needed."""
        if self._owned is None:
            self._owned = state.owned(self.roots, self.types)
        return self._owned

    def found(self, path: str, value: Any) -> list[tuple[str, Any]]:
        """The stale state in ``value`` and its containers (the near walk): what nothing kept
        holds, only that is worth a cut."""
        found = self.near.state(path, value, self.droppable)
        return [(path, obj) for path, obj in found if not self.keeps(obj)]

    def drop(self, label: str, found: list[tuple[str, Any]], act: Cut, watch: bool = True) -> None:
        """Cut with ``act`` if ``found`` holds stale state; ``watch`` it for the report."""
        if found:
            self.actions.append((label, act))
            self.stale.update((id(o), (p, o)) for p, o in found if watch)

    def release_names(self, names: Iterable[str]) -> None:
        """Rebound names: unbound when bound to state, else stripped of the stale state."""
        for name in names:
            value, found = self.ns.get(name), []
            for path, obj in state.models_under(name, value, self.droppable):
                if not self.keeps(obj):
                    found.append((path, obj))
                elif self.types.kind(type(obj)) == "model":  # under a kept name too: it stays
                    self.kept.setdefault(id(obj), (f"{path} (also held by a kept name)", obj))
            if not found:
                continue
            if state.is_a(value, self.droppable):
                self.drop(_label(name, value, self), found, partial(self.ns.pop, name, None))
            elif self.complete:
                act = partial(_strip_name, self.ns, name, self.droppable, self.shared)
                self.drop(found[0][0], found, act)  # one cut; each path said, as a name is
                self.actions += [(path, _cut_above) for path, _ in found[1:]]
            else:
                self.notes.append(
                    f"kept names too large to scan: model state inside {name} not cut"
                )

    def release_output_cache(self) -> None:
        out: Any = self.ns.get("Out")
        for key, value in list(out.items()) if isinstance(out, dict) else ():
            label = f"Out[{key}]"
            self.drop(label, self.found(label, value), partial(_forget_output, self.ns, out, key))
        for name in ("_", "__", "___"):
            reset = partial(self.ns.__setitem__, name, "")
            self.drop(name, self.found(name, self.ns.get(name)), reset)

    def release_tracebacks(self) -> None:
        """Stored errors drop their frames' locals where those hold stale model state. An
        out-of-memory error goes altogether: its frames hold the batch and the tensors that ran
        out, and the functions they ran (Keras's ``predict`` closes over the model) keep the
        model after it is rebound. Its traceback was shown; ``%tb`` has nothing to show after."""
        oom = any(find_oom(getattr(sys, n, None)) is not None for n in ("last_value", "last_exc"))
        for label, tb in stored_tracebacks():
            found = [o for p, v in frame_locals(label, tb, self.ns) for o in self.found(p, v)]
            self.stale.update((id(o), (p, o)) for p, o in found)
            if found or oom:  # an OOM's is said once, below
                self.actions.append(("" if oom else label, partial(clear_frames, tb)))
        if oom:
            drop = partial(drop_stored_errors, self.shell)
            self.actions.append(("the stored out-of-memory error", drop))

    def cut_callback_links(self, deeper: Iterable[tuple[str, Any]]) -> None:
        """Cut callbacks' links to models nothing kept holds, at any depth of the namespace. A
        deep one is labelled by its link's path (``results['folds'][3]['history'].model``), or
        by its root name past the search's reach."""
        found: dict[int, tuple[str, Any]] = {}  # one callback under many names: its first path
        for name in state.scan_order(self.ns):  # the user's names first
            for path, obj in self.near.state(name, self.ns.get(name), self.types.callbacks):
                found.setdefault(id(obj), (f"{path}.model", obj))
        close = len(found)
        for root, obj in deeper:
            found.setdefault(id(obj), (root, obj))
        deep = list(found.values())[close:]
        roots = [(r, self.ns[r]) for r in dict.fromkeys(r for r, _ in deep) if r in self.ns]
        types = self.types
        paths = state.paths_to(roots, {id(o) for _, o in deep}, types.callbacks, types.models)
        for i, (label, obj) in enumerate(found.values()):
            if i >= close:
                link = paths.get(id(obj))
                label = f"{link}.model" if link else f"a {type(obj).__name__} in {label}"
            model = state.callback_model(obj)
            if state.is_a(model, types.models) and id(model) not in self.held:
                self.stale[id(model)] = (label, model)
                self.actions.append((label, partial(_cut_link, obj)))

    def release_shell(self) -> None:
        """IPython keeps its own references: the display hook's ``_``s and the last result."""
        shell = self.shell
        cache = works("ipython.output_cache", shell)  # moved: said once, by compat; left as is
        hook = getattr(shell, "displayhook", None)
        for name in ("_", "__", "___") if cache else ():
            found = self.found(name, getattr(hook, name, None))
            self.drop(f"displayhook.{name}", found, partial(setattr, hook, name, ""), False)
        hidden: Any = getattr(shell, "user_ns_hidden", None)  # push(interactive=False) copies _, _N
        for name, value in list(hidden.items()) if cache and isinstance(hidden, dict) else ():
            if re.fullmatch(r"_+|_\d+", name):
                reset = partial(hidden.__setitem__, name, "")
                self.drop(f"displayhook.{name}", self.found(name, value), reset, False)
        last = getattr(shell, "last_execution_result", None)
        found = self.found("last result", getattr(last, "result", None))
        self.drop("last result", found, partial(setattr, last, "result", None))


def _label(path: str, obj: Any, plan: Plan) -> str:
    """Name a dropped object: a model by its path, other state with what it held."""
    kind = plan.types.kind(type(obj))
    if kind in (None, "model"):
        return path
    return f"{path} ({state.held_by(obj, kind, plan.owned_by_kept()).describe()})"


def _unlink_from_kept_layers(plan: Plan) -> None:
    """A kept layer (a base model) records every later call on its outputs in its outbound
    nodes, so a kept base held every head ever built on it, and their weights. Unlink the
    nodes of layers and operations no kept model owns (a kept model's ``keras.ops`` calls
    stay); Keras never reads that list to compute anything."""
    if not plan.roots:
        return
    kept = plan.owned_by_kept().layers
    cut: list[tuple[list[Any], list[Any]]] = []  # each kept layer's nodes, and the stale ones
    for layer in kept.values():
        module = type(layer).__module__ or ""
        reach = f"{'tf_keras' if module.startswith('tf_keras') else 'keras'}.outbound_nodes"
        if not works(reach):  # moved: said once, by compat
            continue
        nodes = state.outbound_nodes(layer)
        if nodes is None:
            if plan.types.kind(type(layer)) in ("model", "layer"):
                broken(reach, "moved Operation._outbound_nodes")
            continue
        ops = [state.node_layer(n) for n in nodes]
        if any(op is None for op in ops):  # a node whose operation cannot be read: cut nothing
            broken(reach, "moved Node.operation")
            continue
        stale = [
            n for n, op in zip(nodes, ops, strict=True) if id(op) not in kept and not plan.keeps(op)
        ]
        if stale:
            cut.append((nodes, stale))
    if cut:
        count = sum(len(stale) for _, stale in cut)
        calls = "a layer" if count == 1 else f"{count} layers"
        plan.notes.append(f"unlinked {calls} no kept model uses from the graphs of kept models")
        plan.unlinks.append(partial(_remove_nodes, cut))


def _remove_nodes(found: list[tuple[list[Any], list[Any]]]) -> None:
    for nodes, stale in found:
        ids = {id(n) for n in stale}
        nodes[:] = [n for n in nodes if id(n) not in ids]


def plan_cleanup(
    ns: MutableMapping[str, Any],
    *,
    rebinding: Iterable[str] = (),
    keep: Iterable[str] = (),
    drop_all: bool = False,
    shell: Any | None = None,
) -> Plan:
    """Plan the release of stale model state in ``ns`` (see the module docstring)."""
    types = state.state_types()
    plan = Plan(types, ns, state.NearWalks(types.callbacks), shell)
    if not types.models:
        return plan
    plan.droppable = tuple(c for k, classes in types.by_kind if k != "callback" for c in classes)
    users = [name for name in list(ns) if state.is_user_name(name)]
    release = (set(users) if drop_all else set(rebinding) & set(ns)) - set(keep)
    kept_names = [name for name in users if name not in release]
    for name in kept_names:
        found = plan.near.state(name, ns.get(name), types.models)
        plan.kept.update((id(m), (p, m)) for p, m in found)
    kept_roots = ((n, ns[n]) for n in kept_names if n in ns)
    reach = state.reachable(kept_roots, types.all, types.callbacks, skip=(ns,))
    plan.held = reach.models | frozenset(plan.kept)
    plan.roots = [obj for obj in reach.found if types.kind(type(obj)) != "callback"]
    plan.shared = reach.objects
    plan.complete = reach.complete
    released_roots = ((n, ns[n]) for n in sorted(release) if n in ns)
    released = state.reachable(released_roots, types.models, types.callbacks, (ns,))
    plan.release_names(sorted(release))
    plan.release_output_cache()
    plan.release_tracebacks()
    if shell is not None:
        plan.release_shell()
    plan.cut_callback_links(reach.callbacks + released.callbacks)
    _unlink_from_kept_layers(plan)
    for key in plan.held:
        plan.stale.pop(key, None)
    plan.near = state.NearWalks(())  # what it walked goes: the plan lives on until the cut
    return plan


# The cuts that need more than one call (``functools.partial`` of them, each).


def _strip_name(ns: MutableMapping[str, Any], name: str, types: Any, kept: Any) -> None:
    """Cut: the stale models out of the container bound to ``name`` (see ``strip``)."""
    if name in ns:
        ns[name] = state.strip(ns[name], types, kept)


def _cut_above() -> None:
    """Nothing: the action before it cut this path with the rest of its container."""


def _forget_output(ns: MutableMapping[str, Any], out: dict[Any, Any], key: Any) -> None:
    """Cut: IPython's ``Out[key]`` and its ``_key`` alias."""
    value = out.pop(key, None)
    if value is not None and ns.get(f"_{key}") is value:
        del ns[f"_{key}"]


def _cut_link(callback: Any) -> None:
    """Cut: a callback's (``History``'s) ``.model`` link; its numbers stay. Keras 3 keeps it in
    ``_model`` behind a ``model`` property, tf-keras in ``model``. Neither there means Keras
    moved it: said once, nothing written (a ``model`` entry would hide behind the property)."""
    attrs = state.instance_dict(callback) or {}
    key = next((k for k in ("_model", "model") if k in attrs), None)
    if key is None or (key == "_model" and not works("keras.callback_model")):
        broken("keras.callback_model", "moved Callback._model")
        return
    attrs[key] = None


# Stored tracebacks (``sys.last_*``): the locals they keep alive, and letting those go.


def stored_tracebacks() -> Iterator[tuple[str, pytypes.TracebackType]]:
    """Yield ``("sys.last_...", traceback)`` for each stored error and the errors it chains."""
    seen: set[int] = set()  # errors (and tracebacks) already followed
    yielded: set[int] = set()  # tracebacks already yielded: one error has up to three names
    for attr in ("last_traceback", "last_value", "last_exc"):
        obj = getattr(sys, attr, None)
        while obj is not None and id(obj) not in seen:
            seen.add(id(obj))
            is_tb = isinstance(obj, pytypes.TracebackType)
            tb = obj if is_tb else getattr(obj, "__traceback__", None)
            if tb is not None and id(tb) not in yielded:
                yielded.add(id(tb))
                yield f"sys.{attr}", tb
            obj = getattr(obj, "__context__", None) if isinstance(obj, BaseException) else None


_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
MAX_CALLERS = 1000


def kept_frames(tb: pytypes.TracebackType) -> Iterator[pytypes.FrameType]:
    """Yield the frames ``tb`` keeps alive: its own, and the callers each links to.

    A library that rewrites tracebacks (Keras filters its own frames out) leaves those frames
    out of ``tb`` but not dead: they are reached through ``f_back``, with the model in their
    locals. The walk up stops at the cell's runner (IPython's ``run_code``), at a generator or
    coroutine (a long-lived one, the kernel's dispatch loop, must never be finalized) and after
    ``MAX_CALLERS`` frames.
    """
    stops: set[Any] = set()
    if works("ipython.run_code"):  # moved: said once, by compat; the frames go to the top
        shell = getattr(sys.modules.get("IPython.core.interactiveshell"), "InteractiveShell", None)
        stops = {getattr(getattr(shell, "run_code", None), "__code__", None)} - {None}
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
    label: str, tb: pytypes.TracebackType, namespace: Mapping[str, Any], hidden: bool = True
) -> Iterator[tuple[str, Any]]:
    """Yield ``("sys.last_traceback (fn: name)", value)`` for the locals a traceback keeps.

    A cell's own frame is skipped (its locals are the user namespace itself), and so is the
    namespace wherever a runner's frame holds it, as a local or in its ``*args``. ``hidden``:
    the frames IPython hides (``__tracebackhide__``: kerasmagic's wrappers) too.
    """
    for frame in kept_frames(tb):
        if frame.f_locals is namespace or (not hidden and "__tracebackhide__" in frame.f_locals):
            continue
        for name, value in list(frame.f_locals.items()):
            where = f"{label} ({frame.f_code.co_name}: {name})"
            if value is namespace:
                continue
            if type(value) is tuple and any(item is namespace for item in value):
                yield from ((f"{where}[{i}]", x) for i, x in enumerate(value) if x is not namespace)
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
    traceback IPython's formatter keeps; return whether there was one (its frames keep the
    functions they ran even with their locals dropped)."""
    names = ("last_type", "last_value", "last_traceback", "last_exc")
    stored = [attr for attr in names if getattr(sys, attr, None) is not None]
    for attr in stored:
        setattr(sys, attr, None)
    result: Any = getattr(shell, "last_execution_result", None)
    if getattr(result, "error_in_exec", None) is not None:
        result.error_in_exec = None
    formatter: Any = getattr(shell, "InteractiveTB", None)
    if getattr(formatter, "tb", None) is not None and works("ipython.traceback", shell):
        formatter.tb = None  # IPython's own "lingering reference" (ultratb's words)
    return bool(stored)


# -- every live model and what holds it, on demand ----------------------------------------------


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


def holder_paths(namespace: Mapping[str, Any], models: list[Any]) -> dict[int, list[str]]:
    """Return ``{id(obj): [paths]}`` for what the near walk reaches from the namespace and
    stored tracebacks, plus a path for each of ``models`` held only deeper."""
    paths: dict[int, list[str]] = {}
    cbs = state.callback_types()
    names = [(name, namespace.get(name)) for name in state.scan_order(namespace)]
    roots = list(names)
    for label, tb in stored_tracebacks():
        roots += frame_locals(label, tb, namespace, hidden=False)  # a holder the user can see
    for root, value in roots:
        for path, obj, _ in state.walk(root, value, cbs):
            paths.setdefault(id(obj), []).append(path)
    missing = {id(m) for m in models if id(m) not in paths}
    if missing:  # held deeper than the near walk looks: search from every name
        deep = state.paths_to(names, missing, cbs, state.model_types())
        paths.update((key, [path]) for key, path in deep.items())
    return paths


_TYPE_NAME = type.__dict__["__name__"]  # read past a metaclass's own __name__
_NOT_OWNERS = (dict, list, tuple, set, pytypes.FrameType, pytypes.FunctionType, pytypes.CellType)


def _type_name(kind: type) -> str:
    return str(_TYPE_NAME.__get__(kind))


def referrer_kinds(obj: Any, ignore: tuple[Any, ...] = (), limit: int = 3) -> list[str]:
    """Describe what refers to ``obj`` when no namespace path does (slow; survivors only).

    Referrers inside the model's own object graph (its layers' dicts, its traced functions'
    closures, its ``History``) are not holders: only what holds it from outside is named.
    """
    if not (works("cpython.referrers") and works("cpython.frames")):  # said once, by compat
        return []
    kinds = []
    modules = state.module_dicts()
    skip = {id(x) for x in ignore} | {id(sys._getframe()), id(sys._getframe(1))}
    skip |= state.own_objects(obj, modules)
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


def _refers_directly(holder: Any, obj: Any) -> bool:
    """Return whether ``holder`` itself (not through a dict) refers to ``obj``. A function of
    its own: a generator over ``obj`` in ``referrer_kinds`` would make ``obj`` a closure cell
    there, one more referrer of it."""
    return any(ref is obj for ref in gc.get_referents(holder))


def _dict_owner(attrs: dict[Any, Any], skip: set[int]) -> str:
    """Name the class or object whose attribute dict ``attrs`` is, if it is one."""
    owners = [
        owner
        for owner in gc.get_referrers(attrs)
        if id(owner) not in skip
        and not issubclass(type(owner), _NOT_OWNERS)
        and _refers_directly(owner, attrs)
    ]
    for owner in owners:
        if issubclass(type(owner), type):
            return f"an attribute of class {_type_name(owner)}"
    for owner in owners:
        return f"an attribute of a {_type_name(type(owner))} object"
    return "a dict outside the namespace (a module global or object attribute)"


def holder_remedy(holder: str) -> tuple[str, bool]:
    """Return what frees a model held by ``holder`` (a path from ``holder_paths``), and
    whether "Free memory" (the cleanup with nothing rebound) does it on its own."""
    root = holder.split("[", 1)[0].split(".", 1)[0].split(" ", 1)[0]
    if holder.startswith("sys.last"):
        return "a stored traceback: Free memory clears it", True
    if not state.is_user_name(root) and root:
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


def ipython_shell() -> Any | None:
    """Return the running IPython shell, or None (IPython is never imported here)."""
    ipython = sys.modules.get("IPython")
    return None if ipython is None else ipython.get_ipython()


def _listed(obj: Any, type_name: str, size: int, holders: list[str], kind: str) -> LiveModel:
    """One entry of ``live_models``: a model free with "Free memory" when each of its holders
    is (or nothing known holds it), loose state only when it has holders and each is."""
    remedies = [holder_remedy(h) for h in holders]
    freeable = all(free for _, free in remedies) and (bool(remedies) or kind == "model")
    traces = traced(obj) if kind == "model" else (None, None)
    name = str(state.guarded(lambda: str(obj.name), "?"))
    said = tuple(r for r, _ in remedies)
    return LiveModel(name, type_name, size, tuple(holders), *traces, freeable, said, kind)


def live_models(namespace: Mapping[str, Any] | None = None) -> list[LiveModel]:
    """Return every live Keras model (less the inner model a ``Sequential`` wraps), then the
    model state under the namespace's names that no live model owns (a ``KerasTensor`` still
    holding a dropped model's layers, a layer, an optimizer, a variable). Holders are named
    from ``namespace``: by default IPython's user namespace, if any."""
    if namespace is None:
        user_ns = getattr(ipython_shell(), "user_ns", None)
        namespace = user_ns if isinstance(user_ns, Mapping) else {}
    elif not isinstance(namespace, Mapping):
        raise TypeError(f"live_models() takes a namespace such as globals(), not a "
                        f"{type(namespace).__name__}")  # fmt: skip
    types = state.model_types()
    if not types or not works("cpython.referrers"):  # moved: said once, by compat
        return []
    # A loop in this cell may have frozen the collector's old objects (cleanup/loops.py), and
    # gc.get_objects() lists no frozen object: thawed first, as before any cleanup, and what
    # is garbage collected, so that a model listed is one something holds.
    Freezer.thaw()
    gc.collect()
    models = state.live_model_objects(types)
    owners: dict[int, list[str]] = {}
    for m in models:
        for layer in state.guarded(lambda m=m: list(m.layers), []):
            if state.is_a(layer, types):
                owners[id(layer)] = [f"layer of model '{m.name}'"]
    paths = holder_paths(namespace, models)
    out = []
    for m in models:
        held = paths.get(id(m)) or owners.get(id(m)) or referrer_kinds(m, (models,))
        size = int(state.guarded(lambda m=m: state.model_size_bytes(m), 0))
        out.append(_listed(m, type(m).__name__, size, held, "model"))
    out += _loose_state(namespace, models, paths)
    del models
    return out


LOOSE_KINDS = ("layer", "tensor", "optimizer", "metric", "variable")
MAX_LOOSE = 50  # loose pieces of state listed


def _loose_state(
    namespace: Mapping[str, Any], models: list[Any], paths: Mapping[int, list[str]]
) -> list[LiveModel]:
    """Model state under the namespace's names (two levels in) that no live model owns."""
    types = state.state_types()
    found: dict[int, tuple[Any, str]] = {}
    for name in state.scan_order(namespace):
        for _, obj, _ in state.walk(name, namespace.get(name), ()):
            if (kind := types.kind(type(obj))) in LOOSE_KINDS:
                found.setdefault(id(obj), (obj, kind))
    if not found:
        return []
    own, out = state.owned(models, types), []
    for obj, kind in found.values():
        if not own.holds(obj, kind):
            held = state.held_by(obj, kind)
            out.append(_listed(obj, held.type, held.size_bytes, paths.get(id(obj), []), kind))
    return sorted(out, key=lambda m: -m.size_bytes)[:MAX_LOOSE]


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
    return DeepScan(models, tuple(largest_variables(namespace)), state.count_models(namespace))
