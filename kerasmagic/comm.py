"""The kernel side of the JupyterLab sidebar: a ``kerasmagic`` comm target (docs/protocol.md).

The frontend opens a comm and asks for a snapshot, the history or a cleanup; the kernel pushes
the live monitor's samples and cell records. Every request is checked against a closed list of
message types: a malformed or unknown one gets an error reply and changes nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import comm as comm_pkg

from kerasmagic._version import __version__
from kerasmagic.cleanup import reset
from kerasmagic.live import LiveMonitor, get_monitor
from kerasmagic.snapshot import MemorySnapshot, take_snapshot

TARGET = "kerasmagic"
PROTOCOL = 1
REQUESTS = ("snapshot", "history", "free_memory")
FIELDS = frozenset({"protocol", "type", "id"})
MAX_ID_CHARS = 64
HISTORY_CELLS = 30  # cells sent with "state" and "history"
MIN_PUSH_INTERVAL_S = 0.4  # at most ~2 samples a second on the wire


def message(kind: str, **fields: Any) -> dict[str, Any]:
    """Return a kernel-to-frontend message of type ``kind``."""
    return {"protocol": PROTOCOL, "type": kind, **fields}


def check(data: Any, allowed: tuple[str, ...]) -> str | None:
    """Return why ``data`` is not a valid request of an ``allowed`` type, or None if it is."""
    if not isinstance(data, dict):
        return "a request must be a JSON object"
    extra = sorted(set(data) - FIELDS)
    if extra:
        return f"unknown fields {extra}; a request has only {sorted(FIELDS)}"
    version = data.get("protocol")
    if type(version) is not int or version != PROTOCOL:
        return f"unsupported protocol {version!r}; this kernel speaks protocol {PROTOCOL}"
    if data.get("type") not in allowed:
        return f"unknown request type {data.get('type')!r}; expected one of {list(allowed)}"
    if allowed != ("hello",) and _request_id(data) is None:
        return f"'id' must be a non-empty string of at most {MAX_ID_CHARS} characters"
    return None


def _request_id(data: Any) -> str | None:
    rid = data.get("id") if isinstance(data, dict) else None
    return rid if isinstance(rid, str) and 0 < len(rid) <= MAX_ID_CHARS else None


class Sidebar:
    """The open sidebar comms of one shell: answers their requests, pushes monitor updates."""

    def __init__(self, shell: Any, magics: Any, monitor: LiveMonitor | None) -> None:
        self._shell = shell
        self._magics = magics
        self._monitor = monitor
        self._comms: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._last_push_s = 0.0
        self._unsubscribe: Callable[[], None] | None = None
        if monitor is not None:
            self._unsubscribe = monitor.subscribe(self._on_monitor)

    # -- comm plumbing -----------------------------------------------------------------------
    def open(self, comm: Any, msg: dict[str, Any]) -> None:
        """Comm target: accept a frontend's ``hello`` with the full state, refuse anything else."""
        problem = check(msg["content"].get("data"), ("hello",))
        if problem is not None:
            comm.send(message("error", id=None, error=problem))
            comm.close()
            return
        with self._lock:
            self._comms[comm.comm_id] = comm
        comm.on_msg(lambda m: self._on_request(comm, m))
        comm.on_close(lambda _m: self._forget(comm.comm_id))
        comm.send(self._state())

    def _forget(self, comm_id: str) -> None:
        with self._lock:
            self._comms.pop(comm_id, None)

    def close(self) -> None:
        """Stop pushing and close every comm (the frontends then show "not loaded")."""
        if self._unsubscribe is not None:
            self._unsubscribe()
        with self._lock:
            comms, self._comms = list(self._comms.values()), {}
        for comm in comms:
            comm.close()

    def broadcast(self, data: dict[str, Any]) -> None:
        """Send ``data`` to every open sidebar comm."""
        with self._lock:
            comms = list(self._comms.values())
        for comm in comms:
            comm.send(data)

    # -- requests (shell thread, or a subshell thread with Lab's comms-over-subshells) ------
    def _on_request(self, comm: Any, msg: dict[str, Any]) -> None:
        data = msg["content"].get("data")
        problem = check(data, REQUESTS)
        if problem is not None:
            comm.send(message("error", id=_request_id(data), error=problem))
            return
        kind, rid = data["type"], data["id"]
        if kind == "snapshot":
            comm.send(message("reply", id=rid, request=kind, snapshot=self._snapshot().to_dict()))
        elif kind == "history":
            comm.send(message("reply", id=rid, request=kind, **self._history()))
        else:
            self._on_main_thread(lambda: comm.send(self._free(rid)))

    def _on_main_thread(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` now on the main thread, else queue it there (after the running cell)."""
        loop = getattr(getattr(self._shell, "kernel", None), "io_loop", None)
        if threading.current_thread() is threading.main_thread() or loop is None:
            fn()
        else:
            loop.add_callback(fn)

    def _free(self, rid: str) -> dict[str, Any]:
        """Run the cleanup ``%%fresh_model`` runs before a cell, with no names to rebind."""
        report = reset(
            self._shell.user_ns,
            shell=self._shell,
            patch_stack_traces=bool(getattr(self._magics, "patch_stack_traces", True)),
        )
        return message(
            "reply",
            id=rid,
            request="free_memory",
            report=report.to_dict(),
            summary=report.summary(),
            snapshot=self._snapshot().to_dict(),
        )

    def _snapshot(self) -> MemorySnapshot:
        """Return a fresh snapshot on the main thread; elsewhere the monitor's latest."""
        on_main = threading.current_thread() is threading.main_thread()
        latest = None if self._monitor is None else self._monitor.latest()
        if on_main or latest is None:
            return take_snapshot(self._shell.user_ns if on_main else None, functions=on_main)
        return latest

    def _history(self) -> dict[str, Any]:
        if self._monitor is None:
            return {"history": [], "verdict": None}
        cells = self._monitor.history()[-HISTORY_CELLS:]
        return {
            "history": [c.to_dict() for c in cells],
            "verdict": self._monitor.verdict().to_dict(),
        }

    def _state(self) -> dict[str, Any]:
        snap = self._snapshot()
        return message(
            "state",
            kerasmagic_version=__version__,
            pid=snap.pid,
            live=self._monitor is not None,
            snapshot=snap.to_dict(),
            **self._history(),
        )

    # -- pushes (sampler thread for samples, main thread for cells) --------------------------
    def _on_monitor(self, kind: str, payload: Any) -> None:
        if not self._comms:  # no sidebar open: serialise nothing (this runs after every cell)
            return
        if kind == "sample":
            now = time.monotonic()
            if now - self._last_push_s < MIN_PUSH_INTERVAL_S:
                return
            self._last_push_s = now
            self.broadcast(message("sample", snapshot=payload.to_dict()))
        elif kind == "cell" and self._monitor is not None:
            verdict = self._monitor.verdict().to_dict()
            self.broadcast(message("cell", cell=payload.to_dict(), verdict=verdict))


_sidebars: dict[int, Sidebar] = {}


def load(shell: Any, magics: Any) -> None:
    """Register the ``kerasmagic`` comm target for ``shell`` (after ``kerasmagic.live``)."""
    if id(shell) in _sidebars:
        return
    sidebar = Sidebar(shell, magics, get_monitor(shell))
    _sidebars[id(shell)] = sidebar
    comm_pkg.get_comm_manager().register_target(TARGET, sidebar.open)


def unload(shell: Any) -> None:
    """Unregister the target and close every sidebar comm of ``shell``."""
    sidebar = _sidebars.pop(id(shell), None)
    if sidebar is None:
        return
    manager = comm_pkg.get_comm_manager()
    if manager.targets.get(TARGET) == sidebar.open:
        manager.unregister_target(TARGET, sidebar.open)
    sidebar.close()
