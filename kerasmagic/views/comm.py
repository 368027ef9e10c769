"""The kernel side of the JupyterLab sidebar: a ``kerasmagic`` comm target (docs/protocol.md).

The frontend opens a comm and asks for a snapshot, the history, a cleanup or a scan of what
holds memory; the kernel pushes the live monitor's samples and cell records. Requests are
validated by ``protocol``; "Free memory" and "Scan" run on the main thread between cells;
everything is sent through ``send`` so it stays on the comm's subshell.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kerasmagic._version import __version__
from kerasmagic.cleanup import CleanupReport, clean
from kerasmagic.cleanup.holders import DeepScan, deep_scan
from kerasmagic.compat import hosted, sidebar_installed
from kerasmagic.compat.probes import find_comm_manager as comm_manager
from kerasmagic.compat.registry import works
from kerasmagic.live import CellRecord, LiveMonitor
from kerasmagic.shellstate import ShellState
from kerasmagic.snapshot import take_snapshot
from kerasmagic.views.protocol import check, failure, message, request_id

log = logging.getLogger(__name__)
TARGET = "kerasmagic"
HISTORY_CELLS = 30  # cells sent with "state" and "history"
MIN_PUSH_INTERVAL_S = 0.4  # at most ~2 samples a second on the wire
GATHER_S = 0.05  # a kernel's run waits this long for requests sent with the first one
Cleanup = Callable[..., CleanupReport]
Scan = Callable[[Mapping[str, Any]], DeepScan]


def open_comm(shell: Any, target: str, data: dict[str, Any]) -> Any | None:
    """Open a comm from the kernel to the frontend's ``target``, with ``data``; None without a
    kernel. Through the ``comm`` package where the kernel handed it its manager, else with
    ipykernel 6.17's own class (on Kaggle the package's would reach no frontend)."""
    kernel = getattr(shell, "kernel", None)
    if (manager := getattr(kernel, "comm_manager", None)) is None:
        return None
    package: Any = importlib.import_module("comm") if importlib.util.find_spec("comm") else None
    if package is not None and package.get_comm_manager() is manager:
        return package.create_comm(target_name=target, data=data)
    from ipykernel.comm import Comm

    return Comm(target_name=target, data=data, kernel=kernel)  # type: ignore[no-untyped-call]


def sent_by_jupyterlab(kernel: Any) -> bool:
    """Return whether the request the kernel is handling came from a JupyterLab-family frontend
    (JupyterLab, Notebook 7): they send the cell's ``cellId`` with it (Classic Notebook and
    Colab do not, and log an error for a comm target they do not know)."""
    try:
        parent = kernel.get_parent("shell")
    except Exception:  # an ipykernel without per-channel parents
        return False
    metadata = parent.get("metadata") if isinstance(parent, dict) else None
    return isinstance(metadata, dict) and isinstance(metadata.get("cellId"), str)


def send(comm: Any, data: dict[str, Any], home: dict[str, Any] | None, kernel: Any) -> None:
    """Send ``data`` on ``comm`` as a reply to ``home`` (the message the comm last received).

    JupyterLab sends a comm's messages to a kernel subshell, so they are handled while the main
    shell runs a cell. ipykernel 7 (``BaseComm.publish_msg``) routes every later message of that
    comm to the subshell of the *parent* of the comm's latest outgoing message: a push from the
    sampler thread or from ``post_run_cell`` has the main shell's request as parent and would
    send the next requests to the main shell, behind the running cell. Publishing with the
    comm's own latest request as parent keeps the routing where the frontend put it.
    """
    ours = home is not None and kernel is not None and works("ipykernel.shell_parent")
    parent = getattr(kernel, "_shell_parent", None) if ours else None  # ipykernel >= 7
    if not isinstance(parent, contextvars.ContextVar):
        comm.send(data)  # (ipykernel 6, or moved: said once, by compat): the comm's own route
        return
    context = contextvars.copy_context()  # the caller's parent is left untouched
    context.run(parent.set, home)
    context.run(comm.send, data)


class Sidebar:
    """The open sidebar comms of one shell: answers their requests, pushes monitor updates."""

    def __init__(
        self,
        shell: Any,
        magics: Any,
        monitor: LiveMonitor | None,
        cleanup: Cleanup = clean,
        scan: Scan = deep_scan,
    ) -> None:
        self._shell, self._magics, self._monitor = shell, magics, monitor
        self._cleanup, self._scan = cleanup, scan
        self._comms: dict[str, Any] = {}
        self._homes: dict[str, dict[str, Any]] = {}  # comm id -> the last message it received
        self._waiters: dict[str, list[tuple[Any, str]]] = {}  # queued run -> (comm, id) asking
        # _freed_since: a cleanup ran after the last recorded cell
        self._lock, self._last_push_s, self._freed_since = threading.Lock(), 0.0, False
        self._unsubscribe = None if monitor is None else monitor.subscribe(self._on_monitor)

    # -- comm plumbing -----------------------------------------------------------------------
    def open(self, comm: Any, msg: dict[str, Any]) -> None:
        """Comm target: accept a frontend's ``hello`` with the full state, refuse anything else.
        Nothing raised here reaches the comm manager (whose traceback the kernel would print
        into the running cell): a failure is an error reply and a close."""
        try:
            problem = check(msg["content"].get("data"), ("hello",))
        except Exception as exc:
            problem = failure("kerasmagic could not read the hello", exc)
        if problem is not None:
            self._refuse(comm, problem)
            return
        try:
            self._accept(comm, msg)
        except Exception as exc:
            self._forget(comm.comm_id)
            self._refuse(comm, failure("kerasmagic could not open the sidebar", exc))

    def _refuse(self, comm: Any, problem: str) -> None:
        with contextlib.suppress(Exception):  # a comm that cannot send is closed all the same
            comm.send(message("error", id=None, error=problem))
        with contextlib.suppress(Exception):
            comm.close()

    def _accept(self, comm: Any, msg: dict[str, Any] | None) -> None:
        """Keep a comm and answer its requests; one the frontend opened (``msg``: its hello)
        gets the full state, one the kernel opened carried it already."""
        with self._lock:
            self._comms[comm.comm_id] = comm
            if msg is not None:
                self._homes[comm.comm_id] = msg
        comm.on_msg(lambda m: self._on_request(comm, m))
        comm.on_close(lambda _m: self._forget(comm.comm_id))
        if msg is not None:
            self._send(comm, self._state())

    def _send(self, comm: Any, data: dict[str, Any]) -> None:
        send(comm, data, self._homes.get(comm.comm_id), getattr(self._shell, "kernel", None))

    def _forget(self, comm_id: str) -> None:
        with self._lock:
            self._comms.pop(comm_id, None)
            self._homes.pop(comm_id, None)

    def announce(self) -> None:
        """Open a comm to the frontend's sidebar with the full state: its messages come on
        iopub, so a Run All's queued cells do not hold them back. Only from a JupyterLab-family
        frontend, where the sidebar is installed, off Colab and Kaggle: others log an unknown
        target."""
        kernel = getattr(self._shell, "kernel", None)
        if kernel is None or hosted() or not sent_by_jupyterlab(kernel) or not sidebar_installed():
            return
        try:
            if (comm := open_comm(self._shell, TARGET, self._state())) is not None:
                self._accept(comm, None)
        except Exception:  # a frontend that cannot take it still opens its own
            log.debug("kerasmagic: announcing the sidebar failed", exc_info=True)

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
            self._send(comm, data)

    # -- requests (shell thread, or a subshell thread with Lab's comms-over-subshells) ------
    def _on_request(self, comm: Any, msg: dict[str, Any]) -> None:
        """Answer one request; whatever it holds or raises, the answer is a reply or an error
        (never a traceback, which the kernel would print into the running cell's output)."""
        self._homes[comm.comm_id] = msg
        data = None
        try:
            data = msg["content"].get("data")
            if (problem := check(data)) is not None:
                self._send(comm, message("error", id=request_id(data), error=problem))
                return
            kind, rid = data["type"], data["id"]
            if kind == "scan":
                self._queue("scan", comm, rid)
            elif kind == "free_memory":
                self._request_free(comm, rid)
            else:
                got = self._history() if kind == "history" else {"snapshot": self._snapshot()}
                self._send(comm, message("reply", id=rid, request=kind, **got))
        except Exception as exc:
            error = failure("kerasmagic could not answer", exc)
            with contextlib.suppress(Exception):
                self._send(comm, message("error", id=request_id(data), error=error))

    def _request_free(self, comm: Any, rid: str) -> None:
        """Queue a cleanup (a test seam: tests/browser/test_sidebar.py makes a kernel that
        never answers)."""
        self._queue("free_memory", comm, rid)

    def _queue(self, name: str, comm: Any, rid: str) -> None:
        """Run ``name`` on the kernel's main loop, after the running cell: "Free memory" and
        "Scan" walk the garbage collector and the user's namespace, never on a subshell thread.
        A request while one is queued or running joins it; each gets an answer with its id.

        The run starts ``GATHER_S`` after the first request: requests sent together reach the
        kernel one by one, and over the main shell each was read only after the run before it
        ended (50 requests ran 50 cleanups, 9.8 s). That short wait lets them all join.
        """
        if not works("ipykernel.io_loop", self._shell):  # moved: said once, by compat
            self._send(comm, message("error", id=rid, error=f"{name} is off here"))
            return
        with self._lock:
            waiters = self._waiters.setdefault(name, [])
            waiters.append((comm, rid))
            if len(waiters) > 1:
                return
        loop = getattr(getattr(self._shell, "kernel", None), "io_loop", None)
        run = functools.partial(self._run, name)
        if loop is None:  # an in-process shell: now
            run()
        else:  # add_callback: the thread-safe one, from any thread
            loop.add_callback(loop.call_later, GATHER_S, run)

    def _run(self, name: str) -> None:
        fields: dict[str, Any] = {"error": f"{name} was interrupted"}
        try:
            scan = name == "scan"  # what holds each model, what frees it; the largest data
            work = self._scan(self._shell.user_ns).to_dict() if scan else self._free_fields()
            fields = {"request": name, **work}
        except Exception as exc:
            log.exception("kerasmagic: %s failed", name)
            fields = {"error": failure(f"{name} failed", exc)}
        finally:  # an interrupt (KeyboardInterrupt) still answers, then goes on up
            with self._lock:
                waiters = self._waiters.pop(name, [])
            kind = "error" if "error" in fields else "reply"
            for comm, rid in waiters:
                self._send(comm, message(kind, id=rid, **fields))

    def _free_fields(self) -> dict[str, Any]:
        """Run the cleanup ``%%fresh_model`` runs before a cell, then push a full snapshot."""
        namespace = self._shell.user_ns
        patch = bool(getattr(self._magics, "patch_stack_traces", True))
        before = take_snapshot(namespace)
        report = self._cleanup(self._shell, namespace, patch_stack_traces=patch)
        self._freed_since, self._last_push_s = True, float("-inf")  # the refresh: pushed at once
        after = take_snapshot(namespace) if self._monitor is None else self._monitor.refresh()
        fields: dict[str, Any] = {"report": report.to_dict(), "summary": report.summary()}
        fields.update(before=before.to_dict(), snapshot=after.to_dict(), verdict=self._verdict())
        return fields

    def _snapshot(self) -> dict[str, Any]:
        """Return a fresh snapshot on the main thread; elsewhere the monitor's latest."""
        on_main = threading.current_thread() is threading.main_thread()
        latest = None if self._monitor is None else self._monitor.latest()
        if on_main or latest is None:
            latest = take_snapshot(self._shell.user_ns if on_main else None, light=not on_main)
        return latest.to_dict()

    def _verdict(self) -> dict[str, Any] | None:
        """Return the leak verdict, saying whether memory was freed since it was reached."""
        monitor, freed = self._monitor, self._freed_since
        return None if monitor is None else {**monitor.verdict().to_dict(), "freed_since": freed}

    def _history(self) -> dict[str, Any]:
        cells = [] if self._monitor is None else self._monitor.history()[-HISTORY_CELLS:]
        records = [{**c.to_dict(), "warning": self._warning(c)} for c in cells]
        return {"history": records, "verdict": self._verdict()}

    def _state(self) -> dict[str, Any]:
        snap, live = self._snapshot(), self._monitor is not None
        state = {"kerasmagic_version": __version__, "pid": snap["pid"], "live": live}
        return message("state", **state, snapshot=snap, **self._history())

    # -- pushes (sampler thread for samples, main thread for cells and refreshes) -------------
    def _on_monitor(self, kind: str, payload: Any) -> None:
        if kind == "cell":
            self._freed_since = False
        now = time.monotonic()
        if not self._comms:  # no sidebar open: serialise nothing (this runs after every cell)
            return
        if kind == "sample" and now - self._last_push_s >= MIN_PUSH_INTERVAL_S:
            self._last_push_s = now
            self.broadcast(message("sample", snapshot=payload.to_dict(), verdict=self._verdict()))
        elif kind == "cell":
            cell, warning = payload.to_dict(), self._warning(payload)
            self.broadcast(message("cell", cell=cell, verdict=self._verdict(), warning=warning))

    def _warning(self, record: CellRecord) -> str | None:
        """Return the leak detector's message when it flags this very run of a cell, else None:
        only the cell's own runs up to this one decide its badge (the verdict may name another
        cell), so a history sent after Run All marks what the live pushes would have."""
        if self._monitor is None or not record.source_hash:
            return None
        detector, runs = self._monitor.detector, self._monitor.runs(record.source_hash)
        upto = next((i + 1 for i, run in enumerate(runs) if run is record), 0)  # 0: not there
        mine = detector.judge_runs(runs[max(0, upto - detector.min_runs) : upto])
        return mine.message if mine.growing else None


def load(state: ShellState) -> Sidebar:
    """Register the ``kerasmagic`` comm target; the sidebar shows the ``live`` part's monitor.
    A shell with no comm manager gets a sidebar no frontend can open: nothing to register."""
    sidebar = Sidebar(state.shell, state.magics, state.part("live"))
    if (manager := _manager(state.shell)) is not None:
        manager.register_target(TARGET, sidebar.open)
        sidebar.announce()
    return sidebar


def unload(state: ShellState, sidebar: Sidebar) -> None:
    """Unregister the target and close every sidebar comm of the shell."""
    manager = _manager(state.shell)
    if manager is not None and manager.targets.get(TARGET) == sidebar.open:
        manager.unregister_target(TARGET, sidebar.open)
    sidebar.close()


def _manager(shell: Any) -> Any | None:
    """Return the shell's comm manager, or None (none there, or it moved: said by compat)."""
    return comm_manager(shell) if works("ipykernel.comm_manager", shell) else None
