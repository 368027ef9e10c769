"""Free the traces that a user's ``tf.function`` keeps of models a cleanup dropped.

A ``@tf.function`` defined in an earlier cell (``train_step(model, opt, x, y)``) traces once per
model it is called with and keeps every trace in its cache: the traced graph, the handles of the
model's variables and, through the graph, the optimizer step's custom-gradient entries (~15 MB
a model). The model is only weakly referenced by the cache key, so it dies; its trace never does.
Here the ``tf.function`` objects reachable from the namespace (names, one level into containers
and instance attributes, and the globals and closures of user functions found there) lose every
trace that captured a variable of a dropped model or a variable already deleted: such a trace can
never run again, and the function simply traces anew on its next call. TensorFlow's cache is
private: where it does not look as expected nothing is touched and a note names the function,
the traces it keeps and the remedy.
"""

from __future__ import annotations

import sys
import types as pytypes
from collections.abc import Iterable, Mapping
from typing import Any

from kerasmagic.compat.reaches import works
from kerasmagic.walk.near import instances_near

_FUNCTION = "tensorflow.python.eager.polymorphic_function.polymorphic_function"
_CACHE = "tensorflow.core.function.polymorphism.function_cache"
_LOCK_TIMEOUT_S = 0.5


def _tf_types() -> tuple[type, type] | None:
    """Return (``Function``, ``FunctionCache``) if TensorFlow is imported and has them."""
    if _FUNCTION not in sys.modules or not works("tf.function_traces"):  # said by compat
        return None
    function = getattr(sys.modules.get(_FUNCTION), "Function", None)
    cache = getattr(sys.modules.get(_CACHE), "FunctionCache", None)
    if isinstance(function, type) and isinstance(cache, type):
        return function, cache
    return None


def variable_ids(models: Iterable[Any]) -> set[int]:
    """Return the ids of the resource handles of the models' (and their optimizers') variables.

    These are the very tensors a trace holds in ``captured_inputs``.
    """
    ids: set[int] = set()
    for model in models:
        try:
            variables = list(model.variables)
            optimizer = getattr(model, "optimizer", None)
            variables += list(getattr(optimizer, "variables", None) or ())
        except Exception:  # a half-built model: its variables cannot be listed
            continue
        for variable in variables:
            inner = getattr(variable, "_value", variable)  # Keras 3 wraps a tf.Variable
            handle = getattr(inner, "handle", None)
            if handle is not None:
                ids.add(id(handle))
    return ids


def _is_stale(concrete: Any, stale_ids: set[int]) -> bool:
    """Return True if a trace captured a stale variable's handle or a variable since deleted."""
    try:
        captured = concrete.captured_inputs
        weak_variables = concrete.graph._weak_variables
    except Exception:
        return False
    if any(id(tensor) in stale_ids for tensor in captured):
        return True
    return any(ref() is None for ref in weak_variables)


def _cache_of(fn: Any, cache_type: type) -> Any | None:
    """Return the Function's trace cache if it looks as TensorFlow 2.21 lays it out, else None."""
    cache = getattr(fn, "_function_cache", None)
    if type(cache) is not cache_type or not callable(getattr(cache, "delete", None)):
        return None
    primary, dispatch = getattr(cache, "_primary", None), getattr(cache, "_dispatch_dict", None)
    if not isinstance(primary, dict) or not isinstance(dispatch, dict):
        return None
    if not all(type(key) is tuple and len(key) == 2 for key in primary):
        return None
    for name in ("_variable_creation_config", "_no_variable_creation_config"):
        config = getattr(fn, name, None)
        if config is not None and getattr(config, "function_cache", None) is not cache:
            return None
    return cache


def _drop(fn: Any, cache: Any, stale_ids: set[int]) -> int:
    """Delete the stale traces from ``cache``; return how many went."""
    gone = [
        (key, concrete)
        for key, concrete in cache._primary.items()
        if _is_stale(concrete, stale_ids)
    ]
    dropped = sum(bool(cache.delete(ftype, context)) for (context, ftype), _ in gone)
    # The first call's trace, kept apart from the cache when that call created variables (an
    # optimizer built inside the step): it holds the variables it made, model and slots.
    first = getattr(fn, "_concrete_variable_creation_fn", None)
    if first is not None and getattr(fn, "_created_variables", None) is not None:
        cached = any(first is c for _, c in gone)
        if cached or _is_stale(first, stale_ids):
            fn._concrete_variable_creation_fn = None  # read only during the first call
            dropped += not cached
    if dropped and getattr(fn, "_created_variables", None):
        initializers = _first_call_initializers(fn)
        if initializers is not None:
            initializers.clear()  # run once, at the first call; they hold what it created
    return dropped


def _first_call_initializers(fn: Any) -> list[Any] | None:
    """Return the list of (variable, initial value) the first call's variable creator fills.

    TensorFlow keeps it in a closure of the first call's tracing options for the Function's
    life, so the variables that call created (an optimizer's slots, built inside the step) and
    the model they were made for outlive both, until the Function itself goes.
    """
    config = getattr(fn, "_variable_creation_config", None)
    wrapped = getattr(config, "python_function", None)
    scope = _closure_value(wrapped, "scope")
    found = _closure_value(scope, "add_initializers_to")
    return found if type(found) is list else None


def _closure_value(function: Any, name: str) -> Any:
    """Return the value of ``function``'s free variable ``name``, or None."""
    if type(function) is not pytypes.FunctionType or function.__closure__ is None:
        return None
    for free, cell in zip(function.__code__.co_freevars, function.__closure__, strict=True):
        if free == name:
            try:
                return cell.cell_contents
            except ValueError:  # an empty cell
                return None
    return None


def _clear(path: str, fn: Any, cache_type: type, stale_ids: set[int]) -> str | None:
    """Drop one function's stale traces; return a note (what went, or why nothing did)."""
    cache = _cache_of(fn, cache_type)
    label = f"tf.function {path}"
    if cache is None:
        held = sum(1 for c in _traces(fn) if _is_stale(c, stale_ids))
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


def _traces(fn: Any) -> list[Any]:
    try:
        return list(fn._list_all_concrete_functions())
    except Exception:
        return []


def clear_stale_traces(
    ns: Mapping[str, Any], stale: Iterable[Any], kept: Iterable[Any] = ()
) -> list[str]:
    """Free the traces of ``stale`` models held by tf.functions in ``ns``; return notes.

    Variables that a ``kept`` model shares (a reused encoder) never make a trace stale.
    """
    found = _tf_types()
    if found is None:
        return []
    function_type, cache_type = found
    stale_ids = variable_ids(stale) - variable_ids(kept)
    notes = []
    for path, fn in instances_near(ns, function_type):
        note = _clear(path, fn, cache_type, stale_ids)
        if note:
            notes.append(note)
    return notes
