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
import io
import sys
import tokenize
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType
from typing import Any, TypeVar

from kerasmagic.cells.parse import Rebinding, assigned_in, rebinding_in
from kerasmagic.shellstate import ShellState, state_of

MAX_CELLS = 256
T = TypeVar("T")


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
    def is_async(self) -> bool:
        """Return whether the cell awaits at top level (it must run on an event loop)."""
        codes = (self.body, self.last) if self.last is not None else (self.body,)
        return any(code.co_flags & inspect.CO_COROUTINE for code in codes)


def cell_source(code: str, header: str) -> str:
    """Return the source cached for a cell: the ``%%magic`` line as a comment, then ``code``.

    AutoGraph and inspect parse that source (a lambda's code is found by parsing its whole
    file), and "%%magic" is not Python.
    """
    return f"# {header}\n{code}" if header else code


@dataclass
class CellCache:
    """The ``cells`` part of one shell: the cells compiled for ``%%fresh_model`` (by source,
    newest last) and the body being checked, handed from the input check to the magic."""

    compiled: OrderedDict[str, CompiledCell] = field(default_factory=OrderedDict)
    transformed: tuple[str, str] | None = None  # this cell's %%fresh_model body, transformed
    checked: tuple[str, ast.Module] | None = None  # (source, tree) parsed before the cell ran


def cache_of(shell: Any) -> CellCache | None:
    """Return the shell's cell cache while the extension is loaded there, else None."""
    state = state_of(shell)
    found = None if state is None else state.part("cells")
    return found if isinstance(found, CellCache) else None


def load(state: ShellState) -> CellCache:
    """The ``cells`` part: an empty cache for the shell."""
    return CellCache()


def unload(state: ShellState, cache: CellCache) -> None:
    """Forget the compiled cells."""
    cache.compiled.clear()
    cache.transformed = cache.checked = None


def transformed_body(shell: Any, body: str) -> str:
    """Return ``shell.transform_cell(body)``, once per body (the checks and the magic share it).

    IPython's transform costs seconds on a cell of megabytes; the input transformers and the
    magic would otherwise each pay it again for the same body.
    """
    cache = cache_of(shell)
    if cache is not None and cache.transformed is not None and cache.transformed[0] == body:
        return cache.transformed[1]
    code = str(shell.transform_cell(body))
    dropped = _blank_lines(body) - _blank_lines(code)  # IPython drops a cell's leading blanks
    code = "\n" * max(dropped, 0) + code  # kept: line N of the code is line N of the body
    if cache is not None:
        cache.transformed = (body, code)
    return code


def _blank_lines(text: str) -> int:
    """Return how many whitespace-only lines ``text`` starts with (a cell of megabytes is
    read up to its first other line)."""
    count = 0
    for line in io.StringIO(text):
        if line.strip() or not line.endswith("\n"):
            break
        count += 1
    return count


def compile_cell(shell: Any, code: str, header: str = "") -> CompiledCell:
    """Return the compiled cell for ``code`` (IPython-transformed source), reusing earlier ones.

    ``header`` (the ``%%magic`` line) is shown as line 1 in tracebacks, so line numbers match
    the notebook cell. Raise ``SyntaxError`` (naming the cell) if the code does not compile.
    A cell ``cells.precheck`` parsed when IPython transformed it is not parsed again.
    """
    source = cell_source(code, header)
    number = cell_number(shell)
    cache = cache_of(shell)
    compiled_cells = OrderedDict() if cache is None else cache.compiled
    cached = compiled_cells.get(source)
    if cached is not None:
        compiled_cells.move_to_end(source)
        _name_cell(shell, cached.filename, number)
        return cached
    checked = None if cache is None else cache.checked
    if cache is not None:
        cache.checked = None  # handed over once: a parsed cell of megabytes is large
    tree = checked[1] if checked is not None and checked[0] == source else None
    compiled = _compile(shell, source, code, number, offset=1 if header else 0, tree=tree)
    compiled_cells[source] = compiled
    if len(compiled_cells) > MAX_CELLS:
        compiled_cells.popitem(last=False)
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


def extra_flags(shell: Any) -> int:
    """Return the compile flags IPython adds for a cell: top-level ``await`` with autoawait."""
    return ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if getattr(shell, "autoawait", False) else 0


def _compile(
    shell: Any, source: str, code: str, number: int, offset: int, tree: ast.Module | None
) -> CompiledCell:
    compiler = shell.compile
    filename = compiler.cache(source, number)
    with compiler.extra_flags(extra_flags(shell)):
        text = "\n" * offset + code
        if tree is None:
            tree = compiling(filename, compiler.ast_parse, text, filename)
        rebinding, assigned = rebinding_in(tree), frozenset(assigned_in(tree))
        silenced = _ends_with_semicolon(text, tree)
        module: Any = shell.transform_ast(tree)
        last = None
        if module.body and isinstance(module.body[-1], ast.Expr):
            shown = ast.Expression(module.body.pop().value)
            last = compiling(filename, compiler, shown, filename, "eval")
        # the shell's compiler keeps __future__ imports
        body = compiling(filename, compiler, module, filename, "exec")
    return CompiledCell(body, last, filename, rebinding, assigned, silenced)


COMPILE_ERRORS = (SyntaxError, MemoryError, RecursionError, ValueError, OverflowError, TypeError)


def compiling(filename: str, compile_fn: Callable[..., T], *args: Any) -> T:
    """Return ``compile_fn(*args)``; raise what Python's compiler refuses as a ``SyntaxError``.

    A parser out of stack raises ``MemoryError`` or ``RecursionError``, older Pythons a
    ``ValueError`` for a NUL byte: IPython shows only a ``SyntaxError`` without its frames.
    """
    try:
        return compile_fn(*args)
    except SyntaxError:
        raise
    except COMPILE_ERRORS as error:
        detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if isinstance(error, (MemoryError, RecursionError)):
            detail = f"too deeply nested for Python's compiler ({detail})"
        raise SyntaxError(detail, (filename, None, None, None)) from None


def _ends_with_semicolon(text: str, tree: ast.Module) -> bool:
    """Return whether a ``;`` follows the cell's last expression (IPython then shows no Out),
    reading the last statement's lines only (not a cell of megabytes)."""
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr):
        return False
    return semicolon_at_end("\n".join(text.splitlines()[last.lineno - 1 :]))


SKIPPED_TOKENS = (tokenize.ENDMARKER, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)


def semicolon_at_end(tail: str) -> bool:
    """Return whether ``tail``'s last token is ``;`` (IPython 7's ``DisplayHook.quiet`` and 8's
    ``semicolon_at_end_of_expression`` test, which IPython 7 lacks)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(tail).readline))
    except (tokenize.TokenError, SyntaxError):  # a line a statement shares: as IPython, show it
        return False
    for token in reversed(tokens):
        if token.type not in SKIPPED_TOKENS:
            return token.type == tokenize.OP and token.string == ";"
    return False
