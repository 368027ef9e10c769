"""The parent side of an isolated run: start it, stream its output, end it, say how it ended.

``python -c BOOT`` starts the guard (:mod:`kerasmagic.isolate.child`), which forks the worker;
every process of the run carries the run's token in its environment. A timeout, Ctrl-C or a
sweep's stop kills all of them and says which. Both pipes are read without blocking by the
calling thread, so output lands in the cell that started the run as it comes, TF's C++ log
lines dropped as ``TF_CPP_MIN_LOG_LEVEL`` asks, and the deadline holds whatever the output rate.
The run ends when the guard exits, even if an escaped process still holds the pipes.
"""

from __future__ import annotations

import codecs
import contextlib
import itertools
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

from kerasmagic.imports import user_module
from kerasmagic.isolate.child import BOOT, TOKEN_VAR, dump, end_tree, isolation_env, load, ray_trial

Status = Literal["ok", "error", "crashed", "timeout", "interrupted"]
Sink = Callable[[str, bool], None]  # (text, is_stderr)
Call = tuple[tuple[Any, ...], dict[str, Any]]  # (args, kwargs)
_POLL_S = 0.05
_GRACE_S = 0.5  # after the guard exits, how long output may still arrive
_SHM = Path("/dev/shm")
_SIGNAL_WORDS = {
    signal.SIGKILL: "likely out of memory (the OOM killer) or killed from outside",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGABRT: "aborted (a C++ check failed, or abort())",
    signal.SIGBUS: "bus error",
    signal.SIGTERM: "terminated",
}


def describe_exit(code: int) -> str:
    """Return an exit status in words: ``killed by SIGKILL — likely out of memory ...``."""
    if code >= 0:
        return f"exited with code {code} before returning a result"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"killed by signal {-code}"
    return f"killed by {sig.name}" + (f" — {_SIGNAL_WORDS[sig]}" if sig in _SIGNAL_WORDS else "")


def describe_killed(killed: list[str]) -> str:
    """Return ``killed 2 processes: sleep (pid 12), python3 (pid 13)`` ('' for none)."""
    noun = "process" if len(killed) == 1 else "processes"
    return f"killed {len(killed)} {noun}: {', '.join(killed)}" if killed else ""


@dataclass
class Outcome:
    """How a run ended; ``error`` is the child's traceback or the crash in words."""

    status: Status
    value: Any = None
    error: str | None = None
    error_type: str | None = None
    exitcode: int | None = None
    pid: int | None = None
    elapsed_s: float = 0.0
    output: str = ""
    killed: list[str] = field(default_factory=list)  # "sleep (pid 12)": what had to be killed
    error_message: str | None = None  # the child's ``str(exception)``
    oom: dict[str, Any] | None = None  # the child's allocator figures at an out-of-memory error

    @property
    def ok(self) -> bool:
        """Return True if the run returned a value."""
        return self.status == "ok"


@dataclass
class Trial(Outcome):
    """One trial of a sweep: its position, its configuration and how it ended."""

    index: int = 0
    config: Any = None


class IsolatedError(RuntimeError):
    """The isolated code raised; IPython shows the child's own traceback."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.error or outcome.status)
        self.outcome = outcome

    def _render_traceback_(self) -> list[str]:
        """Return the child's traceback lines (IPython calls this instead of its own)."""
        head = f"[isolated process {self.outcome.pid}]"
        return [head, *(self.outcome.error or self.outcome.status).rstrip("\n").splitlines()]


class IsolatedCrash(IsolatedError):
    """The isolated process died (signal, ``os._exit``) without returning a result."""


class IsolatedTimeout(IsolatedError, TimeoutError):
    """The isolated process ran past its timeout and was killed with its children."""


def unwrap(outcome: Outcome) -> Any:
    """Return the value of a successful outcome; raise the matching error otherwise."""
    if outcome.status == "ok":
        return outcome.value
    if outcome.status == "interrupted":
        raise KeyboardInterrupt
    errors = {"timeout": IsolatedTimeout, "crashed": IsolatedCrash}
    raise errors.get(outcome.status, IsolatedError)(outcome)


def as_outcome(result: tuple[str, Any], pid: int | None, exitcode: int | None = None) -> Outcome:
    """Return a child's result, ``("ok", value)`` or ``("error", (type, message, traceback,
    figures))``, as an outcome."""
    if result[0] == "ok":
        return Outcome("ok", value=result[1], exitcode=exitcode, pid=pid)
    kind, message, text, *oom = result[1]
    return Outcome("error", error=text, error_type=kind, exitcode=exitcode, pid=pid,
                   error_message=message, oom=oom[0] if oom else None)  # fmt: skip


# TensorFlow 2.16+ logs through absl, and the lines written before ``absl::InitializeLog()`` (the
# oneDNN notice, ``cpu_feature_guard``) ignore ``TF_CPP_MIN_LOG_LEVEL``. They share one format,
# ``I0000 00:00:1796099673.497028    9428 port.cc:153] ...``, so they are dropped by severity.
_LINE = re.compile(r"([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^\s:]+:\d+\] ")
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called"
_CONTINUED = "To enable the following instructions:"  # second line of cpu_feature_guard's notice


class LogFilter:
    """Feed stderr text in; get it back without the TF log lines below ``min_level``."""

    def __init__(self, min_level: str | None) -> None:
        level = (min_level or "").strip()
        self.min_level = int(level) if level.isdigit() else 0
        self._tail, self._dropped_last = "", False

    def _keep(self, line: str) -> bool:
        if (found := _LINE.match(line)) is not None:
            drop = "IWEF".index(found.group(1)) < self.min_level
        elif line.startswith(_ABSL_NOTICE):
            drop = self.min_level >= 1
        else:
            drop = self._dropped_last and line.startswith(_CONTINUED)
        self._dropped_last = drop
        return not drop

    def feed(self, text: str) -> str:
        """Return what can be shown of ``text`` now; an unfinished line that may be a log waits."""
        if self.min_level <= 0:
            return text
        lines = (self._tail + text).splitlines(keepends=True)
        tail = lines.pop() if lines and not lines[-1].endswith(("\n", "\r")) else ""
        if re.match(r"[IWEF]\d", tail) or tail[: len(_ABSL_NOTICE)] == _ABSL_NOTICE[: len(tail)]:
            self._tail = tail  # an unfinished line that may be a log line waits for its end
        else:
            self._tail, lines = "", [*lines, tail]
        return "".join(line for line in lines if self._keep(line))

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
    base = _SHM if _SHM.is_dir() and os.access(_SHM, os.W_OK) else Path(tempfile.gettempdir())
    for path in base.glob("kerasmagic-*-*"):
        owner = path.name.split("-")[1]
        if owner.isdigit() and not psutil.pid_exists(int(owner)):
            with contextlib.suppress(OSError):
                if path.is_dir() and path.stat().st_uid == os.getuid():
                    shutil.rmtree(path)
    return Path(tempfile.mkdtemp(prefix=f"kerasmagic-{os.getpid()}-", dir=base))


def _pump(
    proc: subprocess.Popen[bytes],
    sink: Sink,
    logs: LogFilter,
    deadline: float | None,
    stop: threading.Event,
) -> str:
    """Forward the guard's output until it exits ("exited"), the deadline ("timeout") or a stop
    ("stopped"); after the guard exits, output may arrive for ``_GRACE_S``."""
    decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in (0, 1)]

    def emit(text: str, is_stderr: bool) -> None:
        if text := logs.feed(text) if is_stderr else text:
            sink(text, is_stderr)

    with selectors.DefaultSelector() as pipes:
        for is_stderr, pipe in enumerate((proc.stdout, proc.stderr)):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            pipes.register(pipe.fileno(), selectors.EVENT_READ, is_stderr)
        try:
            grace_end = None
            while not stop.is_set():
                now = time.monotonic()
                if proc.poll() is not None:
                    grace_end = grace_end or now + _GRACE_S
                    if not pipes.get_map() or now >= grace_end:
                        return "exited"
                elif deadline is not None and now >= deadline:
                    return "timeout"
                wait_s = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - now))
                if not pipes.get_map():  # the pipes closed: the guard is exiting
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(wait_s)
                for key, _ in pipes.select(wait_s) if pipes.get_map() else ():
                    with contextlib.suppress(BlockingIOError):
                        chunk = os.read(key.fd, 65536)
                        if not chunk:
                            pipes.unregister(key.fd)
                        emit(decoders[key.data].decode(chunk, final=not chunk), bool(key.data))
            return "stopped"
        finally:
            emit(logs.flush(), True)


def run_local(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    timeout_s: float | None = None,
    gpus: str | None = None,
    sink: Sink = to_std_streams,
    stop: threading.Event | None = None,
) -> Outcome:
    """Run ``fn(*args, **kwargs)`` in a fresh process; Ctrl-C kills it and propagates; setting
    ``stop`` (from another thread) kills it, the outcome "interrupted"."""
    work, start, token = workdir(), time.monotonic(), os.urandom(16).hex()
    try:
        dump((fn, tuple(args), dict(kwargs or {})), work / "call")
        (work / "path").write_text("\0".join(map(str, sys.path)))  # the kernel's
        env = {**os.environ, **isolation_env(gpus), TOKEN_VAR: token}
        env["KERASMAGIC_PARENT_PID"] = str(os.getpid())
        if "PYTHONPATH" in env:  # kept away from the runner's start-up, restored for the user's
            env["KERASMAGIC_PYTHONPATH"] = env.pop("PYTHONPATH")
        root = Path(__file__).resolve().parents[2]  # where this kerasmagic is imported from
        proc = subprocess.Popen(
            [sys.executable, "-c", BOOT, str(root), str(work)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
            start_new_session=True,  # a terminal's Ctrl-C reaches the kernel only
        )  # fmt: skip
        deadline, ended = None if timeout_s is None else start + timeout_s, None
        try:
            logs = LogFilter(env["TF_CPP_MIN_LOG_LEVEL"])
            ended = _pump(proc, sink, logs, deadline, stop or threading.Event())
        finally:
            killed = [] if ended == "exited" else end_tree(proc.pid, token)  # guard not yet reaped
            proc.kill()  # the guard has exited, or is killed last
            proc.wait()
            if ended == "exited":
                killed = _read(work / "killed").splitlines()
                if proc.returncode < 0:  # the guard died by a signal: its orphans went to init
                    killed += end_tree(None, token)
            elif ended is None:  # Ctrl-C (or an error) while it ran
                sink(
                    f"kerasmagic: interrupted; {describe_killed(killed) or 'nothing left'}\n", True
                )
        worker, what = int(_read(work / "worker") or proc.pid), describe_killed(killed)
        if ended == "stopped":
            outcome = Outcome("interrupted", error=f"stopped; {what or 'nothing left'}", pid=worker)
        elif ended == "timeout":
            what = what or "the process had already ended"
            outcome = Outcome(
                "timeout", error=f"timed out after {timeout_s:g} s; {what}", pid=worker
            )
        else:
            outcome = _collect(work / "result", proc.returncode, worker)
            if killed:
                sink(f"kerasmagic: {what} (left running by the isolated code)\n", True)
        outcome.killed = killed
    finally:
        shutil.rmtree(work, ignore_errors=True)
    outcome.elapsed_s = time.monotonic() - start
    return outcome


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _collect(result: Path, code: int, pid: int) -> Outcome:
    """Return the outcome the worker wrote to ``result``, or the crash in words."""
    if not result.exists():
        return Outcome("crashed", error=describe_exit(code), exitcode=code, pid=pid)
    try:
        return as_outcome(load(result), pid, code)
    except Exception as exc:
        text = f"the result could not be loaded in the kernel: {type(exc).__name__}: {exc}\n"
        return Outcome("error", error=text, error_type=type(exc).__name__, pid=pid)


# -- many runs: sweeps, locally or on Ray -------------------------------------------------------


def run_one(
    fn: Callable[..., Any], args: Any, kwargs: Any, on: Any, timeout: Any, gpus: Any
) -> Outcome:
    """Run one call in a fresh process, locally or on Ray."""
    if on is None:
        return run_local(fn, args, kwargs, timeout_s=timeout, gpus=gpus)
    return run_trials(fn, [(tuple(args), kwargs)], [args], on, timeout, gpus)[0]


def run_trials(
    fn: Callable[..., Any],
    calls: list[Call],
    configs: list[Any],
    on: str | None,
    timeout: float | None,
    gpus: Any,
    workers: int | None = None,
    progress: bool = False,
    stream: bool = True,
) -> list[Trial]:
    """Run each call in a fresh process, ``workers`` at a time, locally (``gpus``: the specs
    handed out in turn) or on Ray; print ``sweep 3/8 done · 2 running · 1 failed · 12.0 s`` as
    the counts change (``\\r``-updated unless output streams). Ctrl-C stops them all (on Ray it
    then raises)."""
    stop, lock, start, me = threading.Event(), threading.Lock(), time.monotonic(), threading.local()
    slots = list(itertools.islice(itertools.cycle(gpus), workers)) if on is None else []

    def take_slot() -> None:  # each worker thread keeps one GPU spec
        with lock:
            me.gpus = slots.pop(0) if slots else None

    def run_here(index: int, sink: Sink) -> Outcome:
        args, kwargs = calls[index]
        return run_local(fn, args, kwargs, timeout_s=timeout, gpus=me.gpus, sink=sink, stop=stop)

    run: Callable[[int, Sink], Outcome] = run_here
    if on is not None:
        run, workers = _ray_runner(fn, calls, on, timeout, gpus, workers, stop)
    counts, shown = [0, 0, 0], [""]  # done, running, failed; the line last shown

    def show(final: bool = False) -> None:
        done, running, failed = counts
        line = f"sweep {done}/{len(calls)} done · {running} running · {failed} failed"
        if progress and (line != shown[0] or final):
            shown[0], elapsed = line, f"{time.monotonic() - start:.1f} s"
            end = "\n" if stream or final else ""
            print(("" if stream else "\r") + f"{line} · {elapsed}", end=end, flush=True)

    def one(index: int) -> Trial:
        if stop.is_set():
            return Trial("interrupted", error="not started", index=index, config=configs[index])
        parts: list[str] = []
        sink: Sink = to_std_streams if stream else lambda text, _: parts.append(text)
        with lock:
            counts[1] += 1
        begun = time.monotonic()
        try:
            outcome = run(index, sink)
        except Exception as exc:  # e.g. the config cannot be pickled: this trial fails
            kind = type(exc).__name__
            outcome = Outcome("error", error=f"{kind}: {exc}\n", error_type=kind)
        outcome.output, outcome.elapsed_s = "".join(parts), time.monotonic() - begun
        with lock:
            counts[:] = [counts[0] + 1, counts[1] - 1, counts[2] + (not outcome.ok)]
        return Trial(**vars(outcome), index=index, config=configs[index])

    with ThreadPoolExecutor(workers, "kerasmagic-sweep", initializer=take_slot) as pool:
        futures = [pool.submit(one, i) for i in range(len(calls))]
        try:
            while wait(futures, timeout=0.2).not_done:
                show()
        except KeyboardInterrupt:
            stop.set()  # the running trials are killed, the others not started
            if on is not None:
                raise
            print("\nkerasmagic: sweep interrupted; running trials were killed", file=sys.stderr)
        show(final=True)
    return [future.result() for future in futures]


def _ray_runner(
    fn: Callable[..., Any],
    calls: list[Call],
    on: str,
    timeout_s: float | None,
    gpus: float,
    workers: int | None,
    stop: threading.Event,
) -> tuple[Callable[[int, Sink], Outcome], int]:
    """Connect to Ray and pickle the calls; return what runs one in a fresh worker of its own
    (no retries; a timeout or stop kills it) and how many run at once (default: what fits)."""
    try:
        ray: Any = __import__("ray")
    except ImportError:
        raise ImportError("--on ray needs Ray: pip install 'kerasmagic[ray]'") from None
    import cloudpickle

    if not ray.is_initialized():
        ray.init(address=None if on == "ray" else on, log_to_driver=True)
    env = isolation_env("" if gpus == 0 else None)  # num_gpus=0 leaves CUDA_VISIBLE_DEVICES unset
    remote = ray.remote(max_calls=1, max_retries=0, num_cpus=1, num_gpus=gpus)(ray_trial)
    # fn's module goes by value when it is a local file (workers import installed packages only)
    name = getattr(fn, "__module__", "") or ""
    module = sys.modules.get(name) if name != "__main__" and user_module(name) else None
    if module is not None:
        cloudpickle.register_pickle_by_value(module)
    try:
        blobs = [cloudpickle.dumps((fn, args, kwargs)) for args, kwargs in calls]
    finally:
        if module is not None:
            cloudpickle.unregister_pickle_by_value(module)
    if not workers:
        resources = ray.cluster_resources()
        workers = int(resources.get("CPU", 1))
        if gpus > 0:
            workers = min(workers, int(resources.get("GPU", 0) / gpus))

    late = f"timed out after {timeout_s or 0:g} s; the Ray task was cancelled (worker killed)"

    def run(index: int, _: Sink) -> Outcome:
        start, ref = time.monotonic(), remote.remote(blobs[index], env)
        while not ray.wait([ref], timeout=0.2)[0]:
            if stop.is_set():
                ray.cancel(ref, force=True)
                return Outcome("interrupted", error="stopped")
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                ray.cancel(ref, force=True)
                return Outcome("timeout", error=late)
        try:
            pid, data = ray.get(ref)
        except Exception as exc:  # the worker died: segfault, os._exit, OOM kill
            first = " ".join(str(exc).strip().splitlines()[:3])
            return Outcome("crashed", error=f"{type(exc).__name__}: {first}")
        return as_outcome(cloudpickle.loads(data), pid)

    return run, max(1, workers)
