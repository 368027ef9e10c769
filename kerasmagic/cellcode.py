"""Compile a cell once per distinct source, so re-runs execute the same code object.

TensorFlow's eager runtime records the Python stack of ops in a C++ map keyed by code objects
and never empties it; a re-run cell compiled afresh is a new key (~0.1 MB per re-run that ``gc``
cannot see). Re-running the code object compiled for the same source keeps that map flat.
"""

from __future__ import annotations

import ast
from collections import OrderedDict
from dataclasses import dataclass
from types import CodeType
from typing import Any

MAX_CELLS = 256


@dataclass(frozen=True)
class CompiledCell:
    """A cell's statements, and its last expression (whose value the cell shows) if any."""

    body: CodeType
    last: CodeType | None


_cache: OrderedDict[str, CompiledCell] = OrderedDict()


def compile_cell(shell: Any, code: str) -> CompiledCell:
    """Return the compiled cell for ``code`` (IPython-transformed source), reusing earlier ones."""
    cached = _cache.get(code)
    if cached is not None:
        _cache.move_to_end(code)
        return cached
    tree = shell.transform_ast(ast.parse(code))
    filename = shell.compile.cache(code)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = compile(ast.Expression(tree.body.pop().value), filename, "eval")
    compiled = CompiledCell(compile(tree, filename, "exec"), last)
    _cache[code] = compiled
    if len(_cache) > MAX_CELLS:
        _cache.popitem(last=False)
    return compiled
