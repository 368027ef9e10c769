"""Compile a ``%%fresh_model`` cell as IPython compiles a plain cell (``cells.runner`` runs it).

TensorFlow's eager runtime records the innermost ~25 Python frames of ops in a C++ map keyed by
code objects and never empties it. A re-run cell compiled afresh is a new key: ~0.3 MB per
re-run that ``gc`` cannot see. So the cell's code is compiled once per distinct source.

Like a plain cell, the code is compiled by the shell's compiler (its ``__future__`` flags, and
top-level ``await`` when ``autoawait`` is on) and named ``Cell In[N]`` in tracebacks; the cell
is parsed once, and every step is linear in its size.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections import OrderedDict
from dataclasses import dataclass
from types import CodeType
from typing import Any

from kerasmagic.cells.parse import Rebinding, assigned_in, rebinding_in
from kerasmagic.shellstate import state_of

MAX_CELLS = 256


@dataclass(frozen=True)
class CompiledCell:
    """A cell's statements, its last expression (whose value the cell shows) and its names."""

    body: CodeType
    last: CodeType | None
    filename: str
    rebinding: Rebinding  # see kerasmagic.cells.parse for the rule
    assigned: frozenset[str]
    silenced: bool  # the last expression ends with ";": show no Out, as in a plain cell

    @property
    def rebound(self) -> frozenset[str]:
        """Return the names the cell's own code rebinds (``cells.reads`` may keep some)."""
        return self.rebinding.names

    @property
    def is_async(self) -> bool:
        """Return whether the cell awaits at top level (it must run on an event loop)."""
        codes = (self.body, self.last) if self.last is not None else (self.body,)
        return any(code.co_flags & inspect.CO_COROUTINE for code in codes)


def compile_cell(shell: Any, code: str, header: str = "") -> CompiledCell:
    """Return the compiled cell for ``code`` (IPython-transformed source), reusing earlier ones.

    ``header`` (the ``%%magic`` line) is shown as line 1 in tracebacks, so line numbers match
    the notebook cell. Raise ``SyntaxError`` (naming the cell) if the code does not compile.
    """
    # The header is a comment in the cached source: AutoGraph and inspect parse that source
    # (a lambda's code is found by parsing its whole file), and "%%magic" is not Python.
    source = f"# {header}\n{code}" if header else code
    number = cell_number(shell)
    state = state_of(shell)
    _cache: OrderedDict[str, CompiledCell] = OrderedDict() if state is None else state.compiled
    cached = _cache.get(source)
    if cached is not None:
        _cache.move_to_end(source)
        _name_cell(shell, cached.filename, number)
        return cached
    compiled = _compile(shell, source, code, number, offset=1 if header else 0)
    _cache[source] = compiled
    if len(_cache) > MAX_CELLS:
        _cache.popitem(last=False)
    return compiled


def cell_number(shell: Any, max_depth: int = 50) -> int:
    """Return the ``In[N]`` of the cell running now: the nearest calling frame IPython named.

    IPython 9 counts a cell before running it and IPython 8 after, so the shell's counter alone
    is off by one in one of them; the caller's code name is right in both.
    """
    names = getattr(shell.compile, "_filename_map", None)
    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            break
        if isinstance(names, dict) and frame.f_code.co_filename in names:
            return int(names[frame.f_code.co_filename])
        frame = frame.f_back  # type: ignore[assignment]
    return int(shell.execution_count)


def _name_cell(shell: Any, filename: str, number: int) -> None:
    """Show a re-used code object as ``Cell In[number]`` (IPython's filename -> count map)."""
    names = getattr(shell.compile, "_filename_map", None)
    if isinstance(names, dict):
        names[filename] = number


def _compile(shell: Any, source: str, code: str, number: int, offset: int) -> CompiledCell:
    compiler = shell.compile
    filename = compiler.cache(source, number)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if getattr(shell, "autoawait", False) else 0
    with compiler.extra_flags(flags):
        text = "\n" * offset + code
        tree = compiler.ast_parse(text, filename)
        rebinding, assigned = rebinding_in(tree), frozenset(assigned_in(tree))
        silenced = _ends_with_semicolon(text, tree)
        tree = shell.transform_ast(tree)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = compiler(ast.Expression(tree.body.pop().value), filename, "eval")
        body = compiler(tree, filename, "exec")  # the shell's compiler keeps __future__ imports
    return CompiledCell(body, last, filename, rebinding, assigned, silenced)


def _ends_with_semicolon(text: str, tree: ast.Module) -> bool:
    """Return whether a ``;`` follows the cell's last expression (IPython then shows no Out),
    asking IPython's own test of the last statement's lines (not of a cell of megabytes)."""
    from IPython.core.displayhook import DisplayHook

    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr):
        return False
    tail = "\n".join(text.splitlines()[last.lineno - 1 :])
    try:
        return bool(DisplayHook.semicolon_at_end_of_expression(tail))  # type: ignore[no-untyped-call]
    except Exception:  # tokenize's errors on a line a statement shares: as IPython, show it
        return False
