"""Keras's state: whether it is imported, its layer-name counter, the live models counted.

Nothing here imports Keras: a model can only exist once the user has imported it. What counts
as a model, and how the namespace is walked to count them, is ``kerasmagic.walk``'s.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kerasmagic.compat.reaches import works
from kerasmagic.walk.near import count_models
from kerasmagic.walk.state import model_types


@dataclass(frozen=True)
class KerasInfo:
    """Whether Keras is imported, its auto-name counter, and models found in the namespace."""

    imported: bool
    name_counter: int | None
    live_models: int | None


def name_counter() -> int | None:
    """Return the total of Keras's auto-name counters (``dense_57`` makes it grow).

    Keras 3 keeps them in its global state; legacy tf-keras per graph, in
    ``tf_keras.src.backend.PER_GRAPH_OBJECT_NAME_UIDS`` (a weak dict graph -> counters).
    """
    counts = []
    state = sys.modules.get("keras.src.backend.common.global_state")
    if state is not None and works("keras.global_state") and works("keras.name_uids"):
        uids = state.get_global_attribute("object_name_uids")
        counts.append(int(sum(uids.values())) if uids else 0)
    legacy = getattr(sys.modules.get("tf_keras.src.backend"), "PER_GRAPH_OBJECT_NAME_UIDS", None)
    if legacy is not None and works("tf_keras.name_uids"):
        graphs = list(legacy.values())  # a copy: graphs may be collected meanwhile
        counts.append(sum(int(sum(uids.values())) for uids in graphs))
    return sum(counts) if counts else None


def read_keras(namespace: Mapping[str, Any] | None) -> KerasInfo:
    """Return Keras's state; models are counted only when a namespace is given."""
    if not model_types():
        return KerasInfo(imported=False, name_counter=None, live_models=None)
    live = None if namespace is None else count_models(namespace)
    return KerasInfo(imported=True, name_counter=name_counter(), live_models=live)
