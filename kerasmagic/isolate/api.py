"""The plain-Python API: ``run_isolated``, ``@isolated`` and ``sweep``."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, overload

from kerasmagic.isolate.outcome import Trial, unwrap
from kerasmagic.isolate.runner import run_local
from kerasmagic.isolate.sweep import Progress, local_sweep

F = TypeVar("F", bound=Callable[..., Any])
GpuSpec = str | int | Sequence[int] | None


def gpu_spec(gpus: GpuSpec) -> str | None:
    """Return ``gpus`` as a ``CUDA_VISIBLE_DEVICES`` value ("" = CPU only, None = inherit)."""
    if gpus is None or isinstance(gpus, str):
        spec = gpus
    elif isinstance(gpus, int):
        spec = str(gpus)
    else:
        spec = ",".join(str(int(g)) for g in gpus)
    if spec and not all(part.strip().isdigit() for part in spec.split(",")):
        raise ValueError(f"gpus must be device indices like '0' or '0,1' (or '' for CPU): {spec!r}")
    return spec


def check_timeout(timeout: float | None) -> float | None:
    """Return ``timeout`` if it is None or a positive, finite number; raise ValueError if not."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ValueError(f"timeout must be a positive, finite number of seconds: {timeout!r}")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive, finite number of seconds: {timeout!r}")
    return float(timeout)


def _check(timeout: float | None, on: str | None) -> None:
    from kerasmagic.isolate.ray_backend import check_on

    check_timeout(timeout)
    if on is not None:
        check_on(on)


def run_isolated(
    fn: Callable[..., Any],
    /,
    *args: Any,
    timeout: float | None = None,
    gpus: GpuSpec | float = None,
    on: str | None = None,
    **kwargs: Any,
) -> Any:
    """Call ``fn(*args, **kwargs)`` in a fresh process and return its value.

    ``gpus`` pins devices locally ("0", "0,1", "" for CPU); with ``on="ray"`` or
    ``"ray://host:port"`` it is the number of GPUs per run (fractions allowed). Raises
    ``IsolatedError`` (with the child's traceback), ``IsolatedCrash`` or ``IsolatedTimeout``.
    """
    _check(timeout, on)
    if on is not None:
        from kerasmagic.isolate.ray_backend import ray_sweep

        trial = ray_sweep(fn, [(args, kwargs)], on=on, timeout_s=timeout, gpus=_ray_gpus(gpus))
        return unwrap(trial[0])
    spec = gpu_spec(gpus)  # type: ignore[arg-type]
    return unwrap(run_local(fn, args, kwargs, timeout_s=timeout, gpus=spec))


def _ray_gpus(gpus: Any) -> float:
    return 0.0 if gpus in (None, "") else float(gpus)


@overload
def isolated(fn: F, /) -> F: ...
@overload
def isolated(
    *, timeout: float | None = None, gpus: GpuSpec | float = None, on: str | None = None
) -> Callable[[F], F]: ...
def isolated(
    fn: F | None = None,
    /,
    *,
    timeout: float | None = None,
    gpus: GpuSpec | float = None,
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
    gpus: GpuSpec | Sequence[str] | float = None,
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
        from kerasmagic.isolate.sweep import as_call

        calls = [as_call(c) for c in configs]
        return ray_sweep(
            fn,
            calls,
            on=on,
            timeout_s=timeout,
            gpus=_ray_gpus(gpus),
            workers=workers,
            configs=configs,
            progress=progress,
        )
    workers = workers or 1
    if workers < 1:
        raise ValueError("workers must be at least 1")
    specs = [gpu_spec(g) for g in gpus] if isinstance(gpus, list | tuple) else [gpu_spec(gpus)]  # type: ignore[arg-type]
    slots = list(itertools.islice(itertools.cycle(specs), workers))
    stream = workers == 1 if stream is None else stream
    show = Progress(len(configs), progress, newline=stream)
    return local_sweep(
        fn,
        configs,
        workers=workers,
        timeout_s=timeout,
        gpu_slots=slots,
        progress=show,
        stream=stream,
    )
