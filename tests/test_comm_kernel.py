"""The sidebar's comm in a real ipykernel 7, spoken to as JupyterLab 4.6 does: over a subshell.

JupyterLab sends comm messages to a kernel subshell of their own (``commsOverSubshells``), so
the kernel can answer them while the main shell runs a cell. These tests open the comm and send
requests with that subshell's id in the header, exactly as the frontend does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import real_kernel

from kerasmagic.views.protocol import PROTOCOL

pytestmark = pytest.mark.slow

Message = dict[str, Any]


class Frontend:
    """A jupyter_client connection that talks to kerasmagic's comm like the sidebar."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.subshell = self._create_subshell()
        self.comm_id = uuid.uuid4().hex
        self.seen: list[tuple[float, Message]] = []  # every iopub message, with arrival time

    def _create_subshell(self) -> str:
        msg = self.client.session.msg("create_subshell_request", {})
        self.client.control_channel.send(msg)
        reply = self.client.get_control_msg(timeout=30)
        return str(reply["content"]["subshell_id"])

    def _send(self, msg_type: str, content: Message) -> None:
        msg = self.client.session.msg(msg_type, content)
        msg["header"]["subshell_id"] = self.subshell
        self.client.shell_channel.send(msg)

    def open(self) -> Message:
        data = {"protocol": PROTOCOL, "type": "hello"}
        self._send(
            "comm_open", {"comm_id": self.comm_id, "target_name": "kerasmagic", "data": data}
        )
        return self.wait(lambda d: d["type"] == "state")[1]

    def request(self, kind: str, rid: str) -> None:
        data = {"protocol": PROTOCOL, "type": kind, "id": rid}
        self._send("comm_msg", {"comm_id": self.comm_id, "data": data})

    def wait(
        self, match: Callable[[Message], bool], timeout_s: float = 60, msg_type: str = "comm_msg"
    ) -> tuple[float, Message]:
        """Return (arrival time, payload) of the first iopub message that ``match`` accepts."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = self.client.get_iopub_msg(timeout=timeout_s)
            self.seen.append((time.monotonic(), msg))
            content = msg["content"]
            if msg["msg_type"] == msg_type == "comm_msg" and content["comm_id"] == self.comm_id:
                if match(content["data"]):
                    return self.seen[-1][0], content["data"]
            elif msg["msg_type"] == msg_type and match(msg):
                return self.seen[-1][0], msg
        raise TimeoutError(f"no matching {msg_type}")


@pytest.fixture
def frontend(tmp_path: Any) -> Iterator[Frontend]:
    """A fresh kernel with kerasmagic loaded and the sidebar's comm open over a subshell."""
    with real_kernel(str(tmp_path)) as (_, client):
        front = Frontend(client)
        front.open()
        yield front


def _idle_of(msg_id: str) -> Callable[[Message], bool]:
    return lambda m: (
        m["parent_header"].get("msg_id") == msg_id and m["content"]["execution_state"] == "idle"
    )


def test_snapshot_request_is_answered_while_a_cell_runs(frontend: Frontend) -> None:
    """The sampler's pushes during the cell must not route the comm back to the main shell."""
    msg_id = frontend.client.execute("import time\ntime.sleep(4)")
    frontend.wait(lambda d: d["type"] == "sample")  # the sampler pushed during the cell
    time.sleep(1)
    frontend.request("snapshot", "during-cell")
    _, reply = frontend.wait(lambda d: d.get("id") == "during-cell")
    assert reply["request"] == "snapshot"
    done = [m for _, m in frontend.seen if m["msg_type"] == "status" and _idle_of(msg_id)(m)]
    assert done == [], "the snapshot was answered only after the cell had finished"
    frontend.wait(_idle_of(msg_id), msg_type="status")


def test_a_request_during_a_cell_prints_nothing_there_and_ctrl_c_still_stops_it(
    tmp_path: Any,
) -> None:
    """``comm`` fires ``post_execute`` after each comm message, on the subshell's thread: the
    Ctrl-C guard's end-of-cell callback printed an error into the cell there, once per request."""
    with real_kernel(str(tmp_path)) as (km, client):
        frontend = Frontend(client)
        frontend.open()
        msg_id = client.execute("import time\nfor _ in range(300): time.sleep(0.1)")
        frontend.wait(lambda d: d["type"] == "sample")  # the cell is running
        for i in range(3):
            frontend.request("snapshot", f"during-{i}")
            frontend.wait(lambda d, i=i: d.get("id") == f"during-{i}")
        km.interrupt_kernel()
        reply = client.get_shell_msg(timeout=60)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = client.get_shell_msg(timeout=60)
        frontend.wait(_idle_of(msg_id), msg_type="status")
    assert reply["content"]["status"] == "error", reply["content"]
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    printed = [m for _, m in frontend.seen if m["msg_type"] in ("stream", "display_data")]
    assert printed == [], [m["content"] for m in printed]
    (error,) = [m for _, m in frontend.seen if m["msg_type"] == "error"]
    assert error["content"]["ename"] == "KeyboardInterrupt"


def test_a_request_during_a_cell_leaves_the_cells_ctrl_c_guard_on(frontend: Frontend) -> None:
    """ipykernel 7 runs the kernel's handler hooks for a subshell's message on the subshell's
    thread: the guard's post-handler hook ended the guarding of the cell the main thread was
    running, so a Ctrl-C as the cell ended escaped as "KeyboardInterrupt caught in kernel"."""
    code = (
        "import time\nfrom kerasmagic.shellstate import state_of\n"
        "guard = state_of(get_ipython()).part('kernelguard')\n"
        "for _ in range(40):\n    time.sleep(0.1)\nprint('guarding', guard._guarding)"
    )
    msg_id = frontend.client.execute(code)
    frontend.wait(lambda d: d["type"] == "sample")  # the cell is running
    for i in range(3):
        frontend.request("snapshot", f"during-{i}")
        frontend.wait(lambda d, i=i: d.get("id") == f"during-{i}")
    frontend.wait(_idle_of(msg_id), msg_type="status")
    printed = [m["content"]["text"] for _, m in frontend.seen if m["msg_type"] == "stream"]
    assert printed == ["guarding True\n"], printed


def test_free_requests_during_a_cell_share_one_cleanup_and_each_gets_a_reply(
    frontend: Frontend,
) -> None:
    """A burst of "Free memory" clicks while a cell runs costs one cleanup after the cell."""
    frontend.client.execute("import time\ntime.sleep(3)")
    frontend.wait(lambda d: d["type"] == "sample")  # the cell is running
    ids = [f"free-{i}" for i in range(50)]
    for rid in ids:
        frontend.request("free_memory", rid)
    replies: dict[str, Message] = {}
    while len(replies) < len(ids):
        _, data = frontend.wait(lambda d: d.get("request") == "free_memory" or d["type"] == "error")
        assert data["type"] == "reply", data
        replies[data["id"]] = data
    assert sorted(replies) == sorted(ids)
    runs = {r["snapshot"]["time_s"] for r in replies.values()}  # one after-snapshot per cleanup
    assert len(runs) == 1, f"{len(runs)} cleanups for {len(ids)} requests"
    (reply, *_) = replies.values()
    assert reply["before"]["ram"]["rss_bytes"] > 0
    assert reply["verdict"]["freed_since"] is True


def test_a_scan_sent_during_a_cell_is_answered_after_it(frontend: Frontend) -> None:
    """A scan walks gc on the main thread: queued behind the running cell, never dropped."""
    frontend.client.execute("import time\ntime.sleep(3)\nimport numpy as np\nlate = np.ones(999)")
    frontend.wait(lambda d: d["type"] == "sample")  # the cell is running
    frontend.request("scan", "during-cell")
    _, reply = frontend.wait(lambda d: d.get("id") == "during-cell")
    assert (reply["type"], reply["request"]) == ("reply", "scan"), reply
    assert {"name": "late", "type": "ndarray", "size_bytes": 999 * 8} in reply["variables"]


class MainShellFrontend(Frontend):
    """A frontend without comm subshells (Notebook 7, older Lab): comms over the main shell."""

    def _create_subshell(self) -> str:
        return ""

    def _send(self, msg_type: str, content: Message) -> None:
        self.client.shell_channel.send(self.client.session.msg(msg_type, content))


def test_free_requests_sent_at_once_over_the_main_shell_share_one_cleanup(tmp_path: Any) -> None:
    """The main shell reads them one at a time: each ran a cleanup of its own, 50 in a row."""
    with real_kernel(str(tmp_path)) as (_, client):
        frontend = MainShellFrontend(client)
        frontend.open()
        ids = [f"free-{i}" for i in range(50)]
        for rid in ids:
            frontend.request("free_memory", rid)
        replies: dict[str, Message] = {}
        while len(replies) < len(ids):
            _, data = frontend.wait(
                lambda d: d.get("request") == "free_memory" or d["type"] == "error"
            )
            assert data["type"] == "reply", data
            replies[data["id"]] = data
        runs = {r["snapshot"]["time_s"] for r in replies.values()}
        # Sent at once, they arrive within ms of each other; on a loaded 2-core machine a few
        # may come after the first run ended and share a second one: never one run each.
        assert len(runs) <= 3, f"{len(runs)} cleanups for {len(ids)} requests"
