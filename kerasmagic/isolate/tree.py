"""Find and kill every process an isolated run started, wherever it went.

A run's processes are found two ways: as descendants of its guard process (which is a child
subreaper, so orphans, double forks and ``setsid`` escapes are re-parented to it while it lives)
and by the run's token in their initial environment (``/proc/PID/environ``), which catches what
was re-parented to init after the guard itself died. Each round stops the processes it finds
before killing them, so none can fork a new one between the two.
"""

from __future__ import annotations

import contextlib
import os
import time

import psutil

TOKEN_VAR = "KERASMAGIC_RUN_TOKEN"
_ROUNDS = 50


def _marked(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["environ"]):
        environ = proc.info.get("environ") or {}
        if environ.get(TOKEN_VAR) == token:
            found.append(proc)
    return found


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _targets(root: int | None, token: str | None) -> list[psutil.Process]:
    found: dict[int, psutil.Process] = {}
    if root is not None:
        with contextlib.suppress(psutil.Error):
            found.update((p.pid, p) for p in psutil.Process(root).children(recursive=True))
    if token is not None:
        found.update((p.pid, p) for p in _marked(token))
    for pid in (os.getpid(), root):
        found.pop(pid or 0, None)
    return [p for p in found.values() if _alive(p)]


def _label(proc: psutil.Process) -> str:
    try:
        return f"{proc.name()} (pid {proc.pid})"
    except psutil.Error:
        return f"pid {proc.pid}"


def end_tree(root: int | None, token: str | None) -> list[str]:
    """SIGKILL every live process under ``root`` or carrying ``token``; return them as text.

    ``root`` itself and this process are spared. Returns ``["sleep (pid 12)", ...]``.
    """
    killed: dict[int, str] = {}
    for _ in range(_ROUNDS):
        procs = _targets(root, token)
        if not procs:
            break
        for proc in procs:
            killed.setdefault(proc.pid, _label(proc))
            with contextlib.suppress(psutil.Error):
                proc.suspend()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        _wait_dead(procs, timeout_s=1.0)
    return list(killed.values())


def _wait_dead(procs: list[psutil.Process], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.01)


def describe_killed(killed: list[str]) -> str:
    """Return ``killed 2 processes: sleep (pid 12), python3 (pid 13)`` ('' for none)."""
    if not killed:
        return ""
    noun = "process" if len(killed) == 1 else "processes"
    return f"killed {len(killed)} {noun}: {', '.join(killed)}"
