"""Sizes of TensorFlow's global graph state that grows with every trace."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from kerasmagic.backends.tensorflow.alloc import runtime_initialized, tf_context
from kerasmagic.compat.reaches import works

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
    size = len(entries)
    if size != _count_cache[0]:
        count = sum(1 for key in list(entries) if key.startswith(CUSTOM_GRADIENT_PREFIX))
        _count_cache = (size, count)
    return _count_cache[1]


def _default_graph_ops() -> int | None:
    ops = sys.modules.get("tensorflow.python.framework.ops")
    if ops is None:
        return None
    # Ops are never removed from a graph, so its version counter is its op count (O(1)).
    version = getattr(ops.get_default_graph(), "version", None)  # tf.Graph.version: public
    return version if isinstance(version, int) else None


def function_count() -> int | None:
    """Return the size of the eager function library (~1 ms at 1,000; any thread), or None."""
    if not runtime_initialized():
        return None
    ctx = tf_context()
    return len(ctx.list_function_names()) if ctx is not None else None


def read_graph(functions: bool = True) -> GraphInfo:
    """Return graph-size figures; ``functions`` lists the eager function library (~1 ms)."""
    n_functions = function_count() if functions else None
    return GraphInfo(
        default_graph_ops=_default_graph_ops(),
        custom_gradients=custom_gradient_count(),
        functions=n_functions,
    )
