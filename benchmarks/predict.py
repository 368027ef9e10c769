"""Know before fit: ``predict_fit``'s peak against the allocator's peak of the real fit.

Eight models of different kinds (a dense MLP, a CNN with BatchNorm and Dropout, an LSTM over an
Embedding, a transformer block, a functional two-input model, a subclassed model with its own
``train_step``, a mixed-precision dense net, a frozen "pretrained" base under a new head), each at
three batch sizes. Each (model, batch) runs in its own process, as a notebook's cell would:
build and compile the model, ``predict_fit`` (a fit of 2,048 samples with 256 validation
samples), then the real ``fit`` with ``fit``'s own defaults; the measured peak is TF's allocator
peak over that fit, training and validation steps included. TF's BFC allocator is on for the
CPU (``TF_CPU_ALLOCATOR_USE_BFC=true``): exact bytes, as on a GPU. On the CPU, TF runs ops one at
a time (``set_inter_op_parallelism_threads(1)``), as a GPU dispatches its kernels (inline, in
order): with TF's default threads, independent ops run side by side, which tensors are alive
at once varies, and the same fit's peak moved by up to 24% within a process, more between
processes (``--parallel`` measures that way). On a GPU machine the same script measures
``GPU:0`` with TF's defaults.

Writes ``benchmarks/results/predict.json``; prints the table, the median and worst error.

    python benchmarks/predict.py [--kinds mlp cnn] [--batches 64 128 256]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(os.environ.get("KERASMAGIC_RESULTS", Path(__file__).parent / "results"))
KINDS = ("mlp", "cnn", "lstm", "transformer", "multi", "subclassed", "mixed", "frozen")
BATCHES = (64, 128, 256)
SAMPLES, VALIDATION = 2048, 256
REPEATS = 3  # real fits measured: on the CPU their peaks vary (tf.data's threads)


def data(kind: str, n: int, seed: int) -> tuple[Any, Any]:
    import numpy as np

    r = np.random.default_rng(seed)
    if kind == "mlp":
        return r.random((n, 3072), "float32"), r.integers(0, 10, n)
    if kind == "mixed":
        return r.random((n, 512), "float32"), r.integers(0, 10, n)
    if kind in ("cnn", "frozen"):
        return r.random((n, 32, 32, 3), "float32"), r.integers(0, 10, n)
    if kind == "lstm":
        return r.integers(0, 5000, (n, 80)), r.integers(0, 2, n).astype("float32")
    if kind == "transformer":
        return r.random((n, 64, 64), "float32"), r.integers(0, 4, n)
    if kind == "multi":
        images, table = r.random((n, 28, 28, 1), "float32"), r.random((n, 20), "float32")
        return {"img": images, "tab": table}, r.integers(0, 3, n)
    return r.random((n, 256), "float32"), r.random((n, 1), "float32")  # subclassed


def model(kind: str) -> Any:
    import keras
    from keras import layers as L

    if kind == "subclassed":
        return _subclassed(keras, L)
    if kind == "mlp":
        m = keras.Sequential([keras.Input((3072,)), L.Dense(1024, activation="relu"),
                              L.Dense(1024, activation="relu"), L.Dense(10)])  # fmt: skip
    elif kind == "cnn":
        m = keras.Sequential([
            keras.Input((32, 32, 3)), L.Conv2D(32, 3, padding="same", activation="relu"),
            L.BatchNormalization(), L.Conv2D(64, 3, padding="same", activation="relu"),
            L.MaxPooling2D(), L.Conv2D(64, 3, padding="same", activation="relu"),
            L.GlobalAveragePooling2D(), L.Dropout(0.3), L.Dense(10),
        ])  # fmt: skip
    elif kind == "lstm":
        m = keras.Sequential([keras.Input((80,), dtype="int32"), L.Embedding(5000, 64),
                              L.LSTM(128), L.Dense(1, activation="sigmoid")])  # fmt: skip
    elif kind == "transformer":
        tokens = keras.Input((64, 64))
        h = L.LayerNormalization()(tokens + L.MultiHeadAttention(4, 32)(tokens, tokens))
        h = L.LayerNormalization()(h + L.Dense(64)(L.Dense(256, activation="relu")(h)))
        m = keras.Model(tokens, L.Dense(4)(L.GlobalAveragePooling1D()(h)))
    elif kind == "multi":
        images, table = keras.Input((28, 28, 1), name="img"), keras.Input((20,), name="tab")
        h = L.Flatten()(L.MaxPooling2D()(L.Conv2D(16, 3, activation="relu")(images)))
        out = L.Dense(3)(L.concatenate([h, L.Dense(64, activation="relu")(table)]))
        m = keras.Model({"img": images, "tab": table}, out)
    elif kind == "mixed":  # small and dense: float16 math crawls on a CPU (minutes a fit)
        half = "mixed_float16"
        m = keras.Sequential([
            keras.Input((512,)), L.Dense(256, activation="relu", dtype=half),
            L.Dense(256, activation="relu", dtype=half), L.Dense(10, dtype="float32"),
        ])  # fmt: skip
    else:  # frozen: a "pretrained" base, not trained, under a new head
        base = keras.Sequential([
            keras.Input((32, 32, 3)), L.Conv2D(64, 3, padding="same", activation="relu"),
            L.Conv2D(64, 3, padding="same", activation="relu"), L.MaxPooling2D(),
            L.Conv2D(128, 3, padding="same", activation="relu"),
        ], name="base")  # fmt: skip
        base.trainable = False
        m = keras.Sequential([base, L.GlobalAveragePooling2D(), L.Dense(10)])
    loss = ("binary_crossentropy" if kind == "lstm"
            else keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # fmt: skip
    m.compile(optimizer="adam", loss=loss, metrics=["accuracy"])
    return m


def _subclassed(keras: Any, L: Any) -> Any:
    import tensorflow as tf

    class Regressor(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = [L.Dense(1024, activation="relu"), L.Dense(512, activation="relu")]
            self.out = L.Dense(1)
            self.tracker = keras.metrics.Mean(name="loss")

        def call(self, x: Any, training: bool = False) -> Any:
            for layer in self.hidden:
                x = layer(x)
            return self.out(x)

        def train_step(self, data: Any) -> dict[str, Any]:
            x, y = data
            with tf.GradientTape() as tape:
                loss = keras.ops.mean((self(x, training=True) - y) ** 2)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

        def test_step(self, data: Any) -> dict[str, Any]:
            x, y = data
            self.tracker.update_state(keras.ops.mean((self(x) - y) ** 2))
            return {"loss": self.tracker.result()}

        @property
        def metrics(self) -> list[Any]:
            return [self.tracker]

    m = Regressor()
    m.compile(optimizer="adam")
    return m


def one(kind: str, batch: int, parallel: bool = False) -> dict[str, Any]:
    """Predict, then fit, in this process; return both peaks and both times."""
    import tensorflow as tf

    import kerasmagic

    tf.get_logger().setLevel("ERROR")
    on_gpu = bool(tf.config.list_physical_devices("GPU"))  # starts nothing: threads still set
    if not on_gpu and not parallel:
        tf.config.threading.set_inter_op_parallelism_threads(1)
    device = "GPU:0" if on_gpu else "CPU:0"
    x, y = data(kind, SAMPLES, 0)
    validation = data(kind, VALIDATION, 1)
    m = model(kind)
    started = time.perf_counter()
    p = kerasmagic.predict_fit(m, x, y, batch_size=batch, validation_data=validation,
                               verbose=False)  # fmt: skip
    predict_s = time.perf_counter() - started
    experimental = tf.config.experimental
    before = int(experimental.get_memory_info(device)["current"])
    fits, fit_s = [], 0.0
    for _ in range(REPEATS):  # each traced again, as the first fit after the prediction is
        gc.collect()  # the fit before left its dataset (a copy of unaligned arrays) in cycles
        experimental.reset_memory_stats(device)
        started = time.perf_counter()
        m.fit(x, y, batch_size=batch, validation_data=validation, verbose=0)
        fit_s = fit_s or time.perf_counter() - started
        fits.append(int(experimental.get_memory_info(device)["peak"]))
        m.train_function = m.test_function = None
    return {
        "kind": kind, "batch": batch, "device": device, "predicted": p.peak_bytes,
        "measured": max(fits), "fits": fits, "in_use_before": before, "probes": p.probes,
        "predict_s": predict_s, "fit_s": fit_s,
        "steps": -(-SAMPLES // batch) + -(-VALIDATION // batch),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=KINDS, choices=KINDS)
    parser.add_argument("--batches", nargs="+", type=int, default=BATCHES)
    parser.add_argument("--parallel", action="store_true", help="TF's default inter-op threads")
    parser.add_argument("--one", nargs=2, metavar=("KIND", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.parallel)))
        return
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "3"}
    rows = []
    print(f"{'model':<12}{'batch':>6}{'predicted MB':>14}{'real fits MB':>16}{'error':>8}"
          f"{'nearest':>9}{'predict s':>11}{'fit s':>7}")  # fmt: skip
    for kind in args.kinds:
        for batch in args.batches:
            child = [sys.executable, __file__, "--one", kind, str(batch)]
            run = subprocess.run(child + ["--parallel"] * args.parallel, env=env,
                                 capture_output=True, text=True, check=True)  # fmt: skip
            row = json.loads(run.stdout.strip().splitlines()[-1])
            row["error"] = (row["predicted"] - row["measured"]) / row["measured"]
            low, high = min(row["fits"]), max(row["fits"])
            nearest = min(max(row["predicted"], low), high)  # the real fit nearest the prediction
            row["spread"] = (high - low) / high
            row["error_to_nearest"] = (row["predicted"] - nearest) / nearest
            rows.append(row)
            print(f"{kind:<12}{batch:>6}{row['predicted'] / 2**20:>14.1f}"
                  f"{low / 2**20:>8.1f}-{high / 2**20:<7.1f}{row['error']:>+8.1%}"
                  f"{row['error_to_nearest']:>+9.1%}{row['predict_s']:>11.1f}"
                  f"{row['fit_s']:>7.1f}", flush=True)  # fmt: skip
    summary: dict[str, Any] = {"cases": len(rows)}
    for name, key in (("vs the highest real fit", "error"),
                      ("vs the nearest real fit", "error_to_nearest")):  # fmt: skip
        errors = [abs(r[key]) for r in rows]
        summary[key] = {"median_abs": statistics.median(errors), "worst_abs": max(errors),
                        "within_10_percent": sum(e <= 0.10 for e in errors)}  # fmt: skip
        print(
            f"{name}: median |error| {statistics.median(errors):.1%}, worst "
            f"{max(errors):.1%}, {sum(e <= 0.10 for e in errors)} of {len(rows)} within 10%"
        )
    spreads = [r["spread"] for r in rows]
    summary["median_spread"], summary["worst_spread"] = statistics.median(spreads), max(spreads)
    print(
        f"the same fit's peak, {REPEATS} runs: spread (highest-lowest)/highest median "
        f"{statistics.median(spreads):.1%}, worst {max(spreads):.1%}"
    )
    RESULTS.mkdir(exist_ok=True)
    out = {"python": platform.python_version(), "parallel": args.parallel, "rows": rows, **summary}
    name = "predict-parallel.json" if args.parallel else "predict.json"
    (RESULTS / name).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
