"""Paths to objects deep in a namespace (``log['exp']['runs'][3]['history'].model``), on demand.

The per-cell walks look two levels deep; a report or a deep scan that must name a holder found
deeper searches from its root name, through containers, the attributes of the user's own
objects, bound methods and callbacks' ``.model`` links, without calling any of their methods.
"""

from __future__ import annotations

import types as pytypes
from collections.abc import Iterable, Mapping
from typing import Any

from kerasmagic.walk.children import PATH_DEPTH, PATH_VISITS, contents
from kerasmagic.walk.state import callback_model, is_a


def _children(obj: Any, callbacks: tuple[type, ...]) -> list[tuple[str, Any]]:
    if type(obj) is pytypes.MethodType:  # predict = model.predict keeps its model
        return [(".__self__", obj.__self__)]
    if is_a(obj, callbacks):
        model = callback_model(obj)
        return [] if model is None else [(".model", model)]
    return contents(obj)


def paths_to(
    roots: Iterable[tuple[str, Any]],
    targets: set[int],
    callbacks: tuple[type, ...] = (),
    models: tuple[type, ...] = (),
) -> dict[int, str]:
    """Return ``{id: path}`` for each of ``targets`` found from the ``(name, value)`` roots.

    The walk does not go into models (their insides are theirs) nor past ``PATH_DEPTH``.
    """
    found: dict[int, str] = {}
    seen: set[int] = set()
    for name, value in roots:
        stack: list[tuple[str, Any, int]] = [(name, value, 0)]
        while stack and len(found) < len(targets):
            path, obj, depth = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if len(seen) > PATH_VISITS:
                return found
            if id(obj) in targets:
                found[id(obj)] = path
            if depth >= PATH_DEPTH or is_a(obj, models):
                continue
            stack.extend(
                (path + suffix, child, depth + 1)
                for suffix, child in reversed(_children(obj, callbacks))
            )
    return found


def callback_labels(
    ns: Mapping[str, Any],
    deep: list[tuple[str, Any]],
    types: tuple[type, ...],
    cbs: tuple[type, ...],
) -> list[tuple[str, Any]]:
    """Label the ``(root name, callback)`` pairs by the path of their ``.model`` link
    (``results['folds'][3]['history'].model``), or by their root name past the search's reach."""
    if not deep:
        return []
    roots = [(r, ns[r]) for r in dict.fromkeys(root for root, _ in deep) if r in ns]
    paths = paths_to(roots, {id(obj) for _, obj in deep}, cbs, types)
    out = []
    for root, obj in deep:
        path = paths.get(id(obj))
        out.append((f"{path}.model" if path else f"a {type(obj).__name__} in {root}", obj))
    return out
