"""Refuse a ``%%fresh_model`` cell that does not compile before it runs, as a plain cell is.

IPython turns a cell magic into a call, so an error in the body (a typo, a bad indent, a
``return`` outside a function, a NUL byte, nesting too deep for the parser) would surface inside
the magic, under frames of IPython and kerasmagic. This input transformer compiles the body
while IPython transforms the cell, before anything runs, and raises the error there: IPython
then shows it as it shows a plain cell's (the line and a caret, no frames), runs nothing and
marks the cell failed before execution. The parsed cell goes on to the magic, so a cell is
parsed once; it is dropped when the cell ends.
"""

from __future__ import annotations

import re
from typing import Any

from kerasmagic.cells.compiler import (
    cache_of,
    cell_source,
    compiling,
    extra_flags,
    transformed_body,
)
from kerasmagic.shellstate import ShellState

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
    if cache is None or source in cache.compiled:
        return
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


def load(state: ShellState) -> CompileCheck:
    """Install the check on the shell, first of kerasmagic's transformers."""
    check = CompileCheck(state.shell)
    state.shell.input_transformers_cleanup.append(check)
    state.shell.events.register("post_run_cell", check.cell_ended)
    return check


def unload(state: ShellState, check: CompileCheck) -> None:
    """Remove the check from the shell."""
    transforms = state.shell.input_transformers_cleanup
    transforms[:] = [t for t in transforms if t is not check]
    state.shell.events.unregister("post_run_cell", check.cell_ended)
