"""Drop the custom-gradient entries that TensorFlow's gradient registry never lets go.

Every trace of a ``@tf.custom_gradient`` function (Keras 3's optimizer step goes through one)
registers ``CustomGradient-<uid>`` in ``ops.gradient_registry``; the entry's closure holds the
traced graph, so each fitted model stays in memory for good (tensorflow#97697). The registry is
private: everything here checks that it looks as expected and otherwise does nothing.

An entry is needed exactly as long as its graph is alive (a live graph may still be
differentiated). To find out, each entry is moved from the registry onto its own graph, which
turns "registry -> closure -> graph" into a cycle that the garbage collector can free; after a
collection the entries of the graphs that survived go back into the registry.
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kerasmagic.backends.tensorflow.graph import CUSTOM_GRADIENT_PREFIX, gradient_registry
from kerasmagic.walk.closures import closure_objects

_PARKED = "_kerasmagic_parked_gradients"  # attribute on a graph: {name: registry entry}
_SEARCH_DEPTH = 4


@dataclass(frozen=True)
class PurgeResult:
    """How many custom-gradient entries were dropped, kept (graph alive) or left (unknown)."""

    dropped: int
    kept: int
    unknown: int
    message: str | None = None


def _graphs_of(grad_fn: Any, graph_type: type) -> list[Any]:
    """Return the graphs whose tensors or ops a registered gradient function closes over."""
    graph_of = _graph_holders()
    graphs: dict[int, Any] = {}
    for obj in closure_objects(grad_fn, _SEARCH_DEPTH, containers=True):
        if not graph_of or not issubclass(type(obj), graph_of):
            continue  # only TensorFlow's own tensors and ops are asked for their graph
        try:
            graph = obj.graph
        except Exception:
            continue
        if isinstance(graph, graph_type):
            graphs[id(graph)] = graph
    return list(graphs.values())


def _graph_holders() -> tuple[type, ...]:
    """Return TensorFlow's tensor and op classes (what has a ``.graph``), if imported."""
    ops = sys.modules.get("tensorflow.python.framework.ops")
    tensor = sys.modules.get("tensorflow.python.framework.tensor")
    kinds = (
        getattr(tensor, "Tensor", None),
        getattr(ops, "Tensor", None),
        getattr(ops, "Operation", None),
    )
    return tuple(k for k in kinds if isinstance(k, type))


def _park(entries: dict[str, Any], name: str, graph_type: type) -> list[weakref.ref[Any]] | None:
    """Copy one entry onto its graphs; return weak references to them (None: no graph)."""
    entry = entries[name]
    graphs = _graphs_of(entry.get("type"), graph_type) if isinstance(entry, dict) else []
    if not graphs:
        return None
    for graph in graphs:
        if getattr(graph, _PARKED, None) is None:
            setattr(graph, _PARKED, {})
        getattr(graph, _PARKED)[name] = entry
    return [weakref.ref(graph) for graph in graphs]


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
    ops = sys.modules.get("tensorflow.python.framework.ops")
    graph_type = getattr(ops, "Graph", None)
    if entries is None or not isinstance(graph_type, type):
        collect()
        return PurgeResult(0, 0, 0, "TensorFlow's gradient registry not found; nothing purged")
    parked: dict[str, list[weakref.ref[Any]]] = {}
    unknown = 0
    try:
        for name in [key for key in list(entries) if key.startswith(CUSTOM_GRADIENT_PREFIX)]:
            refs = _park(entries, name, graph_type)
            if refs is None:
                unknown += 1
                continue
            parked[name] = refs  # recorded before removal, so the finally can always restore
            del entries[name]
        collect()
    finally:  # even on Ctrl-C: never leave a live graph without its gradient
        kept = sum(_unpark(entries, name, refs) for name, refs in parked.items())
    return PurgeResult(dropped=len(parked) - kept, kept=kept, unknown=unknown)
