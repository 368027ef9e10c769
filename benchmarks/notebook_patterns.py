"""Memory per re-run of notebook patterns that go beyond ``model = build(); model.fit()``.

Each pattern's model cell is re-run R times in a fresh IPython kernel over jupyter_client, once
as a plain cell (no cleanup) and once under ``%%fresh_model``:

- ``tf.function loop``: ``train_step(model, opt, x, y)`` decorated with ``@tf.function`` in an
  earlier cell; the re-run cell builds a new model and optimizer and runs a custom loop.
- ``train_step + tf.data``: a subclassed model with its own ``train_step``, fed by
  ``from_tensor_slices(...).map(...).batch(...).prefetch(...)``, fitted with ``fit``.

Prints the RSS slope per re-run (Theil-Sen, first ``--skip`` runs left out) and, between the
first measured run and the last, the change in ``train_step``'s traces, TF's function library
and the custom-gradient entries. Writes ``benchmarks/results/notebook_patterns.json``.
Target: <= 0.1 MB per re-run under ``%%fresh_model``.

    python benchmarks/notebook_patterns.py [--runs 25] [--samples 4096]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).parent))
from leak_loop import _execute, _value, save

from kerasmagic._demo import slope

RESULTS = Path(__file__).parent / "results"
SETUP = """
import os, numpy as np, keras, tensorflow as tf
from tensorflow.python.eager import context
from kerasmagic.backends.tensorflow.graphs import custom_gradient_count
rng = np.random.default_rng(0)
x = rng.random(({samples}, 100), dtype=np.float32); y = rng.integers(0, 10, {samples})
starts = []  # TF's allocator as each re-run's own code starts (after any cleanup)
"""
STEP = """
@tf.function
def train_step(model, opt, xb, yb):
    with tf.GradientTape() as tape:
        logits = model(xb, training=True)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(yb, logits, True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss
batches = [(x[i:i + 256], y[i:i + 256]) for i in range(0, len(x), 256)]
"""
LOOP = """
model = keras.Sequential([keras.Input((100,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
opt = keras.optimizers.Adam()
opt.build(model.trainable_variables)
for xb, yb in batches:
    loss = train_step(model, opt, xb, yb)
"""
SUBCLASSED = """
class Classifier(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(256, activation="relu")
        self.out = keras.layers.Dense(10)
    def call(self, inputs):
        return self.out(self.hidden(inputs))
    def train_step(self, data):
        xb, yb = data
        with tf.GradientTape() as tape:
            logits = self(xb, training=True)
            loss = self.compute_loss(x=xb, y=yb, y_pred=logits)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}
ds = tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 2.0, b))
ds = ds.batch(256).prefetch(tf.data.AUTOTUNE)
model = Classifier()
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(ds, epochs=1, verbose=0)
"""
TRIVIAL = "\nz = 1\n"  # what the kernel, IPython's history and kerasmagic's hooks add per cell
PATTERNS = {
    "tf.function loop": (STEP, LOOP),
    "train_step + tf.data": ("", SUBCLASSED),
    "trivial cell (baseline)": ("", TRIVIAL),
}
PROBE = (
    "[len(context.context().list_function_names()), custom_gradient_count(),"
    " train_step.experimental_get_tracing_count() if 'train_step' in globals() else 0]"
)
COUNTERS = ("functions", "custom_gradients", "traces")


def _probe(kc: Any) -> list[int]:
    """Run the probe; return (functions, custom-gradient entries, train_step traces)."""
    return [int(v) for v in _value(kc, PROBE)]


def kernel_pattern(pattern: str, magic: bool, runs: int, samples: int, skip: int) -> dict[str, Any]:
    """Re-run one pattern's cell ``runs`` times in a fresh kernel; return its figures."""
    from jupyter_client.manager import start_new_kernel

    setup, cell = PATTERNS[pattern]
    read = "\nstarts.append(tf.config.experimental.get_memory_info('CPU:0')['current'])"
    cell = ("%%fresh_model -q" if magic else "# plain cell") + read + cell
    km, kc = start_new_kernel(
        kernel_name="python3", env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    )
    try:
        _execute(kc, SETUP.format(samples=samples) + setup + "\n%load_ext kerasmagic")
        proc = psutil.Process(km.provisioner.process.pid)  # type: ignore[union-attr]
        rss, times, counts = [], [], []
        for i in range(runs):
            start = time.perf_counter()
            _execute(kc, cell)
            times.append(time.perf_counter() - start)
            rss.append(proc.memory_info().rss / 2**20)
            if i in (skip - 1, runs - 1):
                counts.append(_probe(kc))
        starts = _value(kc, "starts")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    growth = {name: b - a for name, a, b in zip(COUNTERS, counts[0], counts[-1], strict=True)}
    return {
        "pattern": pattern,
        "cleanup": "%%fresh_model" if magic else "none (plain cell)",
        "runs": runs,
        "rss_mb_per_run": round(slope(rss, skip), 4),
        "run_s_median": round(statistics.median(times), 3),
        "growth_over_measured_runs": growth,
        "rss_mb": [round(r, 1) for r in rss],
        "allocator_start_mb": [round(s / 2**20, 2) for s in starts],
    }


def table(rows: list[dict[str, Any]]) -> str:
    """Return the results as a Markdown table."""
    head = "| pattern | cleanup | RSS MB/re-run | TF allocator at re-run start, 2nd → last |"
    head += " s/run | +functions | +custom grads | +traces |"
    lines = [head, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        g = r["growth_over_measured_runs"]
        lines.append(
            f"| {r['pattern']} | {r['cleanup']} | {r['rss_mb_per_run']:.3f} | "
            f"{r['allocator_start_mb'][1]:.2f} → {r['allocator_start_mb'][-1]:.2f} MB | "
            f"{r['run_s_median']:.2f} | {g['functions']} | {g['custom_gradients']} | "
            f"{g['traces']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=25, help="re-runs under %%%%fresh_model")
    parser.add_argument("--plain-runs", type=int, default=12, help="re-runs as a plain cell")
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--skip", type=int, default=5, help="first re-runs left out of slopes")
    parser.add_argument("--only", choices=list(PATTERNS), action="append", help="repeatable")
    parser.add_argument("--no-plain", action="store_true", help="only %%%%fresh_model runs")
    args = parser.parse_args()
    rows = []
    plain = () if args.no_plain else ((False, args.plain_runs),)
    for pattern in args.only or PATTERNS:
        for magic, runs in (*plain, (True, args.runs)):
            rows.append(kernel_pattern(pattern, magic, runs, args.samples, args.skip))
            print(f"done: {pattern}, {rows[-1]['cleanup']}", file=sys.stderr, flush=True)
    print(table(rows))
    targets = {
        f"{r['pattern']}: <= 0.1 MB/re-run": r["rss_mb_per_run"] <= 0.1
        for r in rows
        if r["cleanup"] == "%%fresh_model"
    }
    save("notebook_patterns", args, rows, targets)


if __name__ == "__main__":
    main()
