"""Run one call in a fresh ``python -m kerasmagic.isolate._child`` process.

The child is the leader of its own process group, so a timeout or Ctrl-C kills the whole tree
with one ``killpg``; it also asks Linux to kill it when the kernel dies (``PR_SET_PDEATHSIG``).
Its stdout and stderr are read in raw chunks (Keras progress bars use ``\\r``) by two threads
and written by the calling thread, so output lands in the cell that started the run.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from kerasmagic.isolate import transport
from kerasmagic.isolate._child import isolation_env
from kerasmagic.isolate.outcome import Outcome, describe_exit

Sink = Callable[[str, bool], None]  # (text, is_stderr)
_POLL_S = 0.05


def to_std_streams(text: str, is_stderr: bool) -> None:
    """Write child output to this process's ``sys.stdout`` / ``sys.stderr`` at once."""
    stream = sys.stderr if is_stderr else sys.stdout
    stream.write(text)
    stream.flush()


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's whole process group and reap the child."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _launch(work: Path, gpus: str | None) -> subprocess.Popen[bytes]:
    path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    env = {**os.environ, **isolation_env(gpus), "PYTHONPATH": path}
    env["KERASMAGIC_PARENT_PID"] = str(os.getpid())
    return subprocess.Popen(
        [sys.executable, "-m", "kerasmagic.isolate._child", str(work)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )


def _read(pipe: IO[bytes], is_stderr: bool, out: queue.Queue[tuple[bool, bytes]]) -> None:
    fd = pipe.fileno()
    while chunk := os.read(fd, 65536):
        out.put((is_stderr, chunk))
    out.put((is_stderr, b""))


def _pump(
    proc: subprocess.Popen[bytes], sink: Sink, deadline: float | None, stop: threading.Event
) -> bool:
    """Forward output until the child's pipes close; False if the deadline or a stop came."""
    chunks: queue.Queue[tuple[bool, bytes]] = queue.Queue()
    for pipe, is_stderr in ((proc.stdout, False), (proc.stderr, True)):
        assert pipe is not None
        threading.Thread(target=_read, args=(pipe, is_stderr, chunks), daemon=True).start()
    decoders = {flag: codecs.getincrementaldecoder("utf-8")("replace") for flag in (False, True)}
    open_pipes = 2
    while open_pipes:
        try:
            is_stderr, chunk = chunks.get(timeout=_POLL_S)
        except queue.Empty:
            if stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
                return False
            if proc.poll() is not None:
                kill_tree(proc)  # the child is gone; end what still holds its pipes
            continue
        if not chunk:
            open_pipes -= 1
        elif text := decoders[is_stderr].decode(chunk):
            sink(text, is_stderr)
    return True


def _wait(proc: subprocess.Popen[bytes], deadline: float | None) -> bool:
    """Wait for the child to exit; return False if the deadline passed first."""
    try:
        proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


def _collect(work: Path, code: int, pid: int) -> Outcome:
    result = work / "result"
    if not result.exists():
        return Outcome("crashed", error=describe_exit(code), exitcode=code, pid=pid)
    try:
        status, payload = transport.load(result)
    except Exception as exc:
        text = f"the result could not be loaded in the kernel: {type(exc).__name__}: {exc}\n"
        return Outcome("error", error=text, error_type=type(exc).__name__, pid=pid)
    if status == "ok":
        return Outcome("ok", value=payload, exitcode=code, pid=pid)
    kind, _message, text = payload
    return Outcome("error", error=text, error_type=kind, exitcode=code, pid=pid)


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
    work = transport.workdir()
    start = time.monotonic()
    try:
        transport.dump((fn, tuple(args), dict(kwargs or {})), work / "call")
        proc = _launch(work, gpus)
        deadline = None if timeout_s is None else start + timeout_s
        try:
            finished = _pump(proc, sink, deadline, stop) and _wait(proc, deadline)
        finally:
            kill_tree(proc)  # also ends anything the child left behind in its group
        if stop.is_set():
            outcome = Outcome("interrupted", error="stopped", pid=proc.pid)
        elif not finished:
            text = f"timed out after {timeout_s:g} s; the process and its children were killed"
            outcome = Outcome("timeout", error=text, pid=proc.pid)
        else:
            outcome = _collect(work, proc.returncode, proc.pid)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    outcome.elapsed_s = time.monotonic() - start
    return outcome
