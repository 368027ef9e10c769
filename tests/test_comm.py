"""The sidebar protocol, kernel side, through the real ``comm`` package's manager and comm class.

``comm.create_comm``/``comm.get_comm_manager`` are the seams the ``comm`` package exists for
(ipykernel replaces them the same way); here they give a fresh manager and a comm that records
what it would publish on iopub instead of needing a kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import comm
import pytest
from comm.base_comm import BaseComm, CommManager
from conftest import run
from IPython.core.interactiveshell import InteractiveShell
from tornado.ioloop import IOLoop

from kerasmagic.cleanup import CleanupReport, clean
from kerasmagic.cleanup.holders import DeepScan, deep_scan
from kerasmagic.live import get_monitor
from kerasmagic.snapshot import SCHEMA_VERSION, MemorySnapshot
from kerasmagic.views.comm import GATHER_S, MIN_PUSH_INTERVAL_S, TARGET, Sidebar
from kerasmagic.views.protocol import MAX_ID_CHARS, PROTOCOL


class RecordingComm(BaseComm):
    """A real ``BaseComm`` whose iopub side is a list."""

    def __init__(self, **kwargs: Any) -> None:
        self.published: list[tuple[str, Any]] = []
        super().__init__(**kwargs)

    def publish_msg(self, msg_type: str, data: Any = None, **keys: Any) -> None:
        self.published.append((msg_type, json.loads(json.dumps(data))))  # as on the wire

    def sent(self, *types: str) -> list[dict[str, Any]]:
        """Return the comm_msg payloads of the given message types, oldest first."""
        return [d for kind, d in self.published if kind == "comm_msg" and d["type"] in types]


class Manager(CommManager):
    """The ``comm`` package's manager, remembering every comm it created."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[RecordingComm] = []

    def create(self, **kwargs: Any) -> RecordingComm:
        self.created.append(RecordingComm(**kwargs))
        return self.created[-1]


@pytest.fixture
def manager(monkeypatch: pytest.MonkeyPatch) -> Manager:
    fresh = Manager()
    monkeypatch.setattr(comm, "get_comm_manager", lambda: fresh)
    monkeypatch.setattr(comm, "create_comm", fresh.create)
    return fresh


@pytest.fixture
def shell(manager: Manager, ip: InteractiveShell) -> InteractiveShell:
    """``ip`` loaded after the comm seams are in place: request ``sidebar`` before ``kip``."""
    return ip


def open_comm(manager: Manager, data: Any, comm_id: str = "c1") -> RecordingComm:
    """Open a comm as a frontend would; return the kernel's end (closed if refused)."""
    content = {"comm_id": comm_id, "target_name": TARGET, "data": data}
    manager.comm_open(None, "", {"content": content})  # type: ignore[arg-type]
    return manager.created[-1]


def send(manager: Manager, data: Any, comm_id: str = "c1") -> None:
    manager.comm_msg(None, "", {"content": {"comm_id": comm_id, "data": data}})  # type: ignore[arg-type]


HELLO = {"protocol": PROTOCOL, "type": "hello"}


@pytest.fixture
def sidebar(shell: InteractiveShell, manager: Manager) -> Iterator[RecordingComm]:
    yield open_comm(manager, HELLO)


def test_hello_gets_the_state_of_this_kernel(sidebar: RecordingComm) -> None:
    (state,) = sidebar.sent("state")
    assert state["protocol"] == PROTOCOL
    assert state["pid"] == os.getpid()
    assert state["live"] is True
    assert state["snapshot"]["version"] == SCHEMA_VERSION
    assert MemorySnapshot.from_dict(state["snapshot"]).pid == os.getpid()
    assert state["verdict"]["growing"] is False


def test_snapshot_and_history_requests_echo_the_id(
    shell: InteractiveShell, manager: Manager, sidebar: RecordingComm
) -> None:
    run(shell, "blob = b'\\x01' * (30 * 2**20)")  # touched pages, so RSS grows
    cells = sidebar.sent("cell")
    assert cells, "the post-cell record must be pushed to open sidebars"
    monitor = get_monitor(shell)
    assert monitor is not None
    pushed = cells[-1]["cell"]
    assert pushed == json.loads(json.dumps(monitor.history()[-1].to_dict()))
    assert pushed["end"]["pid"] == os.getpid()
    send(manager, {"protocol": PROTOCOL, "type": "snapshot", "id": "s-1"})
    send(manager, {"protocol": PROTOCOL, "type": "history", "id": "h-1"})
    snap, hist = sidebar.sent("reply")
    assert (snap["id"], snap["request"]) == ("s-1", "snapshot")
    assert snap["snapshot"]["pid"] == os.getpid()
    assert (hist["id"], hist["request"]) == ("h-1", "history")
    assert hist["history"][-1]["execution_count"] == cells[-1]["cell"]["execution_count"]


def test_samples_are_pushed_and_throttled(shell: InteractiveShell, sidebar: RecordingComm) -> None:
    monitor = get_monitor(shell)
    assert monitor is not None
    run(shell, "x = 1")  # the monitor samples on top of its last cell snapshot
    monitor.sampler.stop()  # its own pushes would race these (CI saw one just before `before`)
    try:
        time.sleep(MIN_PUSH_INTERVAL_S)
        before = len(sidebar.sent("sample"))
        monitor.sampler.sample_once()
        monitor.sampler.sample_once()  # within MIN_PUSH_INTERVAL_S of the first: dropped
        samples = sidebar.sent("sample")
    finally:
        monitor.sampler.start()
    assert len(samples) - before == 1
    assert samples[-1]["snapshot"]["pid"] == os.getpid()


INVALID = [
    pytest.param("free_memory", None, id="not-an-object"),
    pytest.param({"protocol": PROTOCOL, "type": "exec", "id": "x"}, "x", id="unknown-type"),
    pytest.param({"protocol": PROTOCOL, "type": "hello", "id": "x"}, "x", id="hello-after-open"),
    pytest.param(
        {"protocol": PROTOCOL, "type": "free_memory", "id": "x", "code": "import os"},
        "x",
        id="extra",
    ),
    pytest.param(
        {"protocol": PROTOCOL + 1, "type": "free_memory", "id": "x"}, "x", id="future-protocol"
    ),
    pytest.param({"protocol": True, "type": "free_memory", "id": "x"}, "x", id="bool-protocol"),
    pytest.param({"protocol": PROTOCOL, "type": "free_memory"}, None, id="no-id"),
    pytest.param(
        {"protocol": PROTOCOL, "type": "scan", "id": "x", "limit": 100}, "x", id="scan-extra"
    ),
    pytest.param({"protocol": PROTOCOL, "type": "scan", "id": ""}, None, id="scan-empty-id"),
    pytest.param({"protocol": PROTOCOL, "type": "snapshot", "id": 7}, None, id="int-id"),
    pytest.param(
        {"protocol": PROTOCOL, "type": "snapshot", "id": "x" * (MAX_ID_CHARS + 1)},
        None,
        id="long-id",
    ),
]


@pytest.mark.parametrize(("data", "echoed_id"), INVALID)
def test_invalid_requests_get_an_error_and_change_nothing(
    manager: Manager,
    sidebar: RecordingComm,
    kip: InteractiveShell,
    data: Any,
    echoed_id: str | None,
) -> None:
    run(kip, "kept = build()\nbuild()")  # Out[] holds a stale model a cleanup would drop
    names = set(kip.user_ns)
    out_cache = dict(kip.user_ns["Out"])
    send(manager, data)
    (error,) = sidebar.sent("error", "reply")
    assert error["type"] == "error"
    assert error["id"] == echoed_id
    assert error["error"]
    assert set(kip.user_ns) == names
    assert dict(kip.user_ns["Out"]) == out_cache
    assert "c1" in manager.comms  # the comm stays open


def test_free_memory_drops_hidden_holders_and_keeps_named_models(
    manager: Manager, sidebar: RecordingComm, kip: InteractiveShell
) -> None:
    run(kip, "kept = build()")
    run(kip, "build()")  # only Out[] holds this one
    send(manager, {"protocol": PROTOCOL, "type": "free_memory", "id": "f-1"})
    (reply,) = sidebar.sent("reply")
    assert (reply["id"], reply["request"]) == ("f-1", "free_memory")
    report = reply["report"]
    assert any(d.startswith("Out[") for d in report["dropped"])
    assert "kept" in report["kept"]
    assert not any("kept" in d for d in report["dropped"])
    assert kip.user_ns["kept"] is not None
    assert reply["summary"].startswith("freed ")
    assert reply["snapshot"]["pid"] == os.getpid()


def test_free_memory_from_another_thread_waits_for_the_main_thread(
    shell: InteractiveShell, manager: Manager, sidebar: RecordingComm
) -> None:
    loop = IOLoop(make_current=False)
    shell.kernel = SimpleNamespace(io_loop=loop)  # what ipykernel's shell has
    try:
        worker = threading.Thread(
            target=send, args=(manager, {"protocol": PROTOCOL, "type": "free_memory", "id": "t"})
        )
        worker.start()
        worker.join()
        assert sidebar.sent("reply") == []  # queued, not run on the comm's thread
        loop.run_sync(lambda: asyncio.sleep(GATHER_S + 0.1))
        (reply,) = sidebar.sent("reply")
        assert reply["id"] == "t"
    finally:
        del shell.kernel
        loop.close()


def test_bad_hello_is_refused_and_closed(shell: InteractiveShell, manager: Manager) -> None:
    refused = open_comm(manager, {"protocol": 99, "type": "hello"}, comm_id="bad")
    (error,) = refused.sent("error")
    assert "protocol 99" in error["error"]
    assert refused.published[-1][0] == "comm_close"
    assert "bad" not in manager.comms


def test_without_kerasmagic_the_open_is_refused(manager: Manager) -> None:
    """The frontend reads an immediate comm_close as "kerasmagic is not loaded"."""
    refused = open_comm(manager, HELLO, comm_id="nobody")
    assert [kind for kind, _ in refused.published] == ["comm_close"]
    assert "nobody" not in manager.comms


def test_unload_closes_open_sidebars(
    shell: InteractiveShell, manager: Manager, sidebar: RecordingComm
) -> None:
    shell.run_line_magic("unload_ext", "kerasmagic")
    assert sidebar.published[-1][0] == "comm_close"
    assert TARGET not in manager.targets
    shell.run_line_magic("load_ext", "kerasmagic")  # the fixture unloads it again
    assert TARGET in manager.targets


BIG = "x" * 100_000
OVERSIZED = [
    pytest.param({"protocol": PROTOCOL, "type": BIG, "id": "x"}, id="type"),
    pytest.param({"protocol": BIG, "type": "snapshot", "id": "x"}, id="protocol"),
    pytest.param({"protocol": PROTOCOL, "type": "snapshot", "id": "x", BIG: 1}, id="field-name"),
    pytest.param(
        {"protocol": PROTOCOL, "type": "snapshot", "id": "x", **{f"f{i}": 1 for i in range(9999)}},
        id="many-fields",
    ),
]


@pytest.mark.parametrize("data", OVERSIZED)
def test_errors_never_echo_more_than_a_few_hundred_characters(
    manager: Manager, sidebar: RecordingComm, data: dict[str, Any]
) -> None:
    send(manager, data)
    (error,) = sidebar.sent("error")
    assert 0 < len(error["error"]) <= 500, len(error["error"])


@pytest.mark.parametrize(
    "hello",
    [
        pytest.param({"protocol": PROTOCOL, "type": "hello", "id": "h"}, id="id"),
        pytest.param({"protocol": PROTOCOL, "type": "hello", "code": "import os"}, id="code"),
    ],
)
def test_hello_with_unknown_fields_is_refused(
    shell: InteractiveShell, manager: Manager, hello: dict[str, Any]
) -> None:
    refused = open_comm(manager, hello, comm_id="bad")
    (error,) = refused.sent("error")
    assert "unknown fields" in error["error"]
    assert refused.published[-1][0] == "comm_close"
    assert "bad" not in manager.comms


def test_a_failing_cleanup_gets_an_error_reply(shell: InteractiveShell, manager: Manager) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("registry is gone " + BIG)

    sidebar = Sidebar(shell, None, get_monitor(shell), cleanup=broken)
    manager.register_target("kerasmagic-test", sidebar.open)
    content = {"comm_id": "f", "target_name": "kerasmagic-test", "data": HELLO}
    manager.comm_open(None, "", {"content": content})  # type: ignore[arg-type]
    opened = manager.created[-1]
    try:
        send(manager, {"protocol": PROTOCOL, "type": "free_memory", "id": "f-1"}, comm_id="f")
        (error,) = opened.sent("error", "reply")
        assert error["type"] == "error" and error["id"] == "f-1"
        assert "RuntimeError: registry is gone" in error["error"]
        assert len(error["error"]) <= 500
        send(manager, {"protocol": PROTOCOL, "type": "free_memory", "id": "f-2"}, comm_id="f")
        assert [e["id"] for e in opened.sent("error")] == ["f-1", "f-2"]  # not stuck "freeing"
    finally:
        sidebar.close()


def test_after_a_free_the_pushed_figures_are_fresh_and_the_verdict_says_freed(
    manager: Manager, sidebar: RecordingComm, kip: InteractiveShell
) -> None:
    run(kip, "kept = build()")
    run(kip, "build()")  # only Out[] holds this one
    assert sidebar.sent("cell")[-1]["cell"]["end"]["keras"]["live_models"] == 2
    assert sidebar.sent("cell")[-1]["verdict"]["freed_since"] is False
    send(manager, {"protocol": PROTOCOL, "type": "free_memory", "id": "f-1"})
    (reply,) = sidebar.sent("reply")
    assert reply["snapshot"]["keras"]["live_models"] == 1
    assert reply["before"]["keras"]["live_models"] == 2  # the free's own before/after
    assert reply["before"]["time_s"] < reply["snapshot"]["time_s"]
    assert reply["verdict"]["freed_since"] is True
    pushed = sidebar.sent("sample")[-1]  # every open sidebar sees the fresh snapshot at once
    assert pushed["snapshot"] == reply["snapshot"]
    time.sleep(MIN_PUSH_INTERVAL_S)
    monitor = get_monitor(kip)
    assert monitor is not None
    monitor.sampler.sample_once()  # a later sample builds on the fresh figures, not the cell's
    later = sidebar.sent("sample")[-1]
    assert later["snapshot"]["time_s"] > reply["snapshot"]["time_s"]
    assert later["snapshot"]["keras"]["live_models"] == 1
    assert later["verdict"]["freed_since"] is True
    run(kip, "y2 = 1")
    assert sidebar.sent("cell")[-1]["verdict"]["freed_since"] is False


def test_a_cell_message_carries_the_warning_only_for_the_cell_it_flags(
    shell: InteractiveShell, sidebar: RecordingComm
) -> None:
    run(shell, "keep = []")
    grow = "keep.append(b'\\x01' * (12 * 2**20))"  # the same cell keeps 12 MB more each run
    for _ in range(3):
        run(shell, grow)
    flagged = sidebar.sent("cell")[-1]
    assert flagged["verdict"]["growing"] is True, flagged["verdict"]
    assert flagged["warning"] == flagged["verdict"]["message"]
    assert f"Cell [{flagged['cell']['execution_count']}]" in flagged["warning"]
    run(shell, "y = 1")  # another cell: the verdict still names the growing one, not this one
    other = sidebar.sent("cell")[-1]
    assert other["verdict"]["growing"] is True
    assert other["warning"] is None
    assert all(c["warning"] is None for c in sidebar.sent("cell")[:2])


def test_history_records_carry_the_warning_their_cell_message_carried(
    manager: Manager, shell: InteractiveShell, sidebar: RecordingComm
) -> None:
    """After Run All the frontend gets its records from the history, not from cell pushes
    (its comm opens behind the queued cells): the marks must come with the history too."""
    run(shell, "import tensorflow as tf\nkeep = []")
    for _ in range(3):  # TF's allocator is exact: RSS may not grow where freed heap is reused
        run(shell, "keep.append(tf.ones((1024, 3 * 1024)))")
    run(shell, "y = 1")
    pushed = {c["cell"]["execution_count"]: c["warning"] for c in sidebar.sent("cell")}
    send(manager, {"protocol": PROTOCOL, "type": "history", "id": "h-2"})
    (reply,) = [m for m in sidebar.sent("reply") if m["id"] == "h-2"]
    recorded = {r["execution_count"]: r["warning"] for r in reply["history"]}
    assert recorded == {n: pushed[n] for n in recorded} and any(recorded.values())


def _model(reply: dict[str, Any], holder: str) -> dict[str, Any]:
    (model,) = [m for m in reply["models"] if holder in m["holders"]]
    return model


def test_scan_lists_each_model_with_its_holders_and_the_largest_data(
    manager: Manager, sidebar: RecordingComm, kip: InteractiveShell
) -> None:
    run(kip, "kept = build()\narr = np.ones((500, 1000))")  # 4 MB of float64
    run(kip, "build()")  # only Out[] (and _, _N) holds this one
    out = f"Out[{kip.execution_count - 1}]"
    names, out_cache = set(kip.user_ns), dict(kip.user_ns["Out"])
    send(manager, {"protocol": PROTOCOL, "type": "scan", "id": "s-1"})
    (reply,) = sidebar.sent("reply", "error")
    assert (reply["type"], reply["id"], reply["request"]) == ("reply", "s-1", "scan")
    hidden, named = _model(reply, out), _model(reply, "kept")
    assert hidden["freeable"] is True
    assert all("Free memory clears it" in r for r in hidden["remedies"])
    assert named["freeable"] is False
    assert named["holders"] == ["kept"]
    assert named["remedies"] == ["del kept, or rebind it in a %%fresh_model cell"]
    weights = (20 * 8 + 8 + 8 * 2 + 2) * 4  # float32 kernels and biases
    assert hidden["size_bytes"] >= weights and named["size_bytes"] >= weights
    assert hidden["type"] == "Sequential"
    assert {"name": "arr", "type": "ndarray", "size_bytes": 4_000_000} in reply["variables"]
    assert set(kip.user_ns) == names and dict(kip.user_ns["Out"]) == out_cache  # read-only


@contextlib.contextmanager
def own_sidebar(shell: InteractiveShell, manager: Manager, **seams: Any) -> Iterator[RecordingComm]:
    """Open a comm to a ``Sidebar`` built with ``seams`` (a cleanup, a scan); close it after."""
    sidebar = Sidebar(shell, None, get_monitor(shell), **seams)
    manager.register_target("kerasmagic-test", sidebar.open)
    content = {"comm_id": "own", "target_name": "kerasmagic-test", "data": HELLO}
    manager.comm_open(None, "", {"content": content})  # type: ignore[arg-type]
    try:
        yield manager.created[-1]
    finally:
        sidebar.close()


def test_a_failing_scan_gets_an_error_reply(shell: InteractiveShell, manager: Manager) -> None:
    def broken(_namespace: Mapping[str, Any]) -> DeepScan:
        raise RuntimeError("gc is gone " + BIG)

    with own_sidebar(shell, manager, scan=broken) as opened:
        send(manager, {"protocol": PROTOCOL, "type": "scan", "id": "s-1"}, comm_id="own")
        send(manager, {"protocol": PROTOCOL, "type": "scan", "id": "s-2"}, comm_id="own")
        errors = opened.sent("error", "reply")
        assert [(e["type"], e["id"]) for e in errors] == [("error", "s-1"), ("error", "s-2")]
        assert "scan failed: RuntimeError: gc is gone" in errors[0]["error"]
        assert len(errors[0]["error"]) <= 500


@pytest.fixture
def kernel_loop(shell: InteractiveShell) -> Iterator[IOLoop]:
    """The kernel's main event loop, as ipykernel gives the shell (``shell.kernel.io_loop``)."""
    loop = IOLoop(make_current=False)
    shell.kernel = SimpleNamespace(io_loop=loop)
    try:
        yield loop
    finally:
        del shell.kernel
        loop.close()


def test_a_scan_during_a_running_cell_is_answered_after_it(
    shell: InteractiveShell, manager: Manager, kernel_loop: IOLoop
) -> None:
    """Two scans sent from the comm's thread while a cell runs: one run after it, both answered."""
    runs = []

    def counted(namespace: Mapping[str, Any]) -> DeepScan:
        runs.append(threading.current_thread() is threading.main_thread())
        return deep_scan(namespace)

    with own_sidebar(shell, manager, scan=counted) as opened:

        def from_the_comms_thread() -> None:
            for rid in ("during-1", "during-2"):
                request = {"protocol": PROTOCOL, "type": "scan", "id": rid}
                worker = threading.Thread(target=send, args=(manager, request, "own"))
                worker.start()
                worker.join()

        shell.user_ns["request_scans"] = from_the_comms_thread
        shell.user_ns["answered"] = lambda: len(opened.sent("reply", "error"))
        run(shell, "request_scans()\nseen = answered()\nimport numpy as np\nlate = np.ones(999)")
        assert shell.user_ns["seen"] == 0  # not answered during the cell
        assert opened.sent("reply", "error") == []  # queued on the main loop, not dropped
        kernel_loop.run_sync(lambda: asyncio.sleep(GATHER_S + 0.1))
        replies = opened.sent("reply", "error")
        assert [(r["type"], r["id"]) for r in replies] == [
            ("reply", "during-1"),
            ("reply", "during-2"),
        ]
        assert runs == [True]  # one run, on the main thread, shared by both requests
        assert replies[0]["models"] == replies[1]["models"]
        assert {"name": "late", "type": "ndarray", "size_bytes": 999 * 8} in replies[0]["variables"]


def test_free_requests_sent_together_share_one_cleanup_and_each_gets_its_reply(
    shell: InteractiveShell, manager: Manager, kernel_loop: IOLoop
) -> None:
    """Over the main shell (no comm subshell) requests are read one at a time: each ran its own
    cleanup, 50 clicks blocking the kernel for 50 cleanups."""
    runs = []

    def counted(shell: Any, namespace: Any, **kwargs: Any) -> CleanupReport:
        runs.append(threading.current_thread() is threading.main_thread())
        return clean(shell, namespace, **kwargs)

    with own_sidebar(shell, manager, cleanup=counted) as opened:
        ids = [f"free-{i}" for i in range(50)]
        for rid in ids:  # handled on the main thread, as the main shell handles comm messages
            send(manager, {"protocol": PROTOCOL, "type": "free_memory", "id": rid}, comm_id="own")
        kernel_loop.run_sync(lambda: asyncio.sleep(GATHER_S + 0.2))
        replies = opened.sent("reply", "error")
        assert [(r["type"], r["id"]) for r in replies] == [("reply", rid) for rid in ids]
        assert runs == [True]  # one cleanup, on the main thread
        assert len({json.dumps(r["report"]) for r in replies}) == 1  # its result, shared
        send(manager, {"protocol": PROTOCOL, "type": "free_memory", "id": "later"}, comm_id="own")
        kernel_loop.run_sync(lambda: asyncio.sleep(GATHER_S + 0.2))
        assert opened.sent("reply")[-1]["id"] == "later" and runs == [True, True]  # a new run
