"""What following a Ctrl-C costs: Python code under ``sys.settrace`` against ``sys.monitoring``.

kerasmagic's Ctrl-C engine (``interrupts/watch.py``) traces nothing until an interrupt lands;
then, until the interrupt leaves the cell, a global trace function sees every new frame (as
here: it returns None for frames it does not watch). On Python 3.12+ ``sys.monitoring`` could
do that with a ``PY_START`` callback instead. This times a call-heavy loop each way (best of
``--repeats``), to say what an engine on ``sys.monitoring`` would buy.

    python benchmarks/trace_cost.py [--calls 300000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable


def _add(i: int) -> int:
    return i + 1


def _loop(calls: int) -> int:
    total = 0
    for i in range(calls):
        total += _add(i)
    return total


def _best(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    loop = lambda: _loop(args.calls)  # noqa: E731
    plain = _best(loop, args.repeats)

    sys.settrace(lambda frame, event, arg: None)
    try:
        traced = _best(loop, args.repeats)
    finally:
        sys.settrace(None)
    row = f"Python {sys.version.split()[0]}: plain {plain * 1e3:.1f} ms, settrace "
    row += f"{traced * 1e3:.1f} ms ({traced / plain:.1f}x)"
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        tool = monitoring.PROFILER_ID
        monitoring.use_tool_id(tool, "trace_cost")
        monitoring.register_callback(tool, monitoring.events.PY_START, lambda code, at: None)
        monitoring.set_events(tool, monitoring.events.PY_START)
        try:
            watched = _best(loop, args.repeats)
        finally:
            monitoring.set_events(tool, 0)
            monitoring.free_tool_id(tool)
        row += f", sys.monitoring PY_START {watched * 1e3:.1f} ms ({watched / plain:.1f}x)"
    print(f"{row}; per call: {(traced - plain) / args.calls * 1e9:.0f} ns more under settrace")


if __name__ == "__main__":
    main()
