"""Isolated runs: what users call (``run_isolated``, ``@isolated``, ``sweep``, ``%%fresh_model
--isolate``) and the kernel's side of each run: start it, stream its output, end it, say how.

``gpus`` is the GPUs each run gets, spelt the way its runner can honour: locally the devices
themselves (``CUDA_VISIBLE_DEVICES``: ``"0"``, ``"0,1"``, ``[1, 0]``, ``""`` for CPU only);
on Ray how many, since Ray picks them (``1``, ``0.5`` shares one).

Locally ``python -c BOOT`` starts the guard (:mod:`kerasmagic.isolate.child`), which forks the
worker; every process of the run carries the run's token in its environment. A timeout, Ctrl-C
or a sweep's stop kills all of them and says which. Both pipes are read without blocking by the
calling thread, so output lands in the cell that started the run as it comes, TF's C++ log
lines dropped as ``TF_CPP_MIN_LOG_LEVEL`` asks, and the deadline holds whatever the output
rate. The run ends when the guard exits, even if an escaped process still holds the pipes.

On Ray every trial is ``@ray.remote(max_calls=1, max_retries=0)``: a fresh worker process per
trial (its exit returns all its GPU memory), never silently rerun; a timeout calls
``ray.cancel(force=True)``, which kills the worker. Worker output comes through Ray's own log
forwarding (``log_to_driver``). The cell magic runs the cell's source in the child with the
named ``--inputs`` as its globals; the named ``--outputs`` come back into the notebook only if
the cell succeeds. Nothing here imports TensorFlow, and IPython only for the magic.
"""

from __future__ import annotations

import ast
import codecs
import contextlib
import functools
import importlib.util
import keyword
import math
import os
import pickle
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import psutil

from kerasmagic.imports import user_module
from kerasmagic.isolate import child

F = TypeVar("F", bound=Callable[..., Any])
Gpus = str | int | float | Sequence[int] | Sequence[str] | None
Sink = Callable[[str, bool], None]  # (text, is_stderr)
Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]  # (fn, args, kwargs)
_RAY = re.compile(r"ray://([A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):(\d{1,5})")
_SIGNAL_WORDS: dict[int, str] = {
    signal.SIGKILL: "likely out of memory (the OOM killer) or killed from outside",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGABRT: "aborted (a C++ check failed, or abort())",
    signal.SIGBUS: "bus error",
    signal.SIGTERM: "terminated",
}


@dataclass
class Outcome:
    """How a run ended; ``error`` is the child's traceback or the crash in words. A sweep's
    trials carry their position (``index``) and configuration too."""

    status: Literal["ok", "error", "crashed", "timeout", "interrupted"]
    value: Any = None
    error: str | None = None
    error_type: str | None = None
    pid: int | None = None
    elapsed_s: float = 0.0
    output: str = ""
    killed: list[str] = field(default_factory=list)  # "sleep (pid 12)": what had to be killed
    error_message: str | None = None  # the child's ``str(exception)``
    oom: dict[str, Any] | None = None  # the child's allocator figures at an out-of-memory error
    index: int = 0
    config: Any = None

    @property
    def ok(self) -> bool:
        """Return True if the run returned a value."""
        return self.status == "ok"


Trial = Outcome  # one trial of a sweep


class IsolatedError(RuntimeError):
    """The isolated code raised; IPython shows the child's own traceback."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.error or outcome.status)
        self.outcome = outcome

    def _render_traceback_(self) -> list[str]:
        """Return the child's traceback lines (IPython calls this instead of its own)."""
        return [f"[isolated process {self.outcome.pid}]", *str(self).rstrip("\n").splitlines()]


class IsolatedCrash(IsolatedError):
    """The isolated process died (signal, ``os._exit``) without returning a result."""


class IsolatedTimeout(IsolatedError, TimeoutError):
    """The isolated process ran past its timeout and was killed with its children."""


def unwrap(outcome: Outcome) -> Any:
    """Return the value of a successful outcome; raise the matching error otherwise."""
    if outcome.status == "interrupted":
        raise KeyboardInterrupt
    if outcome.status != "ok":
        errors = {"timeout": IsolatedTimeout, "crashed": IsolatedCrash}
        raise errors.get(outcome.status, IsolatedError)(outcome)
    return outcome.value


def as_outcome(result: tuple[str, Any], pid: int | None) -> Outcome:
    """Return a child's result, ``("ok", value)`` or ``("error", (type, message, traceback,
    figures))``, as an outcome."""
    if result[0] == "ok":
        return Outcome("ok", value=result[1], pid=pid)
    kind, message, text, oom = result[1]
    return Outcome("error", error=text, error_type=kind, pid=pid, error_message=message, oom=oom)


def describe_killed(killed: list[str]) -> str:
    """Return ``killed 2 processes: sleep (pid 12), python3 (pid 13)`` ('' for none)."""
    noun = "process" if len(killed) == 1 else "processes"
    return f"killed {len(killed)} {noun}: {', '.join(killed)}" if killed else ""


# TensorFlow 2.16+ logs through absl, and the lines written before ``absl::InitializeLog()`` (the
# oneDNN notice, ``cpu_feature_guard``) ignore ``TF_CPP_MIN_LOG_LEVEL``. They share one format,
# ``I0000 00:00:1796099673.497028    9428 port.cc:153] ...``, so they are dropped by severity.
_LINE = re.compile(r"([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^\s:]+:\d+\] ")
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called"
_CONTINUED = "To enable the following instructions:"  # second line of cpu_feature_guard's notice


class LogFilter:
    """Feed stderr text in; get it back without the TF log lines below ``min_level``."""

    def __init__(self, min_level: str | None) -> None:
        self.min_level = int(level) if (level := (min_level or "").strip()).isdigit() else 0
        self._tail, self._dropped_last = "", False

    def _keep(self, line: str) -> bool:
        found, last = _LINE.match(line), self._dropped_last
        if found:
            drop = "IWEF".index(found.group(1)) < self.min_level
        else:  # absl's notice goes with the info lines (min_level >= 1 here)
            drop = line.startswith(_ABSL_NOTICE) or (last and line.startswith(_CONTINUED))
        self._dropped_last = drop
        return not drop

    def feed(self, text: str) -> str:
        """Return what can be shown of ``text`` now; an unfinished line that may be a log waits."""
        if self.min_level <= 0:
            return text
        lines = (self._tail + text).splitlines(keepends=True)
        tail = lines.pop() if lines and not lines[-1].endswith(("\n", "\r")) else ""
        # an unfinished line that may be a log line waits for its end
        waits = re.match(r"[IWEF]\d", tail) or _ABSL_NOTICE.startswith(tail[: len(_ABSL_NOTICE)])
        self._tail = tail if waits else ""
        return "".join(line for line in (lines if waits else [*lines, tail]) if self._keep(line))

    def flush(self) -> str:
        """Return the unfinished line still held back (at the end of the run)."""
        tail, self._tail = self._tail, ""
        return tail if tail and self._keep(tail) else ""


def to_std_streams(text: str, is_stderr: bool) -> None:
    """Write child output to this process's ``sys.stdout`` / ``sys.stderr`` at once."""
    print(text, end="", file=sys.stderr if is_stderr else sys.stdout, flush=True)


def workdir() -> Path:
    """Return a fresh private directory named after this process, in ``/dev/shm`` (RAM) when
    usable; remove those of dead kernels (a kernel killed mid-cell) on the way."""
    base = Path("/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir())
    for path in base.glob("kerasmagic-*-*"):
        with contextlib.suppress(OSError, ValueError):  # not a kernel's, another's, or gone
            dead = not psutil.pid_exists(int(path.name.split("-")[1]))
            if dead and path.is_dir() and path.stat().st_uid == os.getuid():
                shutil.rmtree(path)
    return Path(tempfile.mkdtemp(prefix=f"kerasmagic-{os.getpid()}-", dir=base))


def _pump(proc: subprocess.Popen[bytes], sink: Sink, deadline: float, stop: threading.Event) -> str:
    """Forward the guard's output, TF's log lines dropped, until it exits ("exited"), the
    deadline ("timeout") or a stop ("stopped"); after it exits, output may come for 0.5 s."""
    # the child's level, as child.isolation_env sets it: the user's, else 3
    logs, grace_end = LogFilter(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")), math.inf

    def emit(text: str, is_stderr: bool) -> None:
        if text := logs.feed(text) if is_stderr else text:
            sink(text, is_stderr)

    with selectors.DefaultSelector() as pipes:
        for is_stderr, pipe in enumerate((proc.stdout, proc.stderr)):
            assert pipe is not None  # blocking: read only when select finds data or the end
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            pipes.register(pipe, selectors.EVENT_READ, (bool(is_stderr), decoder))
        try:
            while not stop.is_set():
                now = time.monotonic()
                if proc.poll() is not None:
                    grace_end = min(grace_end, now + 0.5)
                    if not pipes.get_map() or now >= grace_end:
                        return "exited"
                elif now >= deadline:
                    return "timeout"
                # with both pipes closed (the guard is exiting) this only waits
                for key, _ in pipes.select(max(0.0, min(0.05, deadline - now))):
                    if not (chunk := os.read(key.fd, 65536)):
                        pipes.unregister(key.fd)
                    emit(key.data[1].decode(chunk, final=not chunk), key.data[0])
            return "stopped"
        finally:
            emit(logs.flush(), True)


def run_local(
    call: Call, timeout_s: float | None, gpus: str | None, sink: Sink, stop: threading.Event
) -> Outcome:
    """Run ``call``, ``(fn, args, kwargs)``, in a fresh process; Ctrl-C kills it and
    propagates; setting ``stop`` (from another thread) kills it, the outcome "interrupted"."""
    work, start, token = workdir(), time.monotonic(), os.urandom(16).hex()
    try:
        child.dump(call, work / "call")
        (work / "path").write_text("\0".join(map(str, sys.path)))  # the kernel's
        env = {**os.environ, **child.isolation_env(gpus), child.TOKEN_VAR: token}
        if "PYTHONPATH" in env:  # kept away from the runner's start-up, restored for the user's
            env["KERASMAGIC_PYTHONPATH"] = env.pop("PYTHONPATH")
        proc = subprocess.Popen(  # kerasmagic from where this one is imported
            [sys.executable, "-c", child.BOOT, str(Path(__file__).resolve().parents[2]), str(work)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
            start_new_session=True,  # a terminal's Ctrl-C reaches the kernel only
        )  # fmt: skip
        ended = None
        try:
            ended = _pump(proc, sink, start + (timeout_s or math.inf), stop)
        finally:
            if ended == "exited":  # the guard killed what the worker left; its orphans if it died
                killed = _read(work / "killed").splitlines()
                if proc.returncode < 0:
                    killed += child.end_tree(None, token)
            else:
                killed = child.end_tree(proc.pid, token)  # the guard is killed last
                proc.kill()
                proc.wait()
            what = describe_killed(killed)
            if ended is None:  # Ctrl-C (or an error) while it ran
                sink(f"kerasmagic: interrupted; {what or 'nothing left'}\n", True)
        worker = int(_read(work / "worker") or proc.pid)
        if ended == "stopped":
            outcome = Outcome("interrupted", error=f"stopped; {what or 'nothing left'}", pid=worker)
        elif ended == "timeout":
            error = f"timed out after {timeout_s:g} s; {what or 'the process had already ended'}"
            outcome = Outcome("timeout", error=error, pid=worker)
        elif not (work / "result").exists():
            outcome = Outcome("crashed", error=describe_exit(proc.returncode), pid=worker)
        else:
            try:
                outcome = as_outcome(child.load(work / "result"), worker)
            except Exception as exc:
                kind = type(exc).__name__
                error = f"the result could not be loaded in the kernel: {kind}: {exc}\n"
                outcome = Outcome("error", error=error, error_type=kind, pid=worker)
        if ended == "exited" and killed:
            sink(f"kerasmagic: {what} (left running by the isolated code)\n", True)
        outcome.killed = killed
    finally:
        shutil.rmtree(work, ignore_errors=True)
    outcome.elapsed_s = time.monotonic() - start
    return outcome


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def describe_exit(code: int) -> str:
    """Return an exit status in words: ``killed by SIGKILL — likely out of memory ...``."""
    if code >= 0:
        return f"exited with code {code} before returning a result"
    name = next((sig.name for sig in signal.Signals if sig == -code), f"signal {-code}")
    return f"killed by {name}" + (f" — {words}" if (words := _SIGNAL_WORDS.get(-code)) else "")


# -- many runs: sweeps, locally or on Ray -------------------------------------------------------


def run_one(call: Call, on: str | None, timeout: float | None, gpus: Any) -> Outcome:
    """Run one call in a fresh process, locally (in this thread) or on Ray."""
    if on is None:
        return run_local(call, timeout, gpus, to_std_streams, threading.Event())
    return run_trials([call], [call[1]], on, timeout, gpus)[0]


def run_trials(
    calls: list[Call],
    configs: list[Any],
    on: str | None,
    timeout: float | None,
    gpus: Any,
    workers: int | None = None,
    progress: bool = False,
    stream: bool = True,
) -> list[Trial]:
    """Run each call in a fresh process, ``workers`` at a time, and print ``sweep 3/8 done · 2
    running · 1 failed · 12.0 s`` as the counts change (``\\r``-updated unless output streams).
    Locally ``gpus`` is the specs handed out to the workers in turn; Ctrl-C stops them all. On
    Ray each call runs in a fresh worker of its own (no retries; a timeout or stop kills it),
    ``workers`` defaults to what fits, and Ctrl-C stops them all and raises."""
    stop, start, me = threading.Event(), time.monotonic(), threading.local()
    if on is not None:  # connect to Ray and pickle the calls before any starts
        try:
            ray: Any = __import__("ray")
        except ImportError:
            raise ImportError("--on ray needs Ray: pip install 'kerasmagic[ray]'") from None
        import cloudpickle

        if not ray.is_initialized():
            ray.init(address=None if on == "ray" else on, log_to_driver=True)
        env = child.isolation_env("" if gpus == 0 else None)  # num_gpus=0 leaves CUDA unset
        remote = ray.remote(max_calls=1, max_retries=0, num_cpus=1, num_gpus=gpus)(child.ray_trial)
        # fn's module goes by value when it is a local file (workers import installed packages)
        name = getattr(calls[0][0] if calls else None, "__module__", None) or "__main__"
        with contextlib.ExitStack() as undo:
            if name != "__main__" and user_module(name) and (module := sys.modules.get(name)):
                cloudpickle.register_pickle_by_value(module)
                undo.callback(cloudpickle.unregister_pickle_by_value, module)
            blobs = [cloudpickle.dumps(call) for call in calls]
        if not workers:  # what fits: a CPU each, and the GPUs asked for
            have = ray.cluster_resources()
            workers = int(min(have.get("CPU", 1), have.get("GPU", 0) / gpus if gpus else math.inf))
        late = f"timed out after {timeout or 0:g} s; the Ray task was cancelled (worker killed)"
    workers = max(1, min(workers or 1, len(calls)))  # no more at a time than there are runs
    slots = list(gpus if on is None and gpus else [None]) * workers  # GPU specs in turn
    shown = [""]  # the line last shown

    def run(index: int, sink: Sink) -> Outcome:
        if on is None:
            return run_local(calls[index], timeout, me.gpus, sink, stop)
        ref, end = remote.remote(blobs[index], env), time.monotonic() + (timeout or math.inf)
        while not ray.wait([ref], timeout=0.2)[0]:
            if stop.is_set() or time.monotonic() > end:
                ray.cancel(ref, force=True)
                if stop.is_set():
                    return Outcome("interrupted", error="stopped")
                return Outcome("timeout", error=late)
        try:
            pid, data = ray.get(ref)
        except Exception as exc:  # the worker died: segfault, os._exit, OOM kill
            first = " ".join(str(exc).strip().splitlines()[:3])
            return Outcome("crashed", error=f"{type(exc).__name__}: {first}")
        return as_outcome(cloudpickle.loads(data), pid)

    def show(futures: list[Any], final: bool = False) -> None:
        ended = [future.result() for future in futures if future.done()]
        running, failed = sum(f.running() for f in futures), sum(not t.ok for t in ended)
        line = f"sweep {len(ended)}/{len(calls)} done · {running} running · {failed} failed"
        if progress and (line != shown[0] or final):
            shown[0], cr, end = line, "" if stream else "\r", "\n" if stream or final else ""
            print(f"{cr}{line} · {time.monotonic() - start:.1f} s", end=end, flush=True)

    def one(index: int) -> Trial:
        if stop.is_set():
            return Trial("interrupted", error="not started", index=index, config=configs[index])
        parts: list[str] = []
        begun = time.monotonic()
        try:
            outcome = run(index, to_std_streams if stream else lambda text, _: parts.append(text))
        except Exception as exc:  # e.g. the config cannot be pickled: this trial fails
            kind = type(exc).__name__
            outcome = Outcome("error", error=f"{kind}: {exc}\n", error_type=kind)
        outcome.output, outcome.elapsed_s = "".join(parts), time.monotonic() - begun
        outcome.index, outcome.config = index, configs[index]
        return outcome

    take_slot = lambda: setattr(me, "gpus", slots.pop(0))  # noqa: E731  # one per worker thread
    with ThreadPoolExecutor(workers, "kerasmagic-sweep", initializer=take_slot) as pool:
        futures = [pool.submit(one, i) for i in range(len(calls))]
        try:
            while wait(futures, timeout=0.2).not_done:
                show(futures)
        except KeyboardInterrupt:
            stop.set()  # the running trials are killed, the others not started
            if on is not None:
                raise
            print("\nkerasmagic: sweep interrupted; running trials were killed", file=sys.stderr)
        show(futures, final=True)
    return [future.result() for future in futures]


# -- the public API ------------------------------------------------------------------------------


def gpu_spec(gpus: Gpus) -> str | None:
    """Return ``gpus`` as a ``CUDA_VISIBLE_DEVICES`` value ("" = CPU only, None = inherit)."""
    if isinstance(gpus, float):
        raise ValueError(f"gpus: a number of GPUs ({gpus!r}) needs on='ray'; here give indices")
    if isinstance(gpus, int):
        gpus = str(gpus)
    try:
        spec = gpus if gpus is None or isinstance(gpus, str) else ",".join(map(str, map(int, gpus)))
    except (TypeError, ValueError):
        spec = repr(gpus)  # refused below, as given
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
    found = _RAY.fullmatch(on) if isinstance(on, str) else None
    if on != "ray" and (found is None or not 0 < int(found.group(2)) < 65536):
        raise ValueError(f"on: expected 'ray' or 'ray://host:port' (port 1-65535), got {on!r}")
    with contextlib.suppress(TypeError, ValueError):
        if 0 <= (count := 0.0 if gpus in (None, "") else float(gpus)) < math.inf:
            return count
    raise ValueError(f"gpus on Ray: a number of GPUs per run, e.g. 1 or 0.5, not {gpus!r}")


def run_isolated(
    fn: Callable[..., Any],
    /,
    *args: Any,
    timeout: float | None = None,
    gpus: Gpus = None,
    on: str | None = None,
    **kwargs: Any,
) -> Any:
    """Call ``fn(*args, **kwargs)`` in a fresh process and return its value.

    ``gpus`` pins devices locally ("0", "0,1", "" for CPU); with ``on="ray"`` or
    ``"ray://host:port"`` it is the number of GPUs per run (fractions allowed). Raises
    ``IsolatedError`` (with the child's traceback), ``IsolatedCrash`` or ``IsolatedTimeout``.
    """
    return unwrap(run_one((fn, args, kwargs), on, timeout, _checked(timeout, on, gpus)))


@overload
def isolated(fn: F, /) -> F: ...
@overload
def isolated(
    *, timeout: float | None = None, gpus: Gpus = None, on: str | None = None
) -> Callable[[F], F]: ...
def isolated(
    f: F | None = None, /, *, timeout: float | None = None, gpus: Gpus = None, on: str | None = None
) -> F | Callable[[F], F]:
    """Make every call of ``f`` run in a fresh process (``@isolated`` or ``@isolated(...)``)."""
    _checked(timeout, on)

    def wrap(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return run_isolated(func, *args, timeout=timeout, gpus=gpus, on=on, **kwargs)

        return wrapper  # type: ignore[return-value]

    return wrap if f is None else wrap(f)


def sweep(
    fn: Callable[..., Any],
    configs: Iterable[Any],
    *,
    workers: int | None = None,
    on: str | None = None,
    timeout: float | None = None,
    gpus: Gpus = None,
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
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):  # fmt: skip
        raise ValueError(f"workers must be a whole number of at least 1, not {workers!r}")
    if on is None:
        workers = workers or 1
        count = [gpu_spec(g) for g in gpus] if many else [count]  # type: ignore[union-attr]
    stream = on is not None or (workers == 1 if stream is None else stream)
    configs = list(configs)  # a dict config as keyword arguments, anything else as the argument
    calls = [(fn, (), dict(c)) if isinstance(c, Mapping) else (fn, (c,), {}) for c in configs]
    return run_trials(calls, configs, on, timeout, count, workers, progress, stream)


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
    call: Call = (child.exec_cell, (code, {n: shell.user_ns[n] for n in inputs}, outputs), {})
    try:
        outcome = run_one(call, args.on, args.timeout, gpus)
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
        where = f"{'Ray' if args.on else 'process'} {outcome.pid}, {outcome.elapsed_s:.1f} s"
        print(f"kerasmagic: ran isolated in {where}{back}", flush=True)
    return value["value"]
