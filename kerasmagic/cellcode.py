"""Run a cell so that TensorFlow's native stack-trace cache sees the same code objects each time.

TensorFlow's eager runtime records the innermost ~25 Python frames of ops in a C++ map keyed by
code objects and never empties it. A re-run cell compiled afresh is a new key, and so is the
code IPython compiles around every ``%%fresh_model`` call: together ~0.3 MB per re-run that
``gc`` cannot see. So the cell's code is compiled once per distinct source, and it runs below a
fixed stack of padding frames that pushes IPython's fresh frames out of the captured window.
"""

from __future__ import annotations

import ast
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType
from typing import Any

MAX_CELLS = 256
PADDING_FRAMES = 32  # deeper than the frames TensorFlow captures from an eager op


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
    flags = shell.compile.flags  # the shell's __future__ flags, not this module's
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        expr = ast.Expression(tree.body.pop().value)
        last = compile(expr, filename, "eval", flags=flags, dont_inherit=True)
    compiled = CompiledCell(compile(tree, filename, "exec", flags=flags, dont_inherit=True), last)
    _cache[code] = compiled
    if len(_cache) > MAX_CELLS:
        _cache.popitem(last=False)
    return compiled


def run_padded(fn: Callable[..., Any], *args: Any, depth: int = PADDING_FRAMES) -> Any:
    """Call ``fn(*args)`` below ``depth`` identical frames (IPython hides them in tracebacks)."""
    __tracebackhide__ = True  # read by IPython's traceback formatter
    return fn(*args) if depth <= 0 else run_padded(fn, *args, depth=depth - 1)
