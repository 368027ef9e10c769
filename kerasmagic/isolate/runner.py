"""Run one call in a fresh process: ``python -c BOOT`` starts a guard, which forks the worker.

The guard (:mod:`kerasmagic.isolate._guard`) is a child subreaper, so everything the run starts
stays in its tree; every process of the run also carries the run's token in its environment.
A timeout, Ctrl-C or a sweep's stop kills all of them (:func:`tree.end_tree`) and says which;
after a normal exit the guard kills what the worker left running. Both pipes are read without
blocking by the calling thread, so output lands in the cell that started the run as it comes
(Keras progress bars use ``\\r``), and the deadline is checked whatever the output rate. The
run ends when the guard exits, even if some escaped process still holds the pipes.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from kerasmagic.isolate import transport
from kerasmagic.isolate._child import isolation_env
from kerasmagic.isolate._guard import BOOT
from kerasmagic.isolate.outcome import Outcome, describe_exit
from kerasmagic.isolate.streams import Output, Sink, to_std_streams
from kerasmagic.isolate.tree import TOKEN_VAR, describe_killed, end_tree

Ended = Literal["exited", "timeout", "stopped"]
_POLL_S = 0.05
_GRACE_S = 0.5  # after the guard exits, how long output may still arrive


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
        status, payload = transport.load(result)
    except Exception as exc:
        text = f"the result could not be loaded in the kernel: {type(exc).__name__}: {exc}\n"
        return Outcome("error", error=text, error_type=type(exc).__name__, pid=pid)
    if status == "ok":
        return Outcome("ok", value=payload, exitcode=code, pid=pid)
    kind, message, text, *oom = payload
    said = oom[0] if oom else None  # the allocator's figures after an out-of-memory error
    outcome = Outcome("error", error=text, error_type=kind, exitcode=code, pid=pid, oom=said)
    outcome.error_message = message
    return outcome


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
