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
import contextlib
import inspect
import io
import re
import sys
import tokenize
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterator
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
    file), and "%%magic" is not Python. The parsed text is ``code`` below one blank line.
    """
    return f"# {header}\n{code}"


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


def cache_of(shell: Any) -> CellCache:
    """Return the shell's cell cache; where the extension is not loaded, a new empty one."""
    state = state_of(shell)
    found = None if state is None else state.part("cells")
    return found if isinstance(found, CellCache) else CellCache()


def transformed_body(shell: Any, body: str) -> str:
    """Return ``shell.transform_cell(body)``, once per body (the checks and the magic share it).

    IPython's transform costs seconds on a cell of megabytes; the input transformers and the
    magic would otherwise each pay it again for the same body.
    """
    cache = cache_of(shell)
    if cache.transformed is not None and cache.transformed[0] == body:
        return cache.transformed[1]
    code = str(shell.transform_cell(body))
    dropped = _blank_lines(body) - _blank_lines(code)  # IPython drops a cell's leading blanks
    code = "\n" * max(dropped, 0) + code  # kept: line N of the code is line N of the body
    cache.transformed = (body, code)
    return code


def _blank_lines(text: str) -> int:
    """Return how many whitespace-only lines ``text`` starts with."""
    return text[: len(text) - len(text.lstrip())].count("\n")


def compile_cell(shell: Any, code: str, header: str) -> CompiledCell:
    """Return the compiled cell for ``code`` (IPython-transformed source), reusing earlier ones.

    ``header`` (the ``%%magic`` line) is shown as line 1 in tracebacks, so line numbers match
    the notebook cell. Raise ``SyntaxError`` (naming the cell) if the code does not compile.
    A cell ``CompileCheck`` parsed when IPython transformed it is not parsed again.
    """
    source, number, cache = cell_source(code, header), cell_number(shell), cache_of(shell)
    cells = cache.compiled
    if source in cells:
        cells.move_to_end(source)
        names = _cell_names(shell)
        if names is not None:  # a re-used code object is shown as Cell In[number]
            names[cells[source].filename] = number
        return cells[source]
    checked, cache.checked = cache.checked, None  # handed over once: a parsed cell can be MBs
    compiler = shell.compile
    filename = compiler.cache(source, number)
    with compiler.extra_flags(extra_flags(shell)):
        if checked is not None and checked[0] == source:
            tree = checked[1]
        else:
            tree = compiling(filename, compiler.ast_parse, "\n" + code, filename)
        rebinding, assigned = rebinding_in(tree), frozenset(assigned_in(tree))
        silenced = _ends_with_semicolon("\n" + code, tree)
        module: Any = shell.transform_ast(tree)
        last = None
        if module.body and isinstance(module.body[-1], ast.Expr):
            shown = ast.Expression(module.body.pop().value)
            last = compiling(filename, compiler, shown, filename, "eval")
        # the shell's compiler keeps __future__ imports
        body = compiling(filename, compiler, module, filename, "exec")
    compiled = cells[source] = CompiledCell(body, last, filename, rebinding, assigned, silenced)
    if len(cells) > MAX_CELLS:
        cells.popitem(last=False)
    return compiled


def cell_number(shell: Any) -> int:
    """Return the ``In[N]`` of the cell running now: the nearest calling frame IPython named.

    IPython 9 counts a cell before running it and IPython 8 after, so the shell's counter alone
    is off by one in one of them; the caller's code name is right in both.
    """
    names = _cell_names(shell)
    frame = sys._getframe(1) if works("cpython.frames") else None  # moved: said by compat
    for _ in range(50):  # the nearest callers only
        if frame is None or names is None:
            break
        if frame.f_code.co_filename in names:
            return int(names[frame.f_code.co_filename])
        frame = frame.f_back
    return int(shell.execution_count)


def _cell_names(shell: Any) -> Any:
    """Return IPython's filename -> ``In[N]`` map, or None (IPython 7; moved: said by compat)."""
    names = works("ipython.cell_names", shell)
    return getattr(shell.compile, "_filename_map", None) if names else None


def extra_flags(shell: Any) -> int:
    """Return the compile flags IPython adds for a cell: top-level ``await`` with autoawait."""
    return ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if getattr(shell, "autoawait", False) else 0


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


SKIPPED_TOKENS = (tokenize.ENDMARKER, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)


def _ends_with_semicolon(text: str, tree: ast.Module) -> bool:
    """Return whether a ``;`` follows the cell's last expression (IPython then shows no Out):
    the last token of the last statement's lines (not a cell of megabytes) is one, IPython 7's
    ``DisplayHook.quiet`` and 8's ``semicolon_at_end_of_expression`` test."""
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr):
        return False
    tail = "\n".join(text.splitlines()[last.lineno - 1 :])
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(tail).readline))
    except (tokenize.TokenError, SyntaxError):  # a line a statement shares: as IPython, show it
        return False
    ends = [token.string for token in tokens if token.type not in SKIPPED_TOKENS]
    return bool(ends) and ends[-1] == ";"


MAGIC_LINE = re.compile(r"%%fresh_model(\s|$)")


def fresh_model_cell(lines: list[str]) -> tuple[str, str] | None:
    """Return a ``%%fresh_model`` cell's line and body as IPython splits them, else None."""
    if not lines or not MAGIC_LINE.match(lines[0]):
        return None
    _, _, line = lines[0][2:].rstrip().partition(" ")  # as IPython's cell_magic transform
    return line, "".join(lines[1:])


class CleanupTransformer:
    """An IPython cleanup transformer (``shell.input_transformers_cleanup``) for one shell."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    @classmethod
    def load(cls, state: ShellState) -> Any:
        """Install the transformer on the shell, unless its lists moved (said once, by compat)."""
        if not works("ipython.transformers", state.shell):
            return None
        transformer = cls(state.shell)
        state.shell.input_transformers_cleanup.append(transformer)
        return transformer

    @staticmethod
    def unload(state: ShellState, transformer: Any) -> None:
        """Remove the transformer from the shell."""
        if transformer is not None:
            transforms = state.shell.input_transformers_cleanup
            transforms[:] = [t for t in transforms if t is not transformer]


class CompileCheck(CleanupTransformer):
    """The ``check`` part: raises a ``%%fresh_model`` body's compile error while IPython
    transforms the cell; the first of kerasmagic's transformers."""

    has_side_effects = True  # skipped by check_complete: a cell still being typed is no error
    _refused_at: int | None = None  # the execution count when a cell was refused

    def __call__(self, lines: list[str]) -> list[str]:
        cell = fresh_model_cell(lines)
        if cell is not None:
            try:
                self._check(*cell)
            except SyntaxError:
                self._refused_at = int(self.shell.execution_count)
                raise
        return lines

    def _check(self, line: str, body: str) -> None:
        """Parse and compile the body as the magic will; raise ``SyntaxError`` if it does not
        compile. The cell is named ``Cell In[N]`` as IPython names the cell it is about to run."""
        shell, cache = self.shell, cache_of(self.shell)
        try:
            code = transformed_body(shell, body)
        except SyntaxError as error:  # IPython's tokenizer: count the magic's line too
            if error.lineno is not None:
                error.lineno += 1
                error.end_lineno = None if error.end_lineno is None else error.end_lineno + 1
            raise
        source = cell_source(code, f"%%fresh_model {line}".rstrip())
        if source in cache.compiled or not works("ipython.compiler", shell):
            return  # (the compiler moved: said once, by compat; the magic runs the cell plainly)
        compiler, flags = shell.compile, extra_flags(shell)
        filename = compiler.cache(source, int(shell.execution_count))
        with compiler.extra_flags(flags):
            tree = compiling(filename, compiler.ast_parse, "\n" + code, filename)
        # Compiled as a test only: the builtin leaves the shell's __future__ flags alone.
        compiling(filename, compile, tree, filename, "exec", compiler.flags | flags, True)
        cache.checked = (source, tree)

    def cell_ended(self, result: Any) -> None:
        """Drop the body's transform and a parse the magic did not take (it refused its line);
        count a refused cell once (IPython 7 counts a cell whose transform raised twice)."""
        cache = cache_of(self.shell)
        cache.checked = cache.transformed = None  # a cell of megabytes: not kept after it
        refused_at, self._refused_at = self._refused_at, None
        if refused_at is not None and self.shell.execution_count == refused_at + 2:
            self.shell.execution_count -= 1

    @classmethod
    def load(cls, state: ShellState) -> CompileCheck | None:
        """Install the check on the shell."""
        check: CompileCheck | None = super().load(state)
        if check is not None:
            state.shell.events.register("post_run_cell", check.cell_ended)
        return check

    @staticmethod
    def unload(state: ShellState, check: CompileCheck | None) -> None:
        """Remove the check from the shell."""
        CleanupTransformer.unload(state, check)
        if check is not None:
            state.shell.events.unregister("post_run_cell", check.cell_ended)


class AwaitTransformer(CleanupTransformer):
    """The ``await`` part: writes ``await`` in front of a ``%%fresh_model`` call that awaits."""

    def __call__(self, lines: list[str]) -> list[str]:
        cell = fresh_model_cell(lines)
        if cell is None or not runs_async(self.shell, cell[1]):
            return lines
        first_line, body = cell
        return [f"await get_ipython().run_cell_magic('fresh_model', {first_line!r}, {body!r})\n"]


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


PADDING_FRAMES = 32  # deeper than the frames TensorFlow captures from an eager op


def run(shell: Any, cell: CompiledCell, after: Callable[[], None]) -> Any:
    """Run ``cell``, then ``after()`` (also on error); return the value the cell shows.

    It runs below ``PADDING_FRAMES`` fixed frames (hidden in IPython tracebacks). A cell that
    awaits runs on the shell's event loop: returned as a coroutine to await when a loop already
    runs this code (an awaiting cell, or ipykernel), else run through ``shell.loop_runner``, as
    IPython runs an awaiting plain cell.
    """
    __tracebackhide__ = True  # read by IPython's traceback formatter
    glob, loc = shell.user_global_ns, shell.user_ns
    if cell.is_async:
        coro = _run_async(cell, glob, loc, after)
        return coro if loop_running() else shell.loop_runner(coro)
    with _ran(cell, after):
        value = _padded(_run_sync, cell, glob, loc)
    return None if cell.silenced else value


@contextlib.contextmanager
def _ran(cell: CompiledCell, after: Callable[[], None]) -> Iterator[None]:
    """Make an error show from the cell's frame on, as in a plain cell (SystemExit, which
    IPython shows as one line, excepted); then call ``after()``, also on error."""
    __tracebackhide__ = True
    try:
        yield
    except BaseException as error:
        if not isinstance(error, SystemExit):
            shown_plain(error, cell.filename)
        raise
    finally:
        after()


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


def _run_sync(cell: CompiledCell, glob: dict[str, Any], loc: Any) -> Any:
    __tracebackhide__ = True
    eval(cell.body, glob, loc)
    return None if cell.last is None else eval(cell.last, glob, loc)


async def _run_async(
    cell: CompiledCell, glob: dict[str, Any], loc: Any, after: Callable[[], None]
) -> Any:
    __tracebackhide__ = True
    with _ran(cell, after):
        await _run_code(cell.body, glob, loc)
        value = None if cell.last is None else await _run_code(cell.last, glob, loc)
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
