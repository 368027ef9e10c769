"""The leak loop behind ``kerasmagic demo`` and ``benchmarks/leak_loop.py``.

Each variant runs in its own fresh process (``python -m kerasmagic._demo VARIANT ...``) so one
variant's leftovers cannot colour another's figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kerasmagic.compat.registry import works

# What each variant does between models: the progress line's label and the table's first column.
VARIANTS = {
    "none": "no cleanup (model reassigned)",
    "keras": "del + keras clear_session() + gc.collect()",
    "kerasmagic": "with kerasmagic.reset() (as %%fresh_model)",
}


@dataclass(frozen=True)
class LoopResult:
    """Per-model figures of one variant."""

    variant: str
    models: int
    rss_mb_per_model: float
    objects_per_model: float
    cleanup_s_median: float | None
    rss_mb: list[float]
    last_layer_name: str


def slope(values: list[float], skip: int) -> float:
    """Return the Theil-Sen slope of ``values`` per index after ``skip`` (robust to the
    allocator's one-off jumps): the median of the slopes between every pair of points."""
    ys = values[skip:]
    pairs = [(ys[j] - ys[i]) / (j - i) for i in range(len(ys)) for j in range(i + 1, len(ys))]
    return statistics.median(pairs) if pairs else 0.0


def run_loop(
    variant: str,
    models: int,
    samples: int,
    skip: int,
    on_model: Callable[[int], None] | None = None,
) -> LoopResult:
    """Build, fit and predict ``models`` models in this process with one cleanup variant;
    call ``on_model(n)`` after the n-th model."""
    import keras
    import numpy as np
    import psutil

    import kerasmagic

    rng = np.random.default_rng(0)
    x = rng.random((samples, 100), dtype=np.float32)
    y = rng.integers(0, 10, samples)
    proc, rss, objects, cleanup = psutil.Process(), [], [], []
    name = ""
    for _ in range(models):
        start = time.perf_counter()
        if variant == "kerasmagic":
            kerasmagic.reset()
        elif variant == "keras" and name:
            keras.backend.clear_session()
            gc.collect()
        if name and variant != "none":
            cleanup.append(time.perf_counter() - start)
        hidden = [keras.layers.Dense(256, activation="relu") for _ in range(2)]
        model = keras.Sequential([keras.Input((100,)), *hidden, keras.layers.Dense(10)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, epochs=1, verbose=0)
        model.predict(x[:256], verbose=0)
        name = model.layers[-1].name
        if variant == "keras":
            del model
        gc.collect()
        rss.append(proc.memory_info().rss / 2**20)
        objects.append(float(len(gc.get_objects())) if works("cpython.referrers") else 0.0)
        if on_model is not None:
            on_model(len(rss))
    slopes = round(slope(rss, skip), 4), round(slope(objects, skip), 1)
    median = None if not cleanup else round(sorted(cleanup)[len(cleanup) // 2], 4)
    return LoopResult(variant, models, *slopes, median, [round(r, 2) for r in rss], name)


def run_variant_process(
    variant: str,
    models: int,
    samples: int,
    skip: int,
    on_progress: Callable[[int], None] | None = None,
) -> LoopResult:
    """Run one variant in a fresh Python process and return its result; ``on_progress(n)`` is
    called in this process as the child finishes its n-th model."""
    found: list[dict[str, Any]] = []

    def take(message: dict[str, Any]) -> None:
        if "done" in message and on_progress is not None:
            on_progress(int(message["done"]))
        elif "variant" in message:
            found.append(message)

    code, err = _run_child([variant, str(models), str(samples), str(skip)], {}, take)
    if code != 0 or not found:
        raise RuntimeError(f"{variant} loop failed:\n{err}")
    return LoopResult(**found[-1])


def _run_child(
    args: list[str], env: dict[str, str], take: Callable[[dict[str, Any]], None]
) -> tuple[int, str]:
    """Run ``python -m kerasmagic._demo ARGS`` on the CPU, pass each JSON object it prints to
    ``take`` as it comes; return its exit status and the tail of its stderr."""
    env = {**os.environ, **env, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "kerasmagic._demo", *args]
    # stderr goes to a file: TensorFlow may write more than a pipe holds while we read stdout.
    with tempfile.TemporaryFile("w+") as err:
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env) as proc:
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    try:
                        message = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(message, dict):
                        take(message)
            except BaseException:  # Ctrl-C or a failing callback: stop the child, then re-raise
                proc.kill()
                raise
        err.seek(0)
        return proc.returncode, err.read()[-3000:]


def table(results: list[LoopResult]) -> str:
    """Return the per-model memory table printed by ``kerasmagic demo``."""
    head = f"{'cleanup between models':<48} {'RSS MB/model':>12} {'objects/model':>13} "
    head += f"{'cleanup s':>9}  last layer name"
    rows = [head, "-" * len(head)]
    for r in results:
        cleanup = "-" if r.cleanup_s_median is None else f"{r.cleanup_s_median:.3f}"
        rows.append(
            f"{VARIANTS[r.variant]:<48} {r.rss_mb_per_model:>12.3f} "
            f"{r.objects_per_model:>13.0f} {cleanup:>9}  {r.last_layer_name}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Child entry point: run one variant, print ``{"done": n}`` after each model and the
    result as the last JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("variant", choices=sorted(VARIANTS))
    for number in ("models", "samples", "skip"):
        parser.add_argument(number, type=int)
    args = parser.parse_args(argv)

    def report(done: int) -> None:
        print(json.dumps({"done": done}), flush=True)

    loop = run_loop(args.variant, args.models, args.samples, args.skip, on_model=report)
    print(json.dumps(asdict(loop)), flush=True)
    return 0


# -- the K-fold story ----------------------------------------------------------------------
# The K-fold story behind ``kerasmagic demo``'s last part and ``benchmarks/oom.py``.
#
# Ten folds of a 256-1024-1024-10 model in one loop, with TensorFlow's allocator capped the way
# a GPU's memory is (TF's GPU allocator put on the CPU, capped at ``CAP_MB``): cleaned up by hand
# in the loop, or a plain loop in a ``%%fresh_model`` cell. Each variant runs in its own process
# (``python -m kerasmagic._demo folds VARIANT``), in an IPython shell, and prints one JSON line
# per fold it finished and one for the error that stopped it, if any.
CAP_MB = 160
FOLDS = 10
CAP_ENV = {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": str(CAP_MB)}
SETUP = """
import gc, json, numpy as np, keras, tensorflow as tf
rng = np.random.default_rng(0)
x = rng.random((2048, 256), dtype=np.float32); y = rng.integers(0, 10, 2048)
in_use = lambda: tf.config.experimental.get_memory_info("CPU:0")["current"]
def build(width=1024):
    m = keras.Sequential([keras.Input((256,)), keras.layers.Dense(width, activation="relu"),
                          keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)])
    m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m
def done(fold):
    print(json.dumps({"fold": fold, "in_use": in_use()}), flush=True)
"""
FOLD = """
    model = build()
    history = model.fit(x, y, epochs=1, batch_size=128, verbose=0)
"""
HAND = f"""
for fold in range(1, {FOLDS + 1}):{FOLD}    del model, history
    keras.backend.clear_session()
    gc.collect()
    done(fold)
"""
PLAIN = f"""%%fresh_model -q
for fold in range(1, {FOLDS + 1}):{FOLD}    done(fold)
"""
# variant -> (its label, whether kerasmagic is loaded, the loop cell)
FOLD_VARIANTS = {
    "hand": ("cleanup by hand in the loop (del, clear_session, gc)", False, HAND),
    "kerasmagic": ("%%fresh_model on the cell, a plain loop", True, PLAIN),
}


@dataclass
class FoldsResult:
    """How far one variant got: the allocator after each finished fold, and what stopped it."""

    variant: str
    in_use_bytes: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def folds(self) -> int:
        """Return the folds finished."""
        return len(self.in_use_bytes)

    def words(self) -> str:
        """Return the outcome as a user would say it."""
        if self.folds == FOLDS:
            flat = max(self.in_use_bytes[2:] or self.in_use_bytes)
            return f"ran all {FOLDS} folds, the allocator flat at {flat / 2**20:.1f} MB"
        return f"ran out of memory at fold {self.folds + 1} of {FOLDS}"


def run_in_shell(variant: str) -> int:
    """Child entry point: run one variant's loop in an IPython shell in this process."""
    from IPython.core.interactiveshell import InteractiveShell

    _, loaded, cell = FOLD_VARIANTS[variant]
    shell = InteractiveShell.instance()
    if loaded:
        shell.run_line_magic("load_ext", "kerasmagic")
    shell.run_cell(SETUP, silent=True)
    result = shell.run_cell(cell)
    error = result.error_before_exec or result.error_in_exec
    if error is not None:
        print(json.dumps({"error": type(error).__name__}), flush=True)
    return 0


def run_folds_process(variant: str, on_fold: Callable[[int], None] | None = None) -> FoldsResult:
    """Run one variant in a fresh capped process; ``on_fold(n)`` as it finishes fold n."""
    result = FoldsResult(variant)

    def take(message: dict[str, Any]) -> None:
        if "fold" in message:
            result.in_use_bytes.append(int(message["in_use"]))
            if on_fold is not None:
                on_fold(result.folds)
        elif "error" in message:
            result.error = str(message["error"])

    code, err = _run_child(["folds", variant], CAP_ENV, take)
    if code != 0 and result.error is None:
        # TF 2.21's capped CPU allocator can crash, rather than raise, when it runs out
        # inside a traced step: the process is gone, and so is its memory.
        result.error = f"the process died (exit {code}) out of memory"
        if result.folds == 0:
            raise RuntimeError(f"{variant} folds failed:\n{err}")
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["folds"]:
        raise SystemExit(run_in_shell(sys.argv[2]))
    raise SystemExit(main())
