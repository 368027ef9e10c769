"""The parent side of an isolated run: start it, stream its output, end it, say how it ended.

``python -c BOOT`` starts a guard (:mod:`kerasmagic.isolate.child`), which forks the worker. The
guard is a child subreaper, so everything the run starts stays in its tree; every process of the
run also carries the run's token in its environment. A timeout, Ctrl-C or a sweep's stop kills
all of them (:func:`~kerasmagic.isolate.child.end_tree`) and says which; after a normal exit the
guard kills what the worker left running. Both pipes are read without blocking by the calling
thread, so output lands in the cell that started the run as it comes (Keras progress bars use
``\\r``), TF's C++ log lines dropped as ``TF_CPP_MIN_LOG_LEVEL`` asks, and the deadline is
checked whatever the output rate. The run ends when the guard exits, even if some escaped
process still holds the pipes. A sweep runs many such calls, a few at a time.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import psutil

from kerasmagic.isolate.child import BOOT, TOKEN_VAR, dump, end_tree, isolation_env, load

Status = Literal["ok", "error", "crashed", "timeout", "interrupted"]
Ended = Literal["exited", "timeout", "stopped"]
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
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"killed by signal {-code}"
        words = _SIGNAL_WORDS.get(signal.Signals(-code))
        return f"killed by {name}" + (f" — {words}" if words else "")
    return f"exited with code {code} before returning a result"


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
    if outcome.status == "timeout":
        raise IsolatedTimeout(outcome)
    if outcome.status == "crashed":
        raise IsolatedCrash(outcome)
    if outcome.status == "interrupted":
        raise KeyboardInterrupt
    raise IsolatedError(outcome)


# TensorFlow 2.16+ logs through absl, and the lines written before ``absl::InitializeLog()`` (the
# oneDNN notice, ``cpu_feature_guard``) ignore ``TF_CPP_MIN_LOG_LEVEL``. They share one format,
# ``I0000 00:00:1796099673.497028    9428 port.cc:153] ...``, so they are dropped by severity.
_LINE = re.compile(r"([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^\s:]+:\d+\] ")
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called"
_CONTINUED = "To enable the following instructions:"  # second line of cpu_feature_guard's notice
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}


class LogFilter:
    """Feed stderr text in; get it back without the TF log lines below ``min_level`` (all the
    rest, ``\\r`` progress updates included, passes untouched)."""

    def __init__(self, min_level: str | None) -> None:
        try:
            self.min_level = int(min_level or 0)
        except ValueError:
            self.min_level = 0
        self._tail = ""
        self._dropped_last = False

    def _keep(self, line: str) -> bool:
        found = _LINE.match(line)
        if found is not None:
            drop = _SEVERITY[found.group(1)] < self.min_level
        elif line.startswith(_ABSL_NOTICE):
            drop = self.min_level >= 1
        else:
            drop = self._dropped_last and line.startswith(_CONTINUED)
        self._dropped_last = drop
        return not drop

    def feed(self, text: str) -> str:
        """Return what can be shown of ``text`` now; an unfinished line waits for its end."""
        if self.min_level <= 0:
            return text
        lines = (self._tail + text).splitlines(keepends=True)
        self._tail = lines.pop() if lines and not lines[-1].endswith(("\n", "\r")) else ""
        if self._tail and not self._could_be_log(self._tail):
            lines.append(self._tail)
            self._tail = ""
        return "".join(line for line in lines if self._keep(line))

    def _could_be_log(self, text: str) -> bool:
        starts_log = re.match(r"[IWEF]\d", text) is not None
        return starts_log or _ABSL_NOTICE.startswith(text) or text.startswith(_ABSL_NOTICE)

    def flush(self) -> str:
        """Return the unfinished line still held back (at the end of the run)."""
        tail, self._tail = self._tail, ""
        return tail if tail and self._keep(tail) else ""


def to_std_streams(text: str, is_stderr: bool) -> None:
    """Write child output to this process's ``sys.stdout`` / ``sys.stderr`` at once."""
    stream = sys.stderr if is_stderr else sys.stdout
    stream.write(text)
    stream.flush()


class Output:
    """The child's two pipes, read without blocking, decoded, TF log lines dropped."""

    def __init__(self, proc: subprocess.Popen[bytes], sink: Sink, log_level: str | None) -> None:
        self.sink, self.logs = sink, LogFilter(log_level)
        self.selector = selectors.DefaultSelector()
        for pipe, is_stderr in ((proc.stdout, False), (proc.stderr, True)):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            self.selector.register(pipe.fileno(), selectors.EVENT_READ, is_stderr)
        self.decoders = {f: codecs.getincrementaldecoder("utf-8")("replace") for f in (0, 1)}

    def open(self) -> bool:
        """Return True while a pipe is still open."""
        return bool(self.selector.get_map())

    def read(self, wait_s: float) -> None:
        """Forward what arrives within ``wait_s``."""
        for key, _ in self.selector.select(wait_s):
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                self.selector.unregister(key.fd)
            self._emit(self.decoders[key.data].decode(chunk, final=not chunk), key.data)

    def _emit(self, text: str, is_stderr: bool) -> None:
        text = self.logs.feed(text) if is_stderr else text
        if text:
            self.sink(text, is_stderr)

    def close(self) -> None:
        self._emit(self.logs.flush(), True)
        self.selector.close()


def workdir() -> Path:
    """Return a fresh private directory, in ``/dev/shm`` (RAM-backed) when it is usable.

    Its name carries this process's pid; directories of dead owners (a kernel killed mid-cell)
    are removed on the way.
    """
    base = _SHM if _SHM.is_dir() and os.access(_SHM, os.W_OK) else Path(tempfile.gettempdir())
    remove_stale(base)
    return Path(tempfile.mkdtemp(prefix=f"kerasmagic-{os.getpid()}-", dir=base))


def remove_stale(base: Path) -> None:
    """Remove this user's ``kerasmagic-PID-*`` directories whose PID is no longer running."""
    for path in base.glob("kerasmagic-*-*"):
        owner = path.name.split("-")[1]
        if owner.isdigit() and not psutil.pid_exists(int(owner)):
            with contextlib.suppress(OSError):
                if path.is_dir() and path.stat().st_uid == os.getuid():
                    shutil.rmtree(path)


def describe_killed(killed: list[str]) -> str:
    """Return ``killed 2 processes: sleep (pid 12), python3 (pid 13)`` ('' for none)."""
    if not killed:
        return ""
    noun = "process" if len(killed) == 1 else "processes"
    return f"killed {len(killed)} {noun}: {', '.join(killed)}"


def _launch(work: Path, env: dict[str, str], token: str) -> subprocess.Popen[bytes]:
    """Start the guard; the user's code will see this kernel's ``sys.path`` and cwd."""
    (work / "path").write_text(json.dumps([str(p) for p in sys.path]))
    env = {**os.environ, **env, "KERASMAGIC_PARENT_PID": str(os.getpid()), TOKEN_VAR: token}
    if "PYTHONPATH" in env:  # kept away from the runner's start-up, restored for the user's code
        env["KERASMAGIC_PYTHONPATH"] = env.pop("PYTHONPATH")
    root = str(Path(__file__).resolve().parents[2])  # where this kerasmagic is imported from
    return subprocess.Popen(
        [sys.executable, "-c", BOOT, root, str(work)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # a terminal's Ctrl-C reaches the kernel only
    )


def _pump(
    proc: subprocess.Popen[bytes], out: Output, deadline: float | None, stop: threading.Event
) -> Ended:
    """Forward output until the guard exits; or until the deadline or a stop."""
    grace_end = None
    while True:
        now = time.monotonic()
        if stop.is_set():
            return "stopped"
        if proc.poll() is not None:
            grace_end = grace_end or now + _GRACE_S
            if not out.open() or now >= grace_end:
                return "exited"
        elif deadline is not None and now >= deadline:
            return "timeout"
        wait_s = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - now))
        if out.open():
            out.read(wait_s)
        else:  # the pipes closed: the guard is exiting (or its code closed them)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(wait_s)


def _end(proc: subprocess.Popen[bytes], token: str, work: Path, ended: Ended | None) -> list[str]:
    """Make sure nothing of the run is left; return what had to be killed."""
    if ended == "exited":
        proc.wait()
        killed = (work / "killed").read_text().splitlines() if (work / "killed").exists() else []
        if proc.returncode < 0:  # the guard died by a signal: its orphans went to init
            killed += end_tree(None, token)
        return killed
    killed = end_tree(proc.pid, token)  # the guard is not reaped yet: its pid cannot be reused
    proc.kill()
    proc.wait()
    return killed


def _collect(work: Path, code: int, pid: int) -> Outcome:
    result = work / "result"
    if not result.exists():
        return Outcome("crashed", error=describe_exit(code), exitcode=code, pid=pid)
    try:
        said = load(result)
    except Exception as exc:
        text = f"the result could not be loaded in the kernel: {type(exc).__name__}: {exc}\n"
        return Outcome("error", error=text, error_type=type(exc).__name__, pid=pid)
    return as_outcome(said, pid, code)


def as_outcome(result: tuple[str, Any], pid: int | None, exitcode: int | None = None) -> Outcome:
    """Return a child's result, ``("ok", value)`` or ``("error", (type, message, traceback))``
    (the allocator's figures a fourth item after an out-of-memory error), as an outcome."""
    status, payload = result
    if status == "ok":
        return Outcome("ok", value=payload, exitcode=exitcode, pid=pid)
    kind, message, text, *oom = payload
    return Outcome("error", error=text, error_type=kind, exitcode=exitcode, pid=pid,
                   error_message=message, oom=oom[0] if oom else None)  # fmt: skip


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
    """Run ``fn(*args, **kwargs)`` in a fresh process; Ctrl-C kills it and propagates.

    Setting ``stop`` (from another thread) kills the process; the outcome is "interrupted".
    """
    stop = stop or threading.Event()
    work = workdir()
    start = time.monotonic()
    try:
        dump((fn, tuple(args), dict(kwargs or {})), work / "call")
        env, token = isolation_env(gpus), secrets.token_hex(16)
        proc = _launch(work, env, token)
        out = Output(proc, sink, env["TF_CPP_MIN_LOG_LEVEL"])
        deadline = None if timeout_s is None else start + timeout_s
        ended: Ended | None = None
        try:
            ended = _pump(proc, out, deadline, stop)
        finally:
            out.close()
            killed = _end(proc, token, work, ended)
            if ended is None:  # Ctrl-C (or an error) while it ran
                sink(
                    f"kerasmagic: interrupted; {describe_killed(killed) or 'nothing left'}\n", True
                )
        outcome = _outcome(ended, work, proc, killed, timeout_s, sink)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    outcome.elapsed_s = time.monotonic() - start
    return outcome


def _outcome(
    ended: Ended,
    work: Path,
    proc: subprocess.Popen[bytes],
    killed: list[str],
    timeout_s: Any,
    sink: Sink,
) -> Outcome:
    worker = int((work / "worker").read_text()) if (work / "worker").exists() else proc.pid
    what = describe_killed(killed)
    if ended == "stopped":
        outcome = Outcome("interrupted", error=f"stopped; {what or 'nothing left'}", pid=worker)
    elif ended == "timeout":
        text = f"timed out after {timeout_s:g} s; {what or 'the process had already ended'}"
        outcome = Outcome("timeout", error=text, pid=worker)
    else:
        outcome = _collect(work, proc.returncode, worker)
        if killed:
            sink(f"kerasmagic: {what} (left running by the isolated code)\n", True)
    outcome.killed = killed
    return outcome


def as_call(config: Any) -> Call:
    """Return how a config is passed: a dict as keyword arguments, anything else as one argument."""
    return ((), dict(config)) if isinstance(config, Mapping) else ((config,), {})


def as_trial(outcome: Outcome, index: int, config: Any) -> Trial:
    """Return ``outcome`` as the trial at ``index``."""
    values = {f.name: getattr(outcome, f.name) for f in fields(Outcome)}
    return Trial(**values, index=index, config=config)


class Progress:
    """Counts trials (done / running / failed) and prints one line when the counts change."""

    def __init__(self, total: int, enabled: bool, newline: bool) -> None:
        self.total, self.enabled, self.newline = total, enabled, newline
        self.running = self.done = self.failed = 0
        self._lock = threading.Lock()
        self._shown = ""
        self._start = time.monotonic()

    def started(self) -> None:
        with self._lock:
            self.running += 1

    def finished(self, ok: bool) -> None:
        with self._lock:
            self.running -= 1
            self.done += 1
            self.failed += not ok

    def show(self, final: bool = False) -> None:
        """Print ``sweep 3/8 done · 2 running · 1 failed`` if it changed (``\\r``-updated, or one
        line each when output streams)."""
        line = (
            f"sweep {self.done}/{self.total} done · {self.running} running · {self.failed} failed"
        )
        if not self.enabled or (line == self._shown and not final):
            return
        self._shown = line
        elapsed = f" · {time.monotonic() - self._start:.1f} s"
        end = "\n" if self.newline or final else ""
        sys.stdout.write(("" if self.newline else "\r") + line + elapsed + end)
        sys.stdout.flush()


def local_sweep(
    fn: Callable[..., Any],
    configs: Sequence[Any],
    *,
    workers: int,
    timeout_s: float | None,
    gpu_slots: Sequence[str | None],
    progress: Progress,
    stream: bool,
) -> list[Trial]:
    """Run every config in a fresh local process, ``workers`` at a time; Ctrl-C stops them all."""
    stop = threading.Event()
    free = list(gpu_slots)
    lock = threading.Lock()

    def one(index: int, config: Any) -> Trial:
        with lock:
            gpus = free.pop(0)
        parts: list[str] = []
        progress.started()
        try:
            args, kwargs = as_call(config)
            sink: Sink = to_std_streams if stream else lambda text, _: parts.append(text)
            outcome = run_local(
                fn, args, kwargs, timeout_s=timeout_s, gpus=gpus, sink=sink, stop=stop
            )
        except Exception as exc:  # e.g. the config cannot be pickled: this trial fails
            kind = type(exc).__name__
            outcome = Outcome("error", error=f"{kind}: {exc}\n", error_type=kind)
        finally:
            with lock:
                free.append(gpus)
        outcome.output = "".join(parts)
        progress.finished(outcome.ok)
        return as_trial(outcome, index, config)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kerasmagic-sweep") as pool:
        futures = [pool.submit(one, i, c) for i, c in enumerate(configs)]
        _watch(futures, progress, stop)
    return [_result(f, i, c) for i, (f, c) in enumerate(zip(futures, configs, strict=True))]


def _watch(futures: list[Future[Trial]], progress: Progress, stop: threading.Event) -> None:
    try:
        while wait(futures, timeout=0.2).not_done:
            progress.show()
    except KeyboardInterrupt:
        stop.set()
        for future in futures:
            future.cancel()
        print("\nkerasmagic: sweep interrupted; running trials were killed", file=sys.stderr)
    progress.show(final=True)


def _result(future: Future[Trial], index: int, config: Any) -> Trial:
    if future.cancelled():
        return Trial("interrupted", error="not started", index=index, config=config)
    return future.result()
