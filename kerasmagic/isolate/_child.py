"""Entry point of the fresh process: ``python -m kerasmagic.isolate._child WORKDIR``.

The parent writes ``WORKDIR/call`` (a function, its arguments) and waits; this process runs it
and writes ``WORKDIR/result``: ``("ok", value)`` or ``("error", (type, message, traceback))``.
Only the standard library is imported at the top: TensorFlow is imported by the user's code,
after the environment (``CUDA_VISIBLE_DEVICES`` ...) is in place.
"""

from __future__ import annotations

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


def isolation_env(gpus: str | None, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Return the variables to set in a child: GPU pinning, memory growth, quiet TF logs."""
    env = {
        "TF_FORCE_GPU_ALLOW_GROWTH": base.get("TF_FORCE_GPU_ALLOW_GROWTH", "true"),
        "TF_CPP_MIN_LOG_LEVEL": base.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        "PYTHONUNBUFFERED": "1",
    }
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies; exit if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if parent_pid and os.getppid() != parent_pid:
        os._exit(70)


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


def call(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Result:
    """Run ``fn``; return ``("ok", value)`` or ``("error", info)`` (SystemExit included)."""
    try:
        return "ok", fn(*args, **kwargs)
    except BaseException as exc:  # reported to the parent, never swallowed
        return "error", error_info(exc)


def exec_cell(source: str, inputs: dict[str, Any], outputs: Sequence[str]) -> dict[str, Any]:
    """Run cell ``source`` with ``inputs`` as globals; return the outputs and the last value."""
    import ast

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
    from kerasmagic.isolate.transport import _refusal

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


def main(argv: Sequence[str]) -> int:
    """Load the call from the work directory, run it, write the result."""
    die_with_parent(int(os.environ.get("KERASMAGIC_PARENT_PID", "0")))
    from kerasmagic.isolate import transport

    work = Path(argv[1])
    try:
        fn, args, kwargs = transport.load(work / "call")
    except BaseException as exc:  # e.g. a module the function needs is missing here
        write_result(("error", error_info(exc)), work / "result")
        return 0
    write_result(call(fn, args, kwargs), work / "result")
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: TensorFlow's can take seconds
