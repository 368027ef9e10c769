"""What users call: ``run_isolated``, ``@isolated``, ``sweep`` and ``%%fresh_model --isolate``.

The cell magic runs the cell's source in the child with the named ``--inputs`` as its globals;
the named ``--outputs`` come back into the notebook only if the cell succeeds. Nothing here
imports TensorFlow, and IPython only for the magic.

``gpus`` is the GPUs each run gets, spelt the way its runner can honour: locally the devices
themselves (``CUDA_VISIBLE_DEVICES``: ``"0"``, ``"0,1"``, ``[1, 0]``, ``""`` for CPU only);
on Ray how many, since Ray picks them (``1``, ``0.5`` shares one).

On Ray every trial is ``@ray.remote(max_calls=1, max_retries=0)``: a fresh worker process per
trial (its exit returns all its GPU memory), never silently rerun; a timeout calls
``ray.cancel(force=True)``, which kills the worker. Worker output comes through Ray's own log
forwarding (``log_to_driver``).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import keyword
import math
import pickle
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, overload

from kerasmagic.isolate.child import exec_cell
from kerasmagic.isolate.runner import Trial, run_one, run_trials, unwrap

F = TypeVar("F", bound=Callable[..., Any])
GpuSpec = str | int | float | Sequence[int] | Sequence[str] | None
_RAY_URL = re.compile(
    r"ray://([A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):(\d{1,5})"
)


def gpu_spec(gpus: GpuSpec) -> str | None:
    """Return ``gpus`` as a ``CUDA_VISIBLE_DEVICES`` value ("" = CPU only, None = inherit)."""
    if isinstance(gpus, float):
        raise ValueError(f"gpus: a number of GPUs ({gpus!r}) needs on='ray'; here give indices")
    if isinstance(gpus, int):
        gpus = str(gpus)
    spec = gpus if gpus is None or isinstance(gpus, str) else ",".join(str(int(g)) for g in gpus)
    if spec and not all(part.strip().isdigit() for part in spec.split(",")):
        raise ValueError(f"gpus must be device indices like '0' or '0,1' (or '' for CPU): {spec!r}")
    return spec


def _checked(timeout: float | None, on: str | None, gpus: Any = None) -> Any:
    """Raise ValueError for a bad ``timeout``, ``on`` (before Ray is imported) or ``gpus``; return
    ``gpus`` for the runner: locally a ``CUDA_VISIBLE_DEVICES`` value, on Ray a number per run."""
    number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
    if timeout is not None and not (number and 0 < timeout < math.inf):
        raise ValueError(f"timeout must be a positive, finite number of seconds: {timeout!r}")
    if on is None:
        return gpu_spec(gpus)
    found = _RAY_URL.fullmatch(on) if isinstance(on, str) else None
    if on != "ray" and (found is None or not 0 < int(found.group(2)) < 65536):
        raise ValueError(f"on: expected 'ray' or 'ray://host:port' (port 1-65535), got {on!r}")
    try:
        count = 0.0 if gpus in (None, "") else float(gpus)
    except (TypeError, ValueError):
        count = math.nan
    if not (math.isfinite(count) and count >= 0):
        raise ValueError(f"gpus on Ray: a number of GPUs per run, e.g. 1 or 0.5, not {gpus!r}")
    return count


def run_isolated(
    fn: Callable[..., Any],
    /,
    *args: Any,
    timeout: float | None = None,
    gpus: GpuSpec = None,
    on: str | None = None,
    **kwargs: Any,
) -> Any:
    """Call ``fn(*args, **kwargs)`` in a fresh process and return its value.

    ``gpus`` pins devices locally ("0", "0,1", "" for CPU); with ``on="ray"`` or
    ``"ray://host:port"`` it is the number of GPUs per run (fractions allowed). Raises
    ``IsolatedError`` (with the child's traceback), ``IsolatedCrash`` or ``IsolatedTimeout``.
    """
    return unwrap(run_one(fn, args, kwargs, on, timeout, _checked(timeout, on, gpus)))


@overload
def isolated(fn: F, /) -> F: ...
@overload
def isolated(
    *, timeout: float | None = None, gpus: GpuSpec = None, on: str | None = None
) -> Callable[[F], F]: ...
def isolated(
    fn: F | None = None,
    /,
    *,
    timeout: float | None = None,
    gpus: GpuSpec = None,
    on: str | None = None,
) -> F | Callable[[F], F]:
    """Make every call of ``fn`` run in a fresh process (``@isolated`` or ``@isolated(...)``)."""
    _checked(timeout, on)

    def wrap(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return run_isolated(func, *args, timeout=timeout, gpus=gpus, on=on, **kwargs)

        return wrapper  # type: ignore[return-value]

    return wrap if fn is None else wrap(fn)


def sweep(
    fn: Callable[..., Any],
    configs: Iterable[Any],
    *,
    workers: int | None = None,
    on: str | None = None,
    timeout: float | None = None,
    gpus: GpuSpec = None,
    progress: bool = True,
    stream: bool | None = None,
) -> list[Trial]:
    """Run ``fn`` once per config, each in a fresh process; return trials in submission order.

    A dict config is passed as keyword arguments, anything else as the one argument. Failed
    trials do not stop the others: check ``trial.status`` ("ok", "error", "crashed", "timeout",
    "interrupted"), ``trial.value`` and ``trial.error``. Locally ``workers`` (default 1) run at
    a time and ``gpus`` may be a list of specs handed out to them in turn (``["0", "1"]``);
    output streams into the cell when ``workers == 1`` (``stream``), else it is kept in
    ``trial.output``. On Ray, ``gpus`` is the GPUs per trial.
    """
    many = on is None and isinstance(gpus, list | tuple)
    count = _checked(timeout, on, None if many else gpus)
    configs = list(configs)
    if on is None:
        workers = workers or 1
        if workers < 1:
            raise ValueError("workers must be at least 1")
        count = [gpu_spec(g) for g in gpus] if isinstance(gpus, list | tuple) else [count]
    stream = on is not None or (workers == 1 if stream is None else stream)
    # a dict config as keyword arguments, anything else as the one argument
    calls = [((), dict(c)) if isinstance(c, Mapping) else ((c,), {}) for c in configs]
    return run_trials(fn, calls, configs, on, timeout, count, workers, progress, stream)


# -- %%fresh_model --isolate ---------------------------------------------------------------------


def _needs_ipython(code: str) -> bool:
    """Return whether ``code`` uses ``get_ipython`` without binding it (a ``%magic``, ``!command``
    or the user's own call): the child has no such name."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):  # the child reports it, as Python would
        return False
    loads = [  # each get_ipython: read (True), or bound: assigned, imported, defined (False)
        isinstance(getattr(node, "ctx", None), ast.Load)
        for node in ast.walk(tree)
        if isinstance(node, ast.Name | ast.alias | ast.FunctionDef | ast.AsyncFunctionDef)
        and "get_ipython"
        in (getattr(node, "id", 0), getattr(node, "asname", 0) or getattr(node, "name", 0))
    ]
    return any(loads) and all(loads)


def run_cell_isolated(shell: Any, args: Any, cell: str) -> Any:
    """Run ``cell`` in a fresh process; bind ``--outputs``; return its last expression's value."""
    from IPython.core.error import UsageError  # the plain API needs no IPython

    from kerasmagic.cells.run import transformed_body

    code = "\n" + transformed_body(shell, cell)  # the magic's line: the cell's line numbers
    if _needs_ipython(code):
        raise UsageError(
            "an isolated cell runs plain Python in a fresh process, without IPython: "
            "remove its %magics, !commands and get_ipython() calls"
        )
    try:
        gpus = _checked(args.timeout, args.on, args.gpus)
    except ValueError as exc:  # "timeout ...", "on: ...", "gpus ...": the flag's own name
        raise UsageError(f"--{exc}") from None
    if importlib.util.find_spec("cloudpickle") is None:
        raise UsageError("--isolate needs cloudpickle: pip install 'kerasmagic[isolate]'")

    def names(given: list[str] | None, flag: str) -> list[str]:
        out = [n for raw in given or [] for n in raw.split(",") if n]
        if bad := [n for n in out if not n.isidentifier() or keyword.iskeyword(n)]:
            raise UsageError(f"--{flag}: not a Python name: {', '.join(bad)}")
        return out

    outputs, inputs = names(args.outputs, "outputs"), names(args.inputs, "inputs")
    if missing := [n for n in inputs if n not in shell.user_ns]:
        raise UsageError(f"--inputs: not defined in the notebook: {', '.join(missing)}")
    call = (code, {n: shell.user_ns[n] for n in inputs}, outputs)
    try:
        outcome = run_one(exec_cell, call, {}, args.on, args.timeout, gpus)
    except (TypeError, AttributeError, pickle.PicklingError) as exc:
        raise UsageError(f"an input cannot be sent to the child process: {exc}") from None
    except ImportError as exc:  # Ray is not installed
        if args.on is None:
            raise
        raise UsageError(str(exc)) from None
    found = re.search(r"name '(\w+)' is not defined", outcome.error or "")
    if outcome.error_type == "NameError" and found and found.group(1) in shell.user_ns:
        hint = f"'{found.group(1)}' exists in the notebook: pass it with --inputs {found.group(1)}"
        outcome.error = f"{outcome.error}\n{hint}\n"
    value = unwrap(outcome)
    shell.user_ns.update(value["outputs"])
    if not args.quiet:
        back = f"; outputs: {', '.join(outputs)}" if outputs else ""
        where = "Ray" if args.on else "process"
        print(f"kerasmagic: ran isolated in {where} {outcome.pid}, {outcome.elapsed_s:.1f} s{back}")
        sys.stdout.flush()
    return value["value"]
