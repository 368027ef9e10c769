"""Op stack traces: TensorFlow's own capture vs kerasmagic's strings-only one (``tfstack``).

Op creation (µs per op) while tracing a ``tf.function`` and in a TF1 graph (``tf.Graph``), from
a shallow stack and from below the 32 padding frames a ``%%fresh_model`` cell runs under, for
ops on distinct lines (new stacks: kerasmagic's memo emptied first, as after a cleanup) and the
same ops again (repeated stacks); then the wall time of a first ``fit`` (it traces ~950 ops).
Variants are interleaved, each figure is the median of the repetitions and each ratio the
median of the per-repetition ratios (the machine is shared and noisy).
Writes ``benchmarks/results/stack_traces.json``. Target: every ratio <= 1.10.

    python benchmarks/stack_traces.py [--reps 15] [--ops 60] [--fits 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

from kerasmagic.backends.tensorflow import stack as tfstack
from kerasmagic.cleanup.cellrun import PADDING_FRAMES, run_padded

RESULTS = Path(__file__).parent / "results"
OPS = ("tf.raw_ops.AddV2(x=v, y=v)", "tf.raw_ops.Mul(x=v, y=v)", "tf.raw_ops.Relu(features=v)")
Timings = dict[str, list[float]]


def make_body(ops: int) -> Callable[[Any], Any]:
    """Return a function creating ``ops`` ops, each on its own line (so each its own stack)."""
    lines = [f"    v = {OPS[i % len(OPS)]}" for i in range(ops)]
    source = "def body(v):\n" + "\n".join(lines) + "\n    return v\n"
    scope: dict[str, Any] = {"tf": tf}
    exec(compile(source, "<stack_traces body>", "exec"), scope)
    return scope["body"]  # type: ignore[no-any-return]


def graph_us(body: Callable[[Any], Any], ops: int) -> float:
    with tf.Graph().as_default():
        v = tf.constant([1.0, 2.0, 3.0])
        start = time.thread_time()
        body(v)
        return (time.thread_time() - start) / ops * 1e6


def function_us(body: Callable[[Any], Any], ops: int) -> float:
    fn = tf.function(body, autograph=False)
    start = time.thread_time()
    fn.get_concrete_function(tf.TensorSpec([3]))  # one trace; its ops dominate the time
    return (time.thread_time() - start) / ops * 1e6


def deep(fn: Callable[..., float], *args: Any) -> float:
    return float(run_padded(fn, *args))


def use(capture: str) -> None:
    """Switch op stack traces to TensorFlow's (``native``) or kerasmagic's capture."""
    tfstack.uninstall()  # also empties the memo: each measurement starts cold
    if capture == "kerasmagic" and tfstack.install() is not None:
        raise SystemExit("kerasmagic could not patch this TensorFlow's tf_stack")


def op_creation(reps: int, ops: int) -> Timings:
    """Return µs/op per (capture, mode, depth, stacks) over ``reps`` interleaved repetitions."""
    body, out = make_body(ops), {}
    for rep in range(reps):
        captures = ("native", "kerasmagic") if rep % 2 == 0 else ("kerasmagic", "native")
        for capture in captures:
            use(capture)
            for mode, measure in (("tf.function", function_us), ("graph", graph_us)):
                for depth, call in (("shallow", _call), ("deep", deep)):
                    for stacks in ("new", "repeated"):  # the second run meets the same stacks
                        if stacks == "new":
                            tfstack.clear_cache()
                        key = f"{mode} | {depth} | {stacks} | {capture}"
                        out.setdefault(key, []).append(call(measure, body, ops))
    use("native")
    return out


def _call(fn: Callable[..., float], *args: Any) -> float:
    return fn(*args)


def first_fit(fits: int) -> Timings:
    """Return the wall time of a new model's first ``fit`` (tracing) per capture and depth."""
    import keras

    rng = np.random.default_rng(0)
    x, y = rng.random((64, 100), dtype=np.float32), rng.integers(0, 10, 64)

    def fit() -> float:
        model = keras.Sequential(
            [keras.Input((100,)), keras.layers.Dense(256, activation="relu"),
             keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)]
        )  # fmt: skip
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        start = time.perf_counter()
        model.fit(x, y, epochs=1, batch_size=32, verbose=0)
        return time.perf_counter() - start

    fit()  # one-time start-up costs out of the way
    out: Timings = {}
    for rep in range(fits):
        captures = ("native", "kerasmagic") if rep % 2 == 0 else ("kerasmagic", "native")
        for capture in captures:
            for depth, call in (("shallow", _call), ("deep", deep)):
                use(capture)
                keras.backend.clear_session(free_memory=False)
                out.setdefault(f"fit | {depth} | {capture}", []).append(call(fit))
    use("native")
    return out


def summarise(timings: Timings) -> list[dict[str, Any]]:
    """Pair each native row with kerasmagic's: medians and the median per-repetition ratio."""
    rows = []
    for key, native in timings.items():
        if not key.endswith("| native"):
            continue
        case = key.rsplit(" | ", 1)[0]
        ours = timings[f"{case} | kerasmagic"]
        ratios = [o / n for o, n in zip(ours, native, strict=True)]
        rows.append(
            {
                "case": case,
                "native": statistics.median(native),
                "kerasmagic": statistics.median(ours),
                "ratio": statistics.median(ratios),
            }
        )
    return rows


def table(rows: list[dict[str, Any]], unit: str) -> str:
    head = f"{'case':<44} {'native':>10} {'kerasmagic':>11} {'ratio':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['case']:<44} {r['native']:>8.1f}{unit} {r['kerasmagic']:>9.1f}{unit} "
            f"{r['ratio']:>7.3f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--ops", type=int, default=60)
    parser.add_argument("--fits", type=int, default=7)
    args = parser.parse_args()
    ops = summarise(op_creation(args.reps, args.ops))
    print(f"op creation, µs/op ({args.ops} ops; deep = +{PADDING_FRAMES} frames)")
    print(table(ops, "µs"))
    fits = summarise(first_fit(args.fits))
    for row in fits:
        row.update(native=row["native"] * 1e3, kerasmagic=row["kerasmagic"] * 1e3)
    print("\nfirst fit() of a new model (traces ~950 ops), wall ms")
    print(table(fits, "ms"))
    worst = max(r["ratio"] for r in ops + fits)
    print(
        f"\ntarget: every ratio <= 1.10: {'OK' if worst <= 1.10 else 'MISSED'} (worst {worst:.3f})"
    )
    RESULTS.mkdir(exist_ok=True)
    out = {
        "args": vars(args),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "tensorflow": tf.__version__,
        "op_creation_us": ops,
        "first_fit_ms": fits,
    }
    (RESULTS / "stack_traces.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
