"""``%%fresh_model --isolate``: run a cell in a fresh process, inputs in, outputs back.

The cell's source runs in the child with the named ``--inputs`` as its globals; the named
``--outputs`` come back into the notebook only if the cell succeeds, so a failed or killed cell
leaves every variable as it was. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import ast
import importlib.util
import keyword
import math
import pickle
import re
import sys
from typing import Any

from IPython.core.error import UsageError

from kerasmagic.cells.compiler import transformed_body
from kerasmagic.isolate._child import exec_cell
from kerasmagic.isolate.api import gpu_spec
from kerasmagic.isolate.outcome import Outcome, unwrap
from kerasmagic.isolate.runner import run_local


def _names(names: list[str] | None, what: str) -> list[str]:
    out = [n for raw in names or [] for n in raw.split(",") if n]
    bad = [n for n in out if not n.isidentifier() or keyword.iskeyword(n)]
    if bad:
        raise UsageError(f"--{what}: not a Python name: {', '.join(bad)}")
    return out


def _inputs(user_ns: dict[str, Any], names: list[str]) -> dict[str, Any]:
    missing = [n for n in names if n not in user_ns]
    if missing:
        raise UsageError(f"--inputs: not defined in the notebook: {', '.join(missing)}")
    return {n: user_ns[n] for n in names}


def _needs_ipython(code: str) -> bool:
    """Return whether ``code`` (IPython-transformed) uses ``get_ipython`` without binding it: a
    ``%magic`` or ``!command`` line, or a call of the user's own. The child has no such name."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):  # the child reports it, as Python would
        return False
    used = bound = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "get_ipython":
            used = used or isinstance(node.ctx, ast.Load)
            bound = bound or not isinstance(node.ctx, ast.Load)
        elif isinstance(node, ast.alias):
            bound = bound or (node.asname or node.name) == "get_ipython"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            bound = bound or node.name == "get_ipython"
    return used and not bound


def _check(args: Any, code: str) -> None:
    """Refuse bad flags with one line."""
    from kerasmagic.isolate.ray_backend import check_on

    timeout = args.timeout
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise UsageError(f"--timeout must be a positive, finite number of seconds, not {timeout}")
    if _needs_ipython(code):
        raise UsageError(
            "an isolated cell runs plain Python in a fresh process, without IPython: "
            "remove its %magics, !commands and get_ipython() calls"
        )
    if args.on is not None:
        try:
            check_on(args.on)
        except ValueError as exc:
            raise UsageError(f"--{exc}") from None


def _run(args: Any, code: str, inputs: dict[str, Any], outputs: list[str]) -> Outcome:
    call = (code, inputs, outputs)
    if args.on is None:
        try:
            spec = gpu_spec(args.gpus)
        except ValueError as exc:
            raise UsageError(f"--gpus: {exc}") from None
        return run_local(exec_cell, call, timeout_s=args.timeout, gpus=spec)
    from kerasmagic.isolate.ray_backend import ray_sweep

    try:
        gpus = float(args.gpus or 0)
    except ValueError:
        raise UsageError("--gpus with --on ray: GPUs per run, e.g. 1 or 0.5") from None
    try:
        return ray_sweep(exec_cell, [(call, {})], on=args.on, timeout_s=args.timeout, gpus=gpus)[0]
    except ImportError as exc:
        raise UsageError(str(exc)) from None


def _hint(outcome: Outcome, user_ns: dict[str, Any]) -> None:
    """Point at ``--inputs`` when the cell used a notebook name it was not given."""
    if outcome.error_type != "NameError" or outcome.error is None:
        return
    found = re.search(r"name '(\w+)' is not defined", outcome.error)
    if found and found.group(1) in user_ns:
        name = found.group(1)
        outcome.error += f"\n'{name}' exists in the notebook: pass it with --inputs {name}\n"


def run_cell_isolated(shell: Any, args: Any, cell: str) -> Any:
    """Run ``cell`` in a fresh process; bind ``--outputs``; return its last expression's value."""
    code = "\n" + transformed_body(shell, cell)  # the magic's line: the cell's line numbers
    _check(args, code)
    if importlib.util.find_spec("cloudpickle") is None:
        raise UsageError("--isolate needs cloudpickle: pip install 'kerasmagic[isolate]'")
    outputs = _names(args.outputs, "outputs")
    inputs = _inputs(shell.user_ns, _names(args.inputs, "inputs"))
    try:
        outcome = _run(args, code, inputs, outputs)
    except (TypeError, AttributeError, pickle.PicklingError) as exc:
        raise UsageError(f"an input cannot be sent to the child process: {exc}") from None
    _hint(outcome, shell.user_ns)
    value = unwrap(outcome)
    shell.user_ns.update(value["outputs"])
    if not args.quiet:
        back = f"; outputs: {', '.join(outputs)}" if outputs else ""
        where = "Ray" if args.on else "process"
        print(f"kerasmagic: ran isolated in {where} {outcome.pid}, {outcome.elapsed_s:.1f} s{back}")
        sys.stdout.flush()
    return value["value"]
