"""What a function holds through its closure, a few levels down.

TensorFlow's registered gradient functions close over the tensors of the graph they were traced
in, and Keras's ``train_function`` is a Python function closing over a ``tf.function``: both
are found by reading closure cells (and, where asked, the items of built-in containers), never
by calling anything.
"""

from __future__ import annotations

import types as pytypes
from collections.abc import Iterator
from typing import Any

from kerasmagic.walk.children import items_of


def closure_objects(obj: Any, depth: int, containers: bool = False) -> Iterator[Any]:
    """Yield ``obj`` and what it holds ``depth`` levels down: a Python function's closure
    contents and, with ``containers``, the items of lists, tuples, dicts and sets."""
    yield obj
    if depth <= 0:
        return
    if type(obj) is pytypes.FunctionType:
        for cell in obj.__closure__ or ():
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            yield from closure_objects(content, depth - 1, containers)
    elif containers:
        for _, item in items_of(obj) or ():
            yield from closure_objects(item, depth - 1, containers)
