"""Let a ``%%fresh_model`` cell ``await`` at top level in ipykernel as a plain cell does.

IPython rewrites a cell magic to ``get_ipython().run_cell_magic(...)``, a synchronous call. In
ipykernel that call runs inside the kernel's running event loop, so the magic cannot run an
awaiting cell to the end itself. This input transformer writes ``await`` in front of the call
when the cell body awaits; IPython then runs the whole cell on its loop (the kernel's loop in
ipykernel) and awaits the coroutine the magic returns. Other cells pass through untouched.
"""

from __future__ import annotations

from typing import Any

from kerasmagic.cells.compiler import transformed_body
from kerasmagic.cells.precheck import fresh_model_cell
from kerasmagic.cells.runner import loop_running
from kerasmagic.shellstate import ShellState


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


def load(state: ShellState) -> AwaitTransformer:
    """Install the transformer on the shell."""
    transformer = AwaitTransformer(state.shell)
    state.shell.input_transformers_cleanup.append(transformer)
    return transformer


def unload(state: ShellState, transformer: AwaitTransformer) -> None:
    """Remove the transformer from the shell."""
    transforms = state.shell.input_transformers_cleanup
    transforms[:] = [t for t in transforms if t is not transformer]
