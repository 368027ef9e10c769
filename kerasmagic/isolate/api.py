"""What users call: ``run_isolated``, ``@isolated``, ``sweep`` and ``%%fresh_model --isolate``.

The cell magic runs the cell's source in the child with the named ``--inputs`` as its globals;
the named ``--outputs`` come back into the notebook only if the cell succeeds, so a failed or
killed cell leaves every variable as it was. Nothing here imports TensorFlow, and IPython only
for the magic.

``gpus`` is the GPUs each run gets, spelt the way its runner can honour: locally the devices
themselves (``CUDA_VISIBLE_DEVICES``: ``"0"``, ``"0,1"``, ``[1, 0]``, ``""`` for CPU only);
on Ray how many, since Ray picks them (``1``, ``0.5`` shares one). :func:`gpus_for` reads it.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import itertools
import keyword
import math
import pickle
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, overload

from kerasmagic.isolate.child import exec_cell
from kerasmagic.isolate.runner import (
    Outcome,
    Progress,
    Trial,
    as_call,
    local_sweep,
    run_local,
    unwrap,
)

F = TypeVar("F", bound=Callable[..., Any])
GpuSpec = str | int | float | Sequence[int] | Sequence[str] | None


def gpu_spec(gpus: GpuSpec) -> str | None:
    """Return ``gpus`` as a ``CUDA_VISIBLE_DEVICES`` value ("" = CPU only, None = inherit)."""
    if gpus is None or isinstance(gpus, str):
        spec = gpus
    elif isinstance(gpus, int):
        spec = str(gpus)
    elif isinstance(gpus, float):
        raise ValueError(f"gpus: a number of GPUs ({gpus!r}) needs on='ray'; here give indices")
    else:
        spec = ",".join(str(int(g)) for g in gpus)
    if spec and not all(part.strip().isdigit() for part in spec.split(",")):
        raise ValueError(f"gpus must be device indices like '0' or '0,1' (or '' for CPU): {spec!r}")
    return spec


def gpus_for(gpus: Any, on: str | None) -> Any:
    """Return ``gpus`` for the runner: locally a ``CUDA_VISIBLE_DEVICES`` value (None: inherit),
    on Ray a number of GPUs per run; raise ValueError for any other form."""
    if on is None:
        return gpu_spec(gpus)
    try:
        count = 0.0 if gpus in (None, "") else float(gpus)
    except (TypeError, ValueError):
        count = math.nan
    if not (math.isfinite(count) and count >= 0):
        raise ValueError(f"gpus on Ray: a number of GPUs per run, e.g. 1 or 0.5, not {gpus!r}")
    return count


def _check(timeout: float | None, on: str | None) -> None:
    """Raise ValueError unless ``timeout`` is None or a positive, finite number of seconds and
    ``on`` is None or a Ray address."""
    from kerasmagic.isolate.ray_backend import check_on

    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not (math.isfinite(timeout) and timeout > 0)
    ):
        raise ValueError(f"timeout must be a positive, finite number of seconds: {timeout!r}")
    if on is not None:
        check_on(on)


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
    _check(timeout, on)
    wanted = gpus_for(gpus, on)
    if on is not None:
        from kerasmagic.isolate.ray_backend import ray_sweep

        return unwrap(ray_sweep(fn, [(args, kwargs)], on=on, timeout_s=timeout, gpus=wanted)[0])
    return unwrap(run_local(fn, args, kwargs, timeout_s=timeout, gpus=wanted))


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
    _check(timeout, on)

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
    _check(timeout, on)
    configs = list(configs)
    if on is not None:
        from kerasmagic.isolate.ray_backend import ray_sweep

        calls = [as_call(c) for c in configs]
        count = gpus_for(gpus, on)
        return ray_sweep(fn, calls, on=on, timeout_s=timeout, gpus=count, workers=workers,
                         configs=configs, progress=progress)  # fmt: skip
    workers = workers or 1
    if workers < 1:
        raise ValueError("workers must be at least 1")
    specs = [gpu_spec(g) for g in gpus] if isinstance(gpus, list | tuple) else [gpu_spec(gpus)]
    slots = list(itertools.islice(itertools.cycle(specs), workers))
    stream = workers == 1 if stream is None else stream
    show = Progress(len(configs), progress, newline=stream)
    return local_sweep(fn, configs, workers=workers, timeout_s=timeout, gpu_slots=slots,
                       progress=show, stream=stream)  # fmt: skip


# -- %%fresh_model --isolate ---------------------------------------------------------------------


def _usage(message: str) -> Exception:
    """Return IPython's ``UsageError`` (imported here: the plain API needs no IPython)."""
    from IPython.core.error import UsageError

    return UsageError(message)


def _names(names: list[str] | None, what: str) -> list[str]:
    out = [n for raw in names or [] for n in raw.split(",") if n]
    bad = [n for n in out if not n.isidentifier() or keyword.iskeyword(n)]
    if bad:
        raise _usage(f"--{what}: not a Python name: {', '.join(bad)}")
    return out


def _inputs(user_ns: dict[str, Any], names: list[str]) -> dict[str, Any]:
    missing = [n for n in names if n not in user_ns]
    if missing:
        raise _usage(f"--inputs: not defined in the notebook: {', '.join(missing)}")
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


def _checked_gpus(args: Any, code: str) -> Any:
    """Refuse bad flags with one line; return the ``--gpus`` the runner takes."""
    if _needs_ipython(code):
        raise _usage(
            "an isolated cell runs plain Python in a fresh process, without IPython: "
            "remove its %magics, !commands and get_ipython() calls"
        )
    try:
        _check(args.timeout, args.on)
        return gpus_for(args.gpus, args.on)
    except ValueError as exc:  # "timeout ...", "on: ...", "gpus ...": the flag's own name
        raise _usage(f"--{exc}") from None


def _run(args: Any, call: tuple[str, dict[str, Any], list[str]], gpus: Any) -> Outcome:
    if args.on is None:
        return run_local(exec_cell, call, timeout_s=args.timeout, gpus=gpus)
    from kerasmagic.isolate.ray_backend import ray_sweep

    try:
        return ray_sweep(exec_cell, [(call, {})], on=args.on, timeout_s=args.timeout, gpus=gpus)[0]
    except ImportError as exc:
        raise _usage(str(exc)) from None


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
    from kerasmagic.cells.run import transformed_body

    code = "\n" + transformed_body(shell, cell)  # the magic's line: the cell's line numbers
    gpus = _checked_gpus(args, code)
    if importlib.util.find_spec("cloudpickle") is None:
        raise _usage("--isolate needs cloudpickle: pip install 'kerasmagic[isolate]'")
    outputs = _names(args.outputs, "outputs")
    inputs = _inputs(shell.user_ns, _names(args.inputs, "inputs"))
    try:
        outcome = _run(args, (code, inputs, outputs), gpus)
    except (TypeError, AttributeError, pickle.PicklingError) as exc:
        raise _usage(f"an input cannot be sent to the child process: {exc}") from None
    _hint(outcome, shell.user_ns)
    value = unwrap(outcome)
    shell.user_ns.update(value["outputs"])
    if not args.quiet:
        back = f"; outputs: {', '.join(outputs)}" if outputs else ""
        where = "Ray" if args.on else "process"
        print(f"kerasmagic: ran isolated in {where} {outcome.pid}, {outcome.elapsed_s:.1f} s{back}")
        sys.stdout.flush()
    return value["value"]
