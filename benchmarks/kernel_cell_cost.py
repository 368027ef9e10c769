"""Per-cell cost of kerasmagic as a frontend sees it: round trips of trivial cells to a real kernel.

A real ipykernel (started with jupyter_client) holds ~1M live objects and imports Keras. Trivial
cells (``t = i``) are sent one at a time; each is timed from the execute request to the kernel's
"idle" status on iopub (what a notebook waits for). Three set-ups, interleaved in rounds whose
order alternates so the kernel's own drift is shared: without kerasmagic, with
``%load_ext kerasmagic``, and with the live widget shown and a sidebar comm open. Prints the
medians and what kerasmagic adds, and writes ``benchmarks/results/kernel_cell_cost.json``.

    python benchmarks/kernel_cell_cost.py [--cells 500] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from jupyter_client.manager import start_new_kernel

RESULTS = Path(__file__).parent / "results"
SETUP = """
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
objects = [[i] for i in range(1_000_000)]
import keras
models = [keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)]) for _ in range(3)]
"""


def round_trip(kc: Any, code: str, timeout_s: float = 60.0) -> float:
    """Run ``code``; return seconds from the request to the kernel's idle status for it."""
    start = time.perf_counter()
    msg_id = kc.execute(code, store_history=True)
    while True:
        msg = kc.get_iopub_msg(timeout=timeout_s)
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
        ):
            elapsed = time.perf_counter() - start
            break
    kc.get_shell_msg(timeout=timeout_s)  # the execute_reply
    return elapsed


def drain(kc: Any) -> list[dict[str, Any]]:
    """Read whatever the kernel has already sent (widget and comm messages); return it."""
    read = []
    while True:
        try:
            read.append(kc.get_iopub_msg(timeout=0.2))
        except Exception:  # queue.Empty
            return read


def open_sidebar(kc: Any) -> None:
    """Open a sidebar comm the way the JupyterLab extension does."""
    from kerasmagic.views.protocol import PROTOCOL

    comm_id, hello = uuid.uuid4().hex, {"protocol": PROTOCOL, "type": "hello"}
    content = {"comm_id": comm_id, "target_name": "kerasmagic", "data": hello}
    kc.shell_channel.send(kc.session.msg("comm_open", content))
    time.sleep(0.5)
    replies = [m["content"]["data"] for m in drain(kc) if m["msg_type"] == "comm_msg"
               and m["content"].get("comm_id") == comm_id]  # fmt: skip
    # A refused hello (an old protocol number) would time cells without a sidebar at all.
    assert [r.get("type") for r in replies][:1] == ["state"], replies


def cells(kc: Any, count: int) -> list[float]:
    """Return the round trip of each of ``count`` trivial cells."""
    for i in range(10):  # settle
        round_trip(kc, f"t = {i}")
    return [round_trip(kc, f"t = {i}") for i in range(count)]


def measure(kc: Any, setup: str, count: int) -> list[float]:
    """Put the kernel in ``setup``, time ``count`` cells, and take the setup down again."""
    if setup != "without":
        round_trip(kc, "%load_ext kerasmagic")
    if setup == "widget_and_sidebar":
        round_trip(kc, "%gpu_mem --live")
        open_sidebar(kc)
    times = cells(kc, count)
    if setup != "without":
        round_trip(kc, "%unload_ext kerasmagic")
    drain(kc)
    return times


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"}
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        round_trip(kc, SETUP, timeout_s=300)
        setups = ("without", "extension", "widget_and_sidebar")
        times: dict[str, list[float]] = {s: [] for s in setups}
        for round_ in range(args.rounds):
            # IPython's own per-cell cost grows with its history: alternate the order (ABC CBA)
            # so that drift is shared by every set-up instead of charged to the later ones.
            for setup in setups if round_ % 2 == 0 else setups[::-1]:
                times[setup] += measure(kc, setup, args.cells // args.rounds)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    med = {s: statistics.median(t) * 1e3 for s, t in times.items()}
    result = {
        "cells_per_setup": len(times["without"]),
        "median_round_trip_ms": med,
        "extension_added_ms": med["extension"] - med["without"],
        "widget_and_sidebar_added_ms": med["widget_and_sidebar"] - med["without"],
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "kernel_cell_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
