"""What a model itself reaches: its layers, variables, traced functions and their closures.

A referrer found in there is part of the model, not a holder of it (a report names only what
holds a model from outside). Unlike the namespace walks this one goes into functions: a
model's traced functions close over it.
"""

from __future__ import annotations

import gc
import types as pytypes
from collections.abc import Mapping
from typing import Any

from kerasmagic.walk.children import OWN_VISITS

_SHARED = (type, pytypes.ModuleType, pytypes.FrameType, pytypes.CodeType)  # everyone's


def own_objects(obj: Any, modules: Mapping[int, str]) -> set[int]:
    """Return the ids of what ``obj`` reaches, not going into modules (``modules``: the ids of
    their dicts), classes, code or frames, which everything shares."""
    seen = {id(obj)}
    stack = [obj]
    while stack and len(seen) < OWN_VISITS:
        for ref in gc.get_referents(stack.pop()):
            key = id(ref)
            if key in seen or key in modules or not gc.is_tracked(ref):
                continue
            if not issubclass(type(ref), _SHARED):
                seen.add(key)
                stack.append(ref)
    return seen
