"""What the walks of a ``%%fresh_model`` cell cost beside its whole cleanup.

A ``%%fresh_model`` cell walks the namespace several times, each walk asking its own question
to its own depth: the near walk of the cleanup plan, what kept and rebound names reach, the
globals the notebook's functions read (the rebinding rule), the ``tf.function`` search and the
count of live models after the cell. This times each (in-process IPython, the leak loop's
model fitted on 20,000 x 100 rows, a namespace with a dict of 40 folds' results) against the
cleanup as a whole and one ``gc.collect()``, to say what walking once would save.

    python benchmarks/cell_walks.py [--runs 8]
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import time
from typing import Any

SETUP = """
import numpy as np, keras
x = np.random.rand(20000, 100).astype("float32"); y = np.random.randint(0, 10, 20000)
results = {f"fold{i}": {"loss": list(np.random.rand(50)), "params": {"lr": 0.1}} for i in range(40)}
def build(width=256):
    m = keras.Sequential([keras.Input((100,)), keras.layers.Dense(width, activation="relu"),
                          keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)])
    m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m
def train(m):
    return m.fit(x, y, epochs=1, verbose=0)
base = build(); train(base)
"""
CELL = "%%fresh_model -q\nmodel = build()\nhistory = train(model)\nmodel\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from IPython.core.interactiveshell import InteractiveShell

    import kerasmagic.magics as magics
    import kerasmagic.probes as probes
    import kerasmagic.walk as walk
    from kerasmagic.backends.tensorflow import graphs

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "kerasmagic")
    shell.run_cell(SETUP).raise_error()
    spent: dict[str, list[float]] = {}

    def timed(owner: Any, name: str, label: str) -> None:
        function = getattr(owner, name)

        @functools.wraps(function)
        def measured(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                spent.setdefault(label, []).append(time.perf_counter() - start)

        setattr(owner, name, measured)

    timed(walk.NearWalks, "state", "near walk of the plan")
    timed(walk, "reachable", "what kept and rebound names reach")
    timed(magics, "rebound_now", "globals the functions read (rebinding)")
    timed(graphs, "instances_near", "tf.function search")
    timed(probes, "count_models", "live models counted")
    timed(magics, "clean", "the whole cleanup")
    for _ in range(3):
        shell.run_cell(CELL).raise_error()
    spent.clear()
    for _ in range(args.runs):
        shell.run_cell(CELL).raise_error()
    walks = 0.0
    for label, times in spent.items():
        per_cell = sum(times) / args.runs
        walks += per_cell if label != "the whole cleanup" else 0.0
        print(f"{label:42} {per_cell * 1e3:8.2f} ms a cell")
    collects = []
    for _ in range(5):
        start = time.perf_counter()
        gc.collect()
        collects.append(time.perf_counter() - start)
    print(f"{'all the walks':42} {walks * 1e3:8.2f} ms a cell")
    print(f"{'one gc.collect() alone':42} {statistics.median(collects) * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
