"""A ``tf.function`` step that builds its optimizer inside, re-run with a cleanup each time.

Four runs of one cell (a 256-2048-2048-10 model, a new Adam, a ``@tf.function`` step that
closes over both and is called once), each after ``kerasmagic.reset()`` of the names it
rebinds, then a last reset of everything; prints TensorFlow's CPU:0 allocator after each.
Measured: 54, 108, 108, 108 MB, then 54 MB left, before the trace cleanup emptied TensorFlow's
first-call initializer list; 54 MB every run and 0 MB left after.

    python benchmarks/inline_optimizer.py
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from test_oom import RECOVERY as SETUP  # the model, data and loss of the OOM tests
from test_oom import STEP

CELL = STEP.removeprefix("%%fresh_model -q\n").format(n=500)


def main() -> None:
    import kerasmagic

    ns: dict[str, object] = {}
    exec(SETUP, ns)
    tf = ns["tf"]

    def in_use_mb() -> float:
        return round(tf.config.experimental.get_memory_info("CPU:0")["current"] / 2**20, 1)  # type: ignore[attr-defined]

    for run in range(4):
        kerasmagic.reset(ns, rebinding=["m", "opt", "step"])
        exec(compile(CELL, f"<run {run}>", "exec"), ns)
        gc.collect()
        print(f"run {run}: {in_use_mb()} MB")
    kerasmagic.reset(ns, drop_all=True)
    ns.pop("step", None)
    gc.collect()
    print(f"after dropping everything: {in_use_mb()} MB")


if __name__ == "__main__":
    main()
