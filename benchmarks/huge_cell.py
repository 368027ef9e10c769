"""Time a 2 MB cell run plainly and under ``%%fresh_model``, in-process and in a real kernel.

Two shapes of 2 MB: 40,000 lines of an assignment and a comment (a generated cell, a pasted
table), and 333,000 one-statement lines (the worst case: IPython's own transform, its
per-statement compile and kerasmagic's parse analysis all grow with statements, not bytes).
Each cell runs ``--runs`` times with a different last line (so nothing is cached) and the best
time is kept. Writes ``benchmarks/results/huge_cell.json``.

    python benchmarks/huge_cell.py [--runs 3] [--no-kernel]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from IPython.core.interactiveshell import InteractiveShell
from jupyter_client.manager import start_new_kernel

RESULTS = Path(__file__).parent / "results"
SHAPES = {
    "40k_lines": "".join(f"a{i} = 1  # {'padding ' * 5}\n" for i in range(40_000)),
    "333k_statements": "x = 1\n" * 333_333,
}


def best_s(run: Callable[[str], None], body: str, runs: int) -> float:
    """Return the fastest of ``runs`` runs of ``body`` (each with its own last line)."""
    times = []
    for i in range(runs):
        start = time.perf_counter()
        run(f"{body}last = {i}\n")
        times.append(time.perf_counter() - start)
    return min(times)


def in_process(runs: int) -> dict[str, dict[str, float]]:
    """Return the best times in an in-process shell with kerasmagic loaded."""
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "kerasmagic")

    def run(code: str) -> None:
        assert shell.run_cell(code, store_history=True).success

    return {
        name: {
            "plain_s": best_s(run, body, runs),
            "fresh_model_s": best_s(run, "%%fresh_model -q\n" + body, runs),
        }
        for name, body in SHAPES.items()
    }


def in_kernel(runs: int) -> dict[str, dict[str, float]]:
    """Return the best round trips (request to idle) in a real kernel with kerasmagic loaded."""
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        kc.execute_interactive("%load_ext kerasmagic", timeout=120)

        def run(code: str) -> None:
            reply = kc.execute_interactive(code, timeout=600, output_hook=lambda msg: None)
            assert reply["content"]["status"] == "ok", reply["content"]

        return {
            name: {
                "plain_s": best_s(run, body, runs),
                "fresh_model_s": best_s(run, "%%fresh_model -q\n" + body, runs),
            }
            for name, body in SHAPES.items()
        }
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-kernel", action="store_true", help="in-process only")
    args = parser.parse_args()
    result: dict[str, Any] = {
        "cell_mb": {name: round(len(body) / 1e6, 2) for name, body in SHAPES.items()},
        "in_process": in_process(args.runs),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    if not args.no_kernel:
        result["kernel"] = in_kernel(args.runs)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "huge_cell.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
