"""How much the isolated runner costs beyond starting Python, and how well a sweep packs.

1. Overhead: median of ``run_isolated(noop)`` minus median of a bare
   ``python -c "import <the modules the child imports>"`` (target <= 150 ms).
2. Sweep: 8 trials of ``SLEEP_S`` each on 2 workers against the ideal 8 * SLEEP_S / 2
   (target <= 1.3x).

Run: ``python benchmarks/isolate_overhead.py``; writes ``benchmarks/results/isolate_overhead.json``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import kerasmagic

REPEATS = 15
SLEEP_S = 1.0
CHILD_MODULES = "kerasmagic.isolate.child, cloudpickle"


def noop() -> None:
    return None


def nap(_: int) -> None:
    time.sleep(SLEEP_S)


def _median_s(action: Callable[[], object]) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> dict[str, float | bool]:
    bare = [sys.executable, "-c", f"import {CHILD_MODULES}"]
    bare_s = _median_s(lambda: subprocess.run(bare, check=True))
    isolated_s = _median_s(lambda: kerasmagic.run_isolated(noop))
    start = time.perf_counter()
    trials = kerasmagic.sweep(nap, range(8), workers=2, progress=False)
    sweep_s = time.perf_counter() - start
    assert all(t.ok for t in trials)
    ideal_s = 8 * SLEEP_S / 2
    overhead_ms = (isolated_s - bare_s) * 1000
    return {
        "bare_python_import_ms": round(bare_s * 1000, 1),
        "run_isolated_noop_ms": round(isolated_s * 1000, 1),
        "overhead_ms": round(overhead_ms, 1),
        "overhead_target_met": overhead_ms <= 150,
        "sweep_8x_wall_s": round(sweep_s, 2),
        "sweep_ideal_s": ideal_s,
        "sweep_ratio": round(sweep_s / ideal_s, 3),
        "sweep_target_met": sweep_s / ideal_s <= 1.3,
    }


if __name__ == "__main__":
    result = main()
    out = Path(__file__).parent / "results" / "isolate_overhead.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
