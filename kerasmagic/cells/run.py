"""A ``%%fresh_model`` cell as IPython runs a plain cell: compiled once per source, refused
before it runs if it does not compile, run below fixed padding frames, awaited when it awaits.

Compiled once: TensorFlow's eager runtime records the innermost ~25 Python frames of ops in a
C++ map keyed by code objects and never empties it. A re-run cell compiled afresh is a new key
that ``gc`` cannot see (``benchmarks/cell_code_objects.py``: 0.149 MB per re-run compiled
afresh without padding, 0.091 MB compiled once and padded). So the cell's code is compiled once
per distinct source (``compile_cell``). Like a plain cell, the code is compiled by the shell's
compiler (its ``__future__`` flags, and top-level ``await`` when ``autoawait`` is on) and named
``Cell In[N]`` in tracebacks; the cell is parsed once, and every step is linear in its size.

Refused (``CompileCheck``): IPython turns a cell magic into a call, so an error in the body (a
typo, a bad indent, a ``return`` outside a function, a NUL byte, nesting too deep for the
parser) would surface inside the magic, under frames of IPython and kerasmagic. This input
transformer compiles the body while IPython transforms the cell, before anything runs, and
raises the error there: IPython then shows it as it shows a plain cell's (the line and a caret,
no frames), runs nothing and marks the cell failed before execution. The parsed cell goes on to
the magic, so a cell is parsed once; it is dropped when the cell ends.

Run (``run``): code IPython compiles around every ``%%fresh_model`` call is new each time, and
TensorFlow keeps frames keyed by code object (above). So a cell runs below a fixed stack of
padding frames that pushes IPython's fresh frames out of the captured window. A cell that
awaits at top level runs on the shell's loop.

Awaited (``AwaitTransformer``): IPython rewrites a cell magic to
``get_ipython().run_cell_magic(...)``, a synchronous call. In ipykernel that call runs inside
the kernel's running event loop, so the magic cannot run an awaiting cell to the end itself.
This input transformer writes ``await`` in front of the call when the cell body awaits; IPython
then runs the whole cell on its loop (the kernel's loop in ipykernel) and awaits the coroutine
the magic returns. Other cells pass through untouched.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import sys
import tokenize
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from types import CodeType
from typing import Any, TypeVar

from kerasmagic.cells.rebinding import Rebinding, assigned_in, rebinding_in
from kerasmagic.compat.registry import works
from kerasmagic.interrupts.held import shown_plain
from kerasmagic.shellstate import ShellState, state_of

MAX_CELLS = 256
T = TypeVar("T")


@dataclass(frozen=True)
class CompiledCell:
    """A cell's statements, its last expression (whose value the cell shows) and its names."""

    body: CodeType
    last: CodeType | None
    filename: str
    rebinding: Rebinding  # see kerasmagic.cells.rebinding for the rule
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

    @classmethod
    def load(cls, state: ShellState) -> CellCache:
        """The ``cells`` part: an empty cache for the shell."""
        return cls()

    @staticmethod
    def unload(state: ShellState, cache: CellCache) -> None:
        """Forget the compiled cells."""
        cache.compiled.clear()
        cache.transformed = cache.checked = None


def cache_of(shell: Any) -> CellCache | None:
    """Return the shell's cell cache while the extension is loaded there, else None."""
    state = state_of(shell)
    found = None if state is None else state.part("cells")
    return found if isinstance(found, CellCache) else None


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
    A cell ``CompileCheck`` parsed when IPython transformed it is not parsed again.
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
    names = _cell_names(shell)
    frame = sys._getframe(1) if works("cpython.frames") else None  # moved: said by compat
    for _ in range(max_depth):
        if frame is None:
            break
        if isinstance(names, dict) and frame.f_code.co_filename in names:
            return int(names[frame.f_code.co_filename])
        frame = frame.f_back  # type: ignore[assignment]
    return int(shell.execution_count)


def _name_cell(shell: Any, filename: str, number: int) -> None:
    """Show a re-used code object as ``Cell In[number]`` (IPython's filename -> count map)."""
    names = _cell_names(shell)
    if isinstance(names, dict):
        names[filename] = number


def _cell_names(shell: Any) -> Any:
    """Return IPython's filename -> ``In[N]`` map, or None (IPython 7; moved: said by compat)."""
    names = works("ipython.cell_names", shell)
    return getattr(shell.compile, "_filename_map", None) if names else None


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


MAGIC_LINE = re.compile(r"%%fresh_model(\s|$)")


def fresh_model_cell(lines: list[str]) -> tuple[str, str] | None:
    """Return a ``%%fresh_model`` cell's line and body as IPython splits them, else None."""
    if not lines or not MAGIC_LINE.match(lines[0]):
        return None
    _, _, line = lines[0][2:].rstrip().partition(" ")  # as IPython's cell_magic transform
    return line, "".join(lines[1:])


def check_cell(shell: Any, code: str, header: str) -> None:
    """Parse and compile ``code`` as the magic will; raise ``SyntaxError`` if it does not compile.

    The cell is named ``Cell In[N]`` as IPython names the cell it is about to run.
    """
    cache = cache_of(shell)
    source = cell_source(code, header)
    if cache is None or source in cache.compiled or not works("ipython.compiler", shell):
        return  # (the compiler moved: said once, by compat; the magic runs the cell plainly)
    compiler = shell.compile
    filename = compiler.cache(source, int(shell.execution_count))
    flags = extra_flags(shell)
    with compiler.extra_flags(flags):
        tree = compiling(filename, compiler.ast_parse, "\n" + code, filename)
    # Compiled as a test only: the builtin leaves the shell's __future__ flags alone.
    compiling(filename, compile, tree, filename, "exec", compiler.flags | flags, True)
    cache.checked = (source, tree)


class CompileCheck:
    """An IPython cleanup transformer that raises a ``%%fresh_model`` body's compile error."""

    has_side_effects = True  # skipped by check_complete: a cell still being typed is no error

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self._refused_at: int | None = None  # the execution count when a cell was refused

    def __call__(self, lines: list[str]) -> list[str]:
        cell = fresh_model_cell(lines)
        if cell is not None:
            line, body = cell
            header = f"%%fresh_model {line}".rstrip()
            try:
                try:
                    code = transformed_body(self.shell, body)
                except SyntaxError as error:  # IPython's tokenizer: count the magic's line too
                    if error.lineno is not None:
                        error.lineno += 1
                        end = error.end_lineno
                        error.end_lineno = None if end is None else end + 1
                    raise
                check_cell(self.shell, code, header)
            except SyntaxError:
                self._refused_at = int(self.shell.execution_count)
                raise
        return lines

    def cell_ended(self, result: Any) -> None:
        """Drop the body's transform and a parse the magic did not take (it refused its line);
        count a refused cell once (IPython 7 counts a cell whose transform raised twice)."""
        cache = cache_of(self.shell)
        if cache is not None:
            cache.checked = cache.transformed = None  # a cell of megabytes: not kept after it
        refused_at, self._refused_at = self._refused_at, None
        if refused_at is not None and self.shell.execution_count == refused_at + 2:
            self.shell.execution_count -= 1

    @classmethod
    def load(cls, state: ShellState) -> CompileCheck | None:
        """The ``check`` part: install the check on the shell, first of kerasmagic's
        transformers."""
        check = _install(cls(state.shell))
        if check is not None:
            state.shell.events.register("post_run_cell", check.cell_ended)
        return check

    @staticmethod
    def unload(state: ShellState, check: CompileCheck | None) -> None:
        """Remove the check from the shell."""
        if check is not None:
            _remove(check)
            state.shell.events.unregister("post_run_cell", check.cell_ended)


PADDING_FRAMES = 32  # deeper than the frames TensorFlow captures from an eager op


def run(shell: Any, cell: CompiledCell, after: Callable[[], None]) -> Any:
    """Run ``cell``, then ``after()`` (also on error); return the value the cell shows.

    A cell that awaits runs on the shell's event loop: returned as a coroutine to await when
    a loop already runs this code (an awaiting cell, or ipykernel), else run through
    ``shell.loop_runner``, as IPython runs an awaiting plain cell.
    """
    __tracebackhide__ = True  # read by IPython's traceback formatter
    glob, loc = shell.user_global_ns, shell.user_ns
    if cell.is_async:
        coro = _run_async(cell, glob, loc, after)
        return coro if loop_running() else shell.loop_runner(coro)
    try:
        value = run_padded(_run_sync, cell, glob, loc)
    except BaseException as error:
        _from_cell(error, cell)
        raise
    finally:
        after()
    return None if cell.silenced else value


def _from_cell(error: BaseException, cell: CompiledCell) -> None:
    """Make ``error`` show from the cell's frame on, as in a plain cell (SystemExit, which
    IPython shows as one line, excepted)."""
    if not isinstance(error, SystemExit):
        shown_plain(error, cell.filename)


def loop_running() -> bool:
    """Whether an event loop runs this code (an awaiting cell, or ipykernel's)."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _make_pad(inner: Callable[..., Any], index: int) -> Callable[..., Any]:
    def pad(fn: Callable[..., Any], *args: Any) -> Any:
        __tracebackhide__ = True  # read by IPython's traceback formatter
        return inner(fn, *args)

    # A code object of its own per level: IPython then hides all of them as one line instead of
    # listing a run of "similar frames"; they are made once, so TF's cache sees the same keys.
    pad.__code__ = pad.__code__.replace(co_name=f"pad{index}", co_qualname=f"pad{index}")
    return pad


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    __tracebackhide__ = True
    return fn(*args)


_padded: Callable[..., Any] = _call
for _index in range(PADDING_FRAMES):
    _padded = _make_pad(_padded, _index)


def run_padded(fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` below ``PADDING_FRAMES`` fixed frames (hidden in IPython tracebacks)."""
    __tracebackhide__ = True
    return _padded(fn, *args)


def _run_sync(cell: CompiledCell, glob: dict[str, Any], loc: Any) -> Any:
    __tracebackhide__ = True
    eval(cell.body, glob, loc)
    return None if cell.last is None else eval(cell.last, glob, loc)


async def _run_async(
    cell: CompiledCell, glob: dict[str, Any], loc: Any, after: Callable[[], None]
) -> Any:
    __tracebackhide__ = True
    try:
        await _run_code(cell.body, glob, loc)
        value = None if cell.last is None else await _run_code(cell.last, glob, loc)
    except BaseException as error:
        _from_cell(error, cell)
        raise
    finally:
        after()
    return None if cell.silenced else value


async def _run_code(code: CodeType, glob: dict[str, Any], loc: Any) -> Any:
    """Evaluate ``code``, awaiting it if it was compiled as a coroutine (a value is not)."""
    __tracebackhide__ = True
    value = eval(code, glob, loc)
    if code.co_flags & inspect.CO_COROUTINE:
        coro: Coroutine[Any, Any, Any] = value
        return await coro
    return value


RUNNERS: tuple[Callable[..., Any], ...] = (_run_sync, _run_code)  # a cell's frame's caller


class AwaitTransformer:
    """An IPython cleanup transformer (``shell.input_transformers_cleanup``) for one shell."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def __call__(self, lines: list[str]) -> list[str]:
        cell = fresh_model_cell(lines)
        if cell is None:
            return lines
        first_line, body = cell
        if not runs_async(self.shell, body):
            return lines
        return [f"await get_ipython().run_cell_magic('fresh_model', {first_line!r}, {body!r})\n"]

    @classmethod
    def load(cls, state: ShellState) -> AwaitTransformer | None:
        """The ``await`` part: install the transformer on the shell."""
        return _install(cls(state.shell))

    @staticmethod
    def unload(state: ShellState, transformer: AwaitTransformer | None) -> None:
        """Remove the transformer from the shell."""
        if transformer is not None:
            _remove(transformer)


Transformer = TypeVar("Transformer", "CompileCheck", "AwaitTransformer")


def _install(transformer: Transformer) -> Transformer | None:
    """Add ``transformer`` to its shell's cleanup transformers, unless they moved (said once)."""
    if not works("ipython.transformers", transformer.shell):
        return None
    transformer.shell.input_transformers_cleanup.append(transformer)
    return transformer


def _remove(transformer: CompileCheck | AwaitTransformer) -> None:
    transforms = transformer.shell.input_transformers_cleanup
    transforms[:] = [t for t in transforms if t is not transformer]


def runs_async(shell: Any, body: str) -> bool:
    """Whether a ``%%fresh_model`` cell with this body is awaited (the transformer's call):
    then the magic returns an awaitable, also when it runs nothing (``--help``, ``--dry-run``)."""
    if "await" not in body and "async" not in body:  # cheap test first: cells can be MBs
        return False
    try:
        transformed = transformed_body(shell, body)
    except (SyntaxError, ValueError):  # left as it is: the magic reports the error itself
        return False
    return bool(shell.should_run_async(body, transformed_cell=transformed))


def no_result(shell: Any, body: str) -> Any:
    """What ``%%fresh_model`` returns when it runs nothing (``--help``, ``--dry-run``): None, or
    for a body IPython awaits (an event loop runs this code) an awaitable of None."""
    return _nothing() if runs_async(shell, body) and loop_running() else None


async def _nothing() -> None:
    return None
