"""The worker of an isolated run (forked by :mod:`kerasmagic.isolate._guard`).

The parent writes ``WORKDIR/call`` (a function, its arguments) and waits; this process runs it
and writes ``WORKDIR/result``: ``("ok", value)`` or ``("error", (type, message, traceback))``.
Only the standard library is imported at the top: TensorFlow is imported by the user's code,
after the environment (``CUDA_VISIBLE_DEVICES`` ...) is in place.
"""

from __future__ import annotations

import ast
import json
import linecache
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ErrorInfo = tuple[str, str, str]  # exception type, message, formatted traceback
Result = tuple[str, Any]
CELL_FILENAME = "<isolated cell>"


_PASSED_ENV = (
    "KERAS_BACKEND",
    "TF_CPP_MIN_LOG_LEVEL",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "PYTORCH_CUDA_ALLOC_CONF",
    "JAX_PLATFORMS",
)


def _keras_backend() -> str | None:
    """Return the backend of a Keras already imported in this process, else None."""
    keras = sys.modules.get("keras")
    try:
        return str(keras.backend.backend()) if keras is not None else None
    except Exception:  # a half-imported or stand-in module: no choice to pass on
        return None


def isolation_env(gpus: str | None, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Return the variables to set in a child: backend, memory settings, GPUs, quiet TF logs.

    The user's own values win; the defaults are memory growth for TF, no preallocation for
    JAX, TF's C++ logs off, and the backend of the Keras already imported here.
    """
    env = {name: base[name] for name in _PASSED_ENV if name in base}
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PYTHONUNBUFFERED"] = "1"
    if "KERAS_BACKEND" not in env and (backend := _keras_backend()) is not None:
        env["KERAS_BACKEND"] = backend
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
        if gpus == "":
            env.setdefault("JAX_PLATFORMS", "cpu")
    return env


class Shown:
    """The text of a value that could not travel back; displays as that text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def error_info(exc: BaseException) -> ErrorInfo:
    """Return ``exc`` as text, without the leading frames of this package."""
    tb = exc.__traceback__
    here = os.path.dirname(__file__)
    while tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == here:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return type(exc).__qualname__, str(exc), text


def oom_figures(exc: BaseException) -> dict[str, Any] | None:
    """Return the allocator's figures if ``exc`` ran out of memory, read now: the failed
    step's tensors are still alive (the kernel sees the process gone, its memory with it)."""
    try:
        from kerasmagic.oom.detect import find_oom

        oom = find_oom(exc)
        if oom is None:
            return None
        from kerasmagic.oom.facts import figures_now

        return figures_now(oom).to_dict()
    except Exception:  # figures are a help: the error itself goes back whatever happens here
        return None


def call(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Result:
    """Run ``fn``; return ``("ok", value)`` or ``("error", info)`` (SystemExit included).

    After an out-of-memory error, ``info`` carries the allocator's figures as a fourth item.
    """
    try:
        return "ok", fn(*args, **kwargs)
    except BaseException as exc:  # reported to the parent, never swallowed
        return "error", (*error_info(exc), oom_figures(exc))


def exec_cell(source: str, inputs: dict[str, Any], outputs: Sequence[str]) -> dict[str, Any]:
    """Run cell ``source`` with ``inputs`` as globals; return the outputs and the last value."""
    linecache.cache[CELL_FILENAME] = (len(source), None, source.splitlines(True), CELL_FILENAME)
    tree = ast.parse(source, CELL_FILENAME)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    ns: dict[str, Any] = {"__name__": "__main__", **inputs}
    exec(compile(tree, CELL_FILENAME, "exec"), ns)
    value = None
    if isinstance(last, ast.Expr):
        value = eval(compile(ast.Expression(last.value), CELL_FILENAME, "eval"), ns)
    missing = [name for name in outputs if name not in ns]
    if missing:
        raise NameError(f"the cell did not define the output(s) {', '.join(missing)}")
    from kerasmagic.isolate.transport import _refusal  # already imported by run_worker

    if value is not None and _refusal(value) is not None:
        value = Shown(repr(value))
    return {"outputs": {name: ns[name] for name in outputs}, "value": value}


def write_result(result: Result, path: Path) -> None:
    """Write ``result``; if it cannot travel (a model, unpicklable), write why instead."""
    from kerasmagic.isolate import transport

    try:
        transport.dump(result, path, refuse_tf=True)
    except Exception as exc:
        kind, message, _ = error_info(exc)
        text = f"{kind}: the result could not be sent back: {message}\n"
        transport.dump(("error", (kind, message, text)), path)


def run_worker(work: Path) -> int:
    """Run the call in ``work`` with the kernel's ``sys.path``; write its result."""
    import cloudpickle  # noqa: F401  # the runner's own modules, before the user's path

    from kerasmagic.isolate import transport

    runner_path = list(sys.path)
    user_path = json.loads((work / "path").read_text())
    pythonpath = os.environ.pop("KERASMAGIC_PYTHONPATH", None)
    if pythonpath is not None:
        os.environ["PYTHONPATH"] = pythonpath  # for the user's own subprocesses
    sys.path[:] = user_path
    try:
        fn, args, kwargs = transport.load(work / "call")
        result = call(fn, args, kwargs)
    except BaseException as exc:  # e.g. a module the function needs is missing here
        result = ("error", error_info(exc))
    finally:
        sys.path[:] = runner_path
    write_result(result, work / "result")
    return 0
