"""Fuzzed sidebar messages: each malformed request gets one error reply and prints nothing.

Seeded random JSON (huge and non-finite numbers, deep nesting, wrong types, unknown keys, lone
surrogates, NUL bytes, long strings, valid requests with one field broken) goes to kerasmagic's
comm target as hellos and as requests on an open comm: in-process through the ``comm``
package's own manager, whose failures would be logged tracebacks, and as a sample over a real
kernel's subshell, where a logged traceback or a warning is printed into the cell's output. A
reply must also go back on the wire: it is packed as ``jupyter_client`` packs it.
"""

from __future__ import annotations

import json
import logging
import math
import random
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import comm
import pytest
from comm.base_comm import BaseComm, CommManager
from conftest import kernel_run, real_kernel
from IPython.core.interactiveshell import InteractiveShell
from jupyter_client.session import json_packer

from kerasmagic.snapshot import take_snapshot
from kerasmagic.views.comm import TARGET
from kerasmagic.views.protocol import PROTOCOL

SEED = 26_4
HELLO = {"protocol": PROTOCOL, "type": "hello"}
GOOD = [
    {"protocol": PROTOCOL, "type": "snapshot", "id": "s"},
    {"protocol": PROTOCOL, "type": "history", "id": "h"},
]
STRINGS = [
    *("", "x", "snapshot", "history", "hello", "exec", "id", "protocol", "type", "1"),
    *("\x00", "a\x00b", "\ud800", "x\udfff", "\udc80", "🙂" * 70, "名前", "\u202e", "\x1b[31m"),
    *("x" * 64, "x" * 65, "y" * 100_000, "__class__", "$(rm -rf)", "<script>", "None"),
]
NUMBERS: list[Any] = [
    *(0, 1, -1, 2, True, False, 1.0, 0.5, -0.0, 2**53 + 1, 2**63, -(2**63) - 1, 2**64),
    *(10**300, 10**4000, 1e308, -1e308, 5e-324, math.inf, -math.inf, math.nan),
]


def deep(rng: random.Random, depth: int) -> Any:
    """A list or object nested ``depth`` levels (JSON's decoder itself stops near 1,000)."""
    value: Any = rng.choice(NUMBERS + STRINGS[:5])
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"protocol": value}
    return value


def value(rng: random.Random, level: int = 0) -> Any:
    """A random JSON value, weighted to what breaks parsers."""
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(NUMBERS)
    if roll < 0.55:
        return rng.choice(STRINGS)
    if roll < 0.6:
        return None
    if roll < 0.65:
        return deep(rng, rng.choice([5, 50, 300, 900]))
    if level > 2:
        return rng.choice(STRINGS)
    if roll < 0.8:
        return [value(rng, level + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(STRINGS): value(rng, level + 1) for _ in range(rng.randint(0, 4))}


def request(rng: random.Random, base: dict[str, Any]) -> Any:
    """A request: a random value, or ``base`` with fields broken, dropped or added."""
    if rng.random() < 0.25:
        return value(rng)
    data = dict(base)
    for _ in range(rng.randint(1, 3)):
        roll, key = rng.random(), rng.choice([*data, "id", "protocol", "type"])
        if roll < 0.5:
            data[key] = value(rng)
        elif roll < 0.7:
            data.pop(key, None)
        else:
            data[rng.choice(STRINGS)] = value(rng)
    if data.get("type") in ("free_memory", "scan"):  # valid ones would run a cleanup or a scan
        data["type"] = "snapshot"
    return data


def valid(data: Any) -> bool:
    """Whether ``data`` is a request the sidebar answers with a reply."""
    return (
        isinstance(data, dict)
        and set(data) == {"protocol", "type", "id"}
        and type(data["protocol"]) is int
        and data["protocol"] == PROTOCOL
        and data["type"] in ("snapshot", "history")
        and isinstance(data["id"], str)
        and 0 < len(data["id"]) <= 64
        and not any(0xD800 <= ord(c) <= 0xDFFF for c in data["id"])
    )


class WireComm(BaseComm):
    """A real ``BaseComm`` that packs what it publishes as ``jupyter_client`` does."""

    def __init__(self, **kwargs: Any) -> None:
        self.published: list[tuple[str, Any]] = []
        super().__init__(**kwargs)

    def publish_msg(self, msg_type: str, data: Any = None, **keys: Any) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # its fallback for a bad message warns: a failure
            packed = json_packer(data)
        self.published.append((msg_type, json.loads(packed)))


class Manager(CommManager):
    def create(self, **kwargs: Any) -> WireComm:
        self.last = WireComm(**kwargs)
        return self.last


@pytest.fixture
def manager(monkeypatch: pytest.MonkeyPatch, ip: InteractiveShell) -> Iterator[Manager]:
    fresh = Manager()
    monkeypatch.setattr(comm, "get_comm_manager", lambda: fresh)
    monkeypatch.setattr(comm, "create_comm", fresh.create)
    ip.run_line_magic("unload_ext", "kerasmagic")  # loaded again with the seams in place
    ip.run_line_magic("load_ext", "kerasmagic")
    yield fresh


def quiet(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, what: Any) -> None:
    captured = capsys.readouterr()
    assert captured.out == captured.err == "", (repr(what)[:300], captured)
    logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not logged, (repr(what)[:300], [r.getMessage()[:300] for r in logged])


def test_fuzzed_hellos_are_refused_with_one_error_and_a_close(
    manager: Manager, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(SEED)
    capsys.readouterr()
    for i in range(300):
        data = request(rng, HELLO)
        if data == HELLO:
            continue
        content = {"comm_id": f"h{i}", "target_name": TARGET, "data": data}
        manager.comm_open(None, "", {"content": content})  # type: ignore[arg-type]
        published = manager.last.published
        quiet(capsys, caplog, data)
        kinds = [(kind, d.get("type") if isinstance(d, dict) else None) for kind, d in published]
        assert kinds == [("comm_msg", "error"), ("comm_close", None)], (repr(data)[:300], kinds)
        assert len(published[0][1]["error"]) <= 500
        assert f"h{i}" not in manager.comms


def test_fuzzed_requests_get_one_answer_each_and_print_nothing(
    manager: Manager, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(SEED + 1)
    manager.comm_open(None, "", {"content": {"comm_id": "c", "target_name": TARGET, "data": HELLO}})  # type: ignore[arg-type]
    sidebar = manager.last
    capsys.readouterr()
    errors = 0
    for _ in range(1_000):
        data = request(rng, rng.choice(GOOD))
        content = {"comm_id": "c", "data": data} if rng.random() < 0.97 else {"comm_id": "c"}
        before = len(sidebar.published)
        manager.comm_msg(None, "", {"content": content})  # type: ignore[arg-type]
        quiet(capsys, caplog, data)
        answers = [d for kind, d in sidebar.published[before:] if d.get("type") != "sample"]
        assert len(answers) == 1, (repr(data)[:300], answers)
        expected = "reply" if "data" in content and valid(data) else "error"
        assert answers[0]["type"] == expected, (repr(data)[:300], answers[0])
        errors += expected == "error"
        assert expected == "reply" or len(answers[0]["error"]) <= 500, answers[0]
    assert errors > 700 and "c" in manager.comms


def hostile_packer(obj: Any) -> bytes:
    """Pack as a hostile frontend may: NaN tokens and lone surrogates, escaped, are valid to
    Python's decoder (the kernel's), though ``jupyter_client`` itself never sends them."""
    return json.dumps(obj, default=str).encode()


@pytest.mark.slow
def test_fuzzed_requests_over_a_real_kernel_print_nothing_in_the_cell(tmp_path: Any) -> None:
    from test_comm_kernel import Frontend

    rng = random.Random(SEED + 2)
    with real_kernel(str(tmp_path)) as (_, client):
        front = Frontend(client)
        front.open()
        kernel_run(client, "import time")
        cell = client.execute("time.sleep(4); print('cell done')")  # messages land mid-cell
        client.session.pack = hostile_packer
        sent = [request(rng, rng.choice(GOOD)) for _ in range(150)]
        for data in sent:
            front._send("comm_msg", {"comm_id": front.comm_id, "data": data})
        bad_ids = [uuid.uuid4().hex for _ in range(5)]
        for comm_id in bad_ids:
            data = request(rng, HELLO)
            front._send("comm_open", {"comm_id": comm_id, "target_name": TARGET, "data": data})
        answers = [front.wait(lambda d: d["type"] in ("reply", "error"))[1] for _ in sent]
        front.wait(
            lambda m: (
                m["parent_header"].get("msg_id") == cell
                and m["content"]["execution_state"] == "idle"
            ),
            msg_type="status",
        )

        def closed() -> set[str]:
            return {m["content"]["comm_id"] for _, m in front.seen if m["msg_type"] == "comm_close"}

        while not closed() >= set(bad_ids):
            front.seen.append((0.0, client.get_iopub_msg(timeout=30)))
    assert [a["type"] for a in answers] == ["reply" if valid(d) else "error" for d in sent]
    printed = [
        (m["msg_type"], str(m["content"])[:300])
        for _, m in front.seen
        if m["msg_type"] in ("stream", "error", "display_data")
    ]
    assert printed == [("stream", str({"name": "stdout", "text": "cell done\n"}))], printed


def test_fuzzed_messages_to_the_live_widget_print_nothing(
    manager: Manager,
    ip: InteractiveShell,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """ipywidgets prints a traceback into the cell for a malformed widget message."""
    from kerasmagic.live import get_monitor
    from kerasmagic.views.widget import LiveWidget

    monitor = get_monitor(ip)
    assert monitor is not None
    widget = LiveWidget(monitor)
    try:
        wire = manager.last
        rng = random.Random(SEED + 3)
        capsys.readouterr()
        for _ in range(300):
            data = request(rng, {"method": rng.choice(["update", "request_state", "custom"])})
            before = len(wire.published)
            manager.comm_msg(None, "", {"content": {"comm_id": widget.comm.comm_id, "data": data}})  # type: ignore[arg-type]
            quiet(capsys, caplog, data)
            if isinstance(data, dict) and data.get("method") == "request_state":
                assert any(d.get("method") == "update" for _, d in wire.published[before:])
        widget.show_snapshot(take_snapshot())  # and it still shows what it is fed
        assert widget.rss_bytes > 0 and "kerasmagic-bars" in widget.value
        manager.comm_msg(
            None,
            "",
            {
                "content": {
                    "comm_id": widget.comm.comm_id,
                    "data": {"method": "update", "state": {"warning": "set"}, "buffer_paths": []},
                }
            },
        )  # type: ignore[arg-type]
        assert widget.warning == "set"  # a valid update, as JupyterLab sends it, is taken
    finally:
        widget.close()
