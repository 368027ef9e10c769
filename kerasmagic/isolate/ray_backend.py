"""Trials on Ray: each in a fresh worker process, GPUs pinned by Ray, no silent retries.

``max_calls=1`` makes Ray start a new worker for every trial, so the worker's exit returns all
of its GPU memory; ``max_retries=0`` keeps a crashing trial from being rerun; a timeout calls
``ray.cancel(force=True)``, which kills the worker. Worker output reaches the driver through
Ray's own log forwarding (``log_to_driver``), prefixed with the worker's pid.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from kerasmagic.imports import user_module
from kerasmagic.isolate.child import call, dumps, error_info, isolation_env, send
from kerasmagic.isolate.runner import Call, Outcome, Progress, Trial, as_outcome, as_trial


def _trial(blob: bytes, env: dict[str, str]) -> tuple[int, bytes]:
    """Run on the worker: set the environment, then unpickle and run the call."""
    os.environ.update(env)  # before unpickling: TensorFlow reads these when it is imported
    import cloudpickle

    try:
        fn, args, kwargs = cloudpickle.loads(blob)
        result = call(fn, args, kwargs)
    except BaseException as exc:  # reported to the driver, never swallowed
        result = ("error", error_info(exc))
    return os.getpid(), send(result, dumps)


def _pickled(fn: Callable[..., Any], calls: Sequence[Call]) -> list[bytes]:
    """Pickle each call; ``fn``'s module by value when it is a local file, not an installed one.

    Workers import installed packages, but not the notebook's or the tests' own modules.
    """
    import cloudpickle

    name = getattr(fn, "__module__", "") or ""
    module = sys.modules.get(name)
    if module is None or name == "__main__" or not user_module(name):
        return [cloudpickle.dumps((fn, args, kwargs)) for args, kwargs in calls]
    cloudpickle.register_pickle_by_value(module)
    try:
        return [cloudpickle.dumps((fn, args, kwargs)) for args, kwargs in calls]
    finally:
        cloudpickle.unregister_pickle_by_value(module)


_RAY_URL = re.compile(
    r"ray://([A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):(\d{1,5})"
)


def check_on(on: str) -> str:
    """Return ``on`` if it is ``"ray"`` or ``"ray://host:port"``; raise ValueError otherwise.

    Checked before Ray is imported, so a typo never reaches ``ray.init``.
    """
    found = _RAY_URL.fullmatch(on) if isinstance(on, str) else None
    if on != "ray" and (found is None or not 0 < int(found.group(2)) < 65536):
        raise ValueError(f"on: expected 'ray' or 'ray://host:port' (port 1-65535), got {on!r}")
    return on


def connect(on: str) -> Any:
    """Return the ``ray`` module, connected: ``"ray"`` = local (or ``RAY_ADDRESS``), else ``on``."""
    try:
        import ray
    except ImportError:
        raise ImportError("--on ray needs Ray: pip install 'kerasmagic[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=None if on == "ray" else on, log_to_driver=True)
    return ray


def _capacity(ray: Any, gpus: float) -> int:
    resources = ray.cluster_resources()
    slots = int(resources.get("CPU", 1))
    if gpus > 0:
        slots = min(slots, int(resources.get("GPU", 0) / gpus))
    return max(1, slots)


def _outcome(ray: Any, ref: Any) -> Outcome:
    import cloudpickle

    try:
        pid, data = ray.get(ref)
    except Exception as exc:  # the worker died: segfault, os._exit, OOM kill
        first = str(exc).strip().splitlines()[:3]
        return Outcome("crashed", error=f"{type(exc).__name__}: " + " ".join(first))
    return as_outcome(cloudpickle.loads(data), pid)


def ray_sweep(
    fn: Callable[..., Any],
    calls: Sequence[Call],
    *,
    on: str,
    timeout_s: float | None,
    gpus: float,
    workers: int | None = None,
    configs: Sequence[Any] | None = None,
    progress: bool = False,
) -> list[Trial]:
    """Run every call on Ray, at most ``workers`` at once; trials in submission order."""
    ray = connect(on)
    env = isolation_env("" if gpus == 0 else None)  # num_gpus=0 leaves CUDA_VISIBLE_DEVICES unset
    remote = ray.remote(max_calls=1, max_retries=0, num_cpus=1, num_gpus=gpus)(_trial)
    blobs = _pickled(fn, calls)
    limit = workers or _capacity(ray, gpus)
    configs = list(configs) if configs is not None else [args for args, _ in calls]
    show = Progress(len(calls), progress, newline=True)
    outcomes: dict[int, Outcome] = {}
    running: dict[Any, tuple[int, float]] = {}
    queue = list(range(len(calls)))
    try:
        while queue or running:
            while queue and len(running) < limit:
                index = queue.pop(0)
                running[remote.remote(blobs[index], env)] = (index, time.monotonic())
                show.started()
            _step(ray, running, outcomes, timeout_s, show)
            show.show()
    except KeyboardInterrupt:
        for ref in running:
            ray.cancel(ref, force=True)
        raise
    show.show(final=True)
    return [as_trial(outcomes[i], i, configs[i]) for i in range(len(calls))]


def _step(
    ray: Any,
    running: dict[Any, tuple[int, float]],
    outcomes: dict[int, Outcome],
    timeout_s: float | None,
    show: Progress,
) -> None:
    """Wait a little; collect finished trials; cancel (kill) those past their timeout."""
    ready, _ = ray.wait(list(running), num_returns=1, timeout=0.2)
    now = time.monotonic()
    for ref in list(running):
        index, started = running[ref]
        if ref in ready:
            outcome = _outcome(ray, ref)
        elif timeout_s is not None and now - started > timeout_s:
            ray.cancel(ref, force=True)
            text = f"timed out after {timeout_s:g} s; the Ray task was cancelled (worker killed)"
            outcome = Outcome("timeout", error=text)
        else:
            continue
        del running[ref]
        outcome.elapsed_s = now - started
        outcomes[index] = outcome
        show.finished(outcome.ok)
