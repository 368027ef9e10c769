"""TensorFlow's graphs: their sizes, the gradient-registry purge, a model's traced graphs, and the
tf.function traces that earlier cells keep of dropped models.
"""

from __future__ import annotations

import functools
import gc
import sys
import types as pytypes
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kerasmagic.backends import attempt
from kerasmagic.backends.tensorflow.runtime import runtime_initialized, tf_context
from kerasmagic.compat.registry import works
from kerasmagic.walk import closure_objects, instances_near

CUSTOM_GRADIENT_PREFIX = "CustomGradient-"


@dataclass(frozen=True)
class GraphInfo:
    """Op count of the TF1 default graph, custom-gradient entries, traced functions."""

    default_graph_ops: int | None
    custom_gradients: int | None
    functions: int | None


_count_cache: tuple[int, int] = (-1, 0)  # (registry size, custom-gradient count) last seen


def gradient_registry() -> dict[str, dict[str, object]] | None:
    """Return TensorFlow's gradient registry dict if TensorFlow is imported, else None."""
    ops = sys.modules.get("tensorflow.python.framework.ops")
    if ops is None or not works("tf.gradient_registry"):  # moved: said once, by compat
        return None
    entries = getattr(getattr(ops, "gradient_registry", None), "_registry", None)
    return entries if isinstance(entries, dict) else None


def custom_gradient_count() -> int | None:
    """Count ``CustomGradient-*`` entries, rescanning only when the registry changed size."""
    global _count_cache
    entries = gradient_registry()
    if entries is None:
        return None
    if (size := len(entries)) != _count_cache[0]:
        _count_cache = (size, sum(key.startswith(CUSTOM_GRADIENT_PREFIX) for key in list(entries)))
    return _count_cache[1]


def function_count() -> int | None:
    """Return the size of the eager function library (~1 ms at 1,000; any thread), or None."""
    ctx = tf_context() if runtime_initialized() else None
    return len(ctx.list_function_names()) if ctx is not None else None


def read_graph(functions: bool = True) -> GraphInfo:
    """Return graph-size figures; ``functions`` lists the eager function library (~1 ms)."""
    ops = sys.modules.get("tensorflow.python.framework.ops")
    # Ops are never removed from a graph, so its version counter is its op count (O(1)).
    version = getattr(ops.get_default_graph(), "version", None) if ops else None  # public
    graph_ops = version if isinstance(version, int) else None
    return GraphInfo(graph_ops, custom_gradient_count(), function_count() if functions else None)


# -- purge: Drop the custom-gradient entries that TensorFlow's gradient registry never lets go
_PARKED = "_kerasmagic_parked_gradients"  # attribute on a graph: {name: registry entry}
_SEARCH_DEPTH = 4


@dataclass(frozen=True)
class PurgeResult:
    """How many custom-gradient entries were dropped, kept (graph alive) or left (unknown)."""

    dropped: int
    kept: int
    unknown: int
    message: str | None = None


def _park(entries: dict[str, Any], name: str, graph_type: type) -> list[weakref.ref[Any]] | None:
    """Copy one entry onto the graphs whose tensors or ops its gradient function closes over;
    return weak references to them (None: no graph)."""
    entry = entries[name]
    ops = sys.modules.get("tensorflow.python.framework.ops")
    tensor = sys.modules.get("tensorflow.python.framework.tensor")
    kinds = [
        getattr(m, n, None) for m, n in ((tensor, "Tensor"), (ops, "Tensor"), (ops, "Operation"))
    ]
    holders = tuple(k for k in kinds if isinstance(k, type))  # what has a ``.graph``
    graphs: dict[int, Any] = {}
    grad_fn = entry.get("type") if isinstance(entry, dict) else None
    for obj in closure_objects(grad_fn, _SEARCH_DEPTH, containers=True) if holders else ():
        if issubclass(type(obj), holders):  # only TensorFlow's own are asked for their graph
            graph = attempt(functools.partial(getattr, obj, "graph"), None)
            if isinstance(graph, graph_type):
                graphs[id(graph)] = graph
    for graph in graphs.values():
        setattr(graph, _PARKED, {**(getattr(graph, _PARKED, None) or {}), name: entry})
    return [weakref.ref(graph) for graph in graphs.values()] or None


def _unpark(entries: dict[str, Any], name: str, refs: list[weakref.ref[Any]]) -> bool:
    """Put an entry back if any of its graphs survived; return True if it did."""
    alive = [graph for graph in (ref() for ref in refs) if graph is not None]
    for graph in alive:
        entry = getattr(graph, _PARKED, {}).pop(name, None)
        if entry is not None:
            entries[name] = entry
    return bool(alive)


def purge_custom_gradients(collect: Callable[[], object] = gc.collect) -> PurgeResult:
    """Drop registry entries whose graphs nothing else keeps alive; ``collect`` runs gc once."""
    entries = gradient_registry()
    graph_type = getattr(sys.modules.get("tensorflow.python.framework.ops"), "Graph", None)
    if entries is None or not isinstance(graph_type, type) or not works("tf.graph_attributes"):
        collect()
        return PurgeResult(0, 0, 0, "TensorFlow's gradient registry not found; nothing purged")
    parked: dict[str, list[weakref.ref[Any]]] = {}
    names = [key for key in list(entries) if key.startswith(CUSTOM_GRADIENT_PREFIX)]
    try:
        for name in names:
            refs = _park(entries, name, graph_type)
            if refs is not None:  # None: no graph found, the entry stays (unknown)
                parked[name] = refs  # recorded before removal, so the finally can always restore
                del entries[name]
        collect()
    finally:  # even on Ctrl-C: never leave a live graph without its gradient
        kept = sum(_unpark(entries, name, refs) for name, refs in parked.items())
    return PurgeResult(len(parked) - kept, kept, len(names) - len(parked))


# -- traced: What a Keras model keeps besides its weights: the graphs of its traced TensorFlow f
# Measured here (TF 2.21, Keras 3.15, CPU): Dense 256-256-10 fitted and predicted traces
# 1,302 ops; dropping 8 such models freed 23.9 MB each, 1.1 MB of it weights and Adam state.
OP_BYTES = 16 * 1024  # estimated bytes a traced op keeps alive
FUNCTION_ATTRS = ("train_function", "test_function", "predict_function")


def _graph_ops(concrete: Any) -> int:
    """Return the ops of a trace's graph and of the functions it calls."""
    called = dict(getattr(concrete.graph, "_functions", {})).values()
    graphs = [concrete.graph, *(getattr(f, "graph", None) for f in called)]
    return sum(len(graph.get_operations()) for graph in graphs if graph is not None)


def traced_ops(model: Any) -> int | None:
    """Return the ops in the graphs a model's traced functions hold (None: not TensorFlow)."""
    attrs = getattr(model, "__dict__", None)
    if type(attrs) is not dict or "tensorflow" not in sys.modules or not works("tf.traced_graphs"):
        return None
    kind = getattr(sys.modules.get(_FUNCTION), "Function", None)
    try:
        found = [o for name in FUNCTION_ATTRS for o in closure_objects(attrs.get(name), 3)]
        fns = [fn for fn in found if kind is not None and issubclass(type(fn), kind)]
        return sum(_graph_ops(c) for fn in fns for c in fn._list_all_concrete_functions())
    except Exception:  # a private TF structure changed: say "unknown", never fail --deep
        return None


# -- traces: Free the traces that a user's ``tf.function`` keeps of models a cleanup dropped
_FUNCTION = "tensorflow.python.eager.polymorphic_function.polymorphic_function"
_CACHE = "tensorflow.core.function.polymorphism.function_cache"
_LOCK_TIMEOUT_S = 0.5


def variable_ids(models: Iterable[Any]) -> set[int]:
    """Return the ids of the resource handles of the models' (and their optimizers') variables.

    These are the very tensors a trace holds in ``captured_inputs``.
    """
    ids: set[int] = set()
    for model in models:
        try:
            variables = list(model.variables)
            variables += getattr(getattr(model, "optimizer", None), "variables", None) or ()
        except Exception:  # a half-built model: its variables cannot be listed
            continue
        keras = works("keras.variables")  # moved: each variable is taken as it is
        inner = (getattr(v, "_value", v) if keras else v for v in variables)  # Keras 3 wraps
        handles = (getattr(variable, "handle", None) for variable in inner)
        ids.update(id(handle) for handle in handles if handle is not None)
    return ids


def _is_stale(concrete: Any, stale_ids: set[int]) -> bool:
    """Return True if a trace captured a stale variable's handle or a variable since deleted."""
    try:
        captured, weak_variables = concrete.captured_inputs, concrete.graph._weak_variables
    except Exception:
        return False
    return any(id(t) in stale_ids for t in captured) or any(r() is None for r in weak_variables)


def _cache_of(fn: Any, cache_type: type) -> Any | None:
    """Return the Function's trace cache if it looks as TensorFlow 2.21 lays it out, else None."""
    cache = getattr(fn, "_function_cache", None)
    names = ("_variable_creation_config", "_no_variable_creation_config")
    configs = [getattr(fn, name, None) for name in names]
    if (
        type(cache) is not cache_type
        or not callable(getattr(cache, "delete", None))
        or not isinstance(primary := getattr(cache, "_primary", None), dict)
        or not isinstance(getattr(cache, "_dispatch_dict", None), dict)
        or not all(type(key) is tuple and len(key) == 2 for key in primary)
        or any(c is not None and getattr(c, "function_cache", None) is not cache for c in configs)
    ):
        return None
    return cache


def _drop(fn: Any, cache: Any, stale_ids: set[int]) -> int:
    """Delete the stale traces from ``cache``; return how many went."""
    gone = [(key, c) for key, c in cache._primary.items() if _is_stale(c, stale_ids)]
    dropped = sum(bool(cache.delete(ftype, context)) for (context, ftype), _ in gone)
    # The first call's trace, kept apart from the cache when that call created variables (an
    # optimizer built inside the step): it holds the variables it made, model and slots.
    first = getattr(fn, "_concrete_variable_creation_fn", None)
    if first is not None and getattr(fn, "_created_variables", None) is not None:
        cached = any(first is c for _, c in gone)
        if cached or _is_stale(first, stale_ids):
            fn._concrete_variable_creation_fn = None  # read only during the first call
            dropped += not cached
    if dropped and not cache._primary and getattr(fn, "_created_variables", None):
        # Every trace held dropped models, and the first call made variables (an optimizer's
        # slots, built inside the step): start again as never called, as the step's own cell
        # re-run would. Kept, the next trace may not make the new optimizer's slots
        # ("tf.function only supports singleton tf.Variables created on the first call").
        fn._created_variables = fn._concrete_variable_creation_fn = None
        fn._variable_creation_config = fn._no_variable_creation_config = None
        return dropped
    # The list of (variable, initial value) the first call's variable creator fills: TensorFlow
    # keeps it in a closure of the first call's tracing options for the Function's life, so the
    # variables that call created (an optimizer's slots, built inside the step) and the model
    # they were made for outlive both, until the Function itself goes. Works: moved, said once.
    if dropped and getattr(fn, "_created_variables", None) and works("tf.first_call_initializers"):
        wrapped = getattr(getattr(fn, "_variable_creation_config", None), "python_function", None)
        initializers = _closure_value(_closure_value(wrapped, "scope"), "add_initializers_to")
        if type(initializers) is list:
            initializers.clear()  # run once, at the first call; they hold what it created
    return dropped


def _closure_value(function: Any, name: str) -> Any:
    """Return the value of ``function``'s free variable ``name``, or None (an empty cell too)."""
    if type(function) is not pytypes.FunctionType:
        return None
    cells = dict(zip(function.__code__.co_freevars, function.__closure__ or (), strict=False))
    return attempt(lambda: cells[name].cell_contents, None)


def _clear(path: str, fn: Any, cache_type: type, stale_ids: set[int]) -> str | None:
    """Drop one function's stale traces; return a note (what went, or why nothing did)."""
    cache = _cache_of(fn, cache_type)
    label = f"tf.function {path}"
    if cache is None:
        traces: list[Any] = attempt(lambda: list(fn._list_all_concrete_functions()), [])
        held = sum(1 for c in traces if _is_stale(c, stale_ids))
        if not held:
            return None
        return (
            f"{label} keeps {_traces_text(held)} of dropped models (TensorFlow's trace cache "
            "not as expected; not cleared): re-run the cell that defines it to free them"
        )
    lock = getattr(fn, "_lock", None)
    if lock is None or not lock.acquire(timeout=_LOCK_TIMEOUT_S):
        return f"{label} is busy in another thread; its traces of dropped models stay"
    try:
        dropped = _drop(fn, cache, stale_ids)
    finally:
        lock.release()
    return f"cleared {_traces_text(dropped)} of {label}" if dropped else None


def _traces_text(count: int) -> str:
    return f"{count} trace" + ("" if count == 1 else "s")


def clear_stale_traces(
    ns: Mapping[str, Any], stale: Iterable[Any], kept: Iterable[Any] = ()
) -> list[str]:
    """Free the traces of ``stale`` models held by tf.functions in ``ns``; return notes.

    Variables that a ``kept`` model shares (a reused encoder) never make a trace stale.
    """
    if _FUNCTION not in sys.modules or not works("tf.function_traces"):  # said by compat
        return []
    function_type = getattr(sys.modules.get(_FUNCTION), "Function", None)
    cache_type = getattr(sys.modules.get(_CACHE), "FunctionCache", None)
    if not isinstance(function_type, type) or not isinstance(cache_type, type):
        return []
    stale_ids = variable_ids(stale) - variable_ids(kept)
    found = instances_near(ns, function_type)
    notes = [_clear(path, fn, cache_type, stale_ids) for path, fn in found]
    return [note for note in notes if note]
