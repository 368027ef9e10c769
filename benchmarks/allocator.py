"""TensorFlow's allocator at the start of each re-run of a model cell, per notebook pattern.

Each pattern's cell is re-run R times in a fresh IPython kernel over jupyter_client, once per
cleanup: none (a plain cell), by hand (``del`` of the cell's names + ``clear_session()`` +
``gc.collect()`` at its top) and ``%%fresh_model``. The first line of the cell's own code reads
``tf.config.experimental.get_memory_info('CPU:0')['current']`` (after the cleanup): the bytes of
tensors the re-run starts with, exact to the byte (what on a GPU is VRAM). "kept" is the same
figure after the set-up cell, before any run: what the user's kept names hold (a kept base
model), plus what a data name the cell rebinds holds in TF tensors (a tf.data pipeline's copy
of the inputs), read by deleting it after the runs. Writes ``benchmarks/results/allocator.json``.

Target: under ``%%fresh_model`` every re-run starts at <= kept + 1 MB, on every pattern.

    python benchmarks/allocator.py [--runs 6] [--only functional ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from leak_loop import _execute, _value, save
from notebook_patterns import STEP
from notebook_patterns import SUBCLASSED as SUBCLASSED_256

RESULTS = Path(__file__).parent / "results"
MB = 2**20
SETUP = """
import gc, numpy as np, tensorflow as tf
{keras}
rng = np.random.default_rng(0)
x = rng.random((2048, 100), dtype=np.float32); y = rng.integers(0, 10, 2048)
in_use = lambda: tf.config.experimental.get_memory_info("CPU:0")["current"]
def build(units=1024):
    m = keras.Sequential([keras.Input((100,)), keras.layers.Dense(units, activation="relu"),
                          keras.layers.Dense(units, activation="relu"), keras.layers.Dense(10)])
    m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m
starts = []
"""
FUNCTIONAL = """
inp = keras.Input((100,))
h = keras.layers.Dense(1024, activation="relu")(inp)
h = keras.layers.Dense(1024, activation="relu")(h)
out = keras.layers.Dense(10)(h)
model = keras.Model(inp, out)
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(x, y, epochs=1, batch_size=256, verbose=0)
"""
SEQUENTIAL = """
model = build()
history = model.fit(x, y, epochs=1, batch_size=256, verbose=0)
"""
SUBCLASSED = SUBCLASSED_256.replace("Dense(256", "Dense(1024")  # past TF's small-tensor pool
LOOP = """
model, opt = build(), keras.optimizers.Adam()
opt.build(model.trainable_variables)
for i in range(0, len(x), 256):
    loss = train_step(model, opt, x[i:i + 256], y[i:i + 256])
"""
BASE = """
base = keras.Sequential([keras.Input((100,)), keras.layers.Dense(1024, activation="relu"),
                         keras.layers.Dense(1024, activation="relu")], name="base")
base.trainable = False
"""
TRANSFER = """
inp = keras.Input((100,))
h = base(inp)
h = keras.layers.Dense(1024, activation="relu")(h)
out = keras.layers.Dense(10)(h)
model = keras.Model(inp, out)
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(x, y, epochs=1, batch_size=256, verbose=0)
"""
KFOLD = """
scores = []
for fold in range(4):
    model = build()
    history = model.fit(x[fold::4], y[fold::4], epochs=1, batch_size=256, verbose=0)
    scores.append(history.history["loss"][-1])
"""
SEARCH = """
results = {}
for units in (512, 1024, 1536):
    model = build(units)
    history = model.fit(x, y, epochs=1, batch_size=256, verbose=0)
    results[units] = history.history["loss"][-1]
"""
KERAS3, LEGACY = "import keras", "keras = tf.keras  # tf-keras: TF_USE_LEGACY_KERAS=1"
# pattern -> (set-up cell, model cell, names the hand cleanup deletes, legacy tf-keras?)
PATTERNS: dict[str, tuple[str, str, tuple[str, ...], bool]] = {
    "functional": ("", FUNCTIONAL, ("inp", "h", "out", "model", "history"), False),
    "Sequential": ("", SEQUENTIAL, ("model", "history"), False),
    "subclassed train_step + tf.data": ("", SUBCLASSED, ("ds", "model", "history"), False),  # ds
    "tf.function from an earlier cell": (STEP, LOOP, ("model", "opt", "loss"), False),
    "transfer learning, kept base": (
        BASE,
        TRANSFER,
        ("inp", "h", "out", "model", "history"),
        False,
    ),
    "K-fold loop in one cell": ("", KFOLD, ("model", "history"), False),
    "hyperparameter loop": ("", SEARCH, ("model", "history"), False),
    "tf-keras (legacy)": ("", SEQUENTIAL, ("model", "history"), True),
}
READ = "starts.append(in_use())\n"
# Names of user data held in TF tensors: tf.data's from_tensor_slices keeps a copy of x. They
# are kept (data is never dropped) until the cell rebinds them, so they count as kept.
DATA = {"subclassed train_step + tf.data": ("ds",)}
CLEANUPS = {
    "none": lambda names: "# plain cell\n" + READ,
    "by hand": lambda names: (
        "".join(f"globals().pop({n!r}, None)\n" for n in names)
        + "keras.backend.clear_session()\ngc.collect()\n"
        + READ
    ),
    "%%fresh_model": lambda names: "%%fresh_model -q\n" + READ,
}


def run_pattern(pattern: str, cleanup: str, runs: int) -> dict[str, Any]:
    """Re-run one pattern's cell ``runs`` times in a fresh kernel; return its figures."""
    from jupyter_client.manager import start_new_kernel

    setup, cell, names, legacy = PATTERNS[pattern]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"}
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        keras = LEGACY if legacy else KERAS3
        _execute(kc, SETUP.format(keras=keras) + setup + "\n%load_ext kerasmagic")
        kept = _value(kc, "in_use()")
        started = time.perf_counter()
        for _ in range(runs):
            _execute(kc, CLEANUPS[cleanup](names) + cell)
        elapsed = time.perf_counter() - started
        starts = _value(kc, "starts")
        data = DATA.get(pattern, ())
        if data:
            before = _value(kc, "in_use()")
            _execute(kc, "".join(f"del {name}\n" for name in data) + "gc.collect()")
            kept += before - _value(kc, "in_use()")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return {
        "pattern": pattern,
        "cleanup": cleanup,
        "runs": runs,
        "kept_mb": round(kept / MB, 2),
        "start_mb": [round(s / MB, 2) for s in starts],
        "run_s_mean": round(elapsed / runs, 2),
    }


def table(rows: list[dict[str, Any]]) -> str:
    """Return a Markdown table: per pattern, each cleanup's allocator at re-run starts."""
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["pattern"], {})[r["cleanup"]] = r
    order = [c for c in CLEANUPS if any(c in v for v in by.values())]
    head = "| pattern | kept | " + " | ".join(f"{c}: runs 2, last" for c in order) + " |"
    lines = [head, "| --- | ---: | " + " | ".join("---:" for _ in order) + " |"]
    for pattern, found in by.items():
        kept = next(iter(found.values()))["kept_mb"]
        cells = []
        for c in order:
            s = found[c]["start_mb"] if c in found else None
            cells.append(f"{s[1]:.1f} → {s[-1]:.1f} MB" if s else "–")
        lines.append(f"| {pattern} | {kept:.1f} MB | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--only", choices=list(PATTERNS), action="append", help="repeatable")
    parser.add_argument("--cleanup", choices=list(CLEANUPS), action="append", help="repeatable")
    args = parser.parse_args()
    rows = []
    for pattern in args.only or PATTERNS:
        for cleanup in args.cleanup or CLEANUPS:
            rows.append(run_pattern(pattern, cleanup, args.runs))
            print(f"{pattern}, {cleanup}: {rows[-1]['start_mb']}", file=sys.stderr, flush=True)
    print(table(rows))
    targets = {
        f"{r['pattern']}: every re-run starts <= kept + 1 MB": max(r["start_mb"][1:])
        <= r["kept_mb"] + 1
        for r in rows
        if r["cleanup"] == "%%fresh_model"
    }
    save("allocator", args, rows, targets)


if __name__ == "__main__":
    main()
