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
import time
from dataclasses import asdict, dataclass
from typing import Any

VARIANTS = {
    "none": "no cleanup (model reassigned)",
    "keras": "del + keras clear_session() + gc.collect()",
    "kerasmagic": "with kerasmagic.fresh(): (kerasmagic.reset())",
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


def run_loop(variant: str, models: int, samples: int, skip: int) -> LoopResult:
    """Build, fit and predict ``models`` models in this process with one cleanup variant."""
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
        model = keras.Sequential(
            [
                keras.Input((100,)),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, epochs=1, verbose=0)
        model.predict(x[:256], verbose=0)
        name = model.layers[-1].name
        if variant == "keras":
            del model
        gc.collect()
        rss.append(proc.memory_info().rss / 2**20)
        objects.append(float(len(gc.get_objects())))
    return LoopResult(
        variant,
        models,
        round(slope(rss, skip), 4),
        round(slope(objects, skip), 1),
        None if not cleanup else round(sorted(cleanup)[len(cleanup) // 2], 4),
        [round(r, 2) for r in rss],
        name,
    )


def run_variant_process(variant: str, models: int, samples: int, skip: int) -> LoopResult:
    """Run one variant in a fresh Python process and return its result."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "kerasmagic._demo", variant, str(models), str(samples), str(skip)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{variant} loop failed:\n{out.stderr[-3000:]}")
    return LoopResult(**json.loads(out.stdout.strip().splitlines()[-1]))


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
    """Child entry point: run one variant and print its result as one JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("variant", choices=sorted(VARIANTS))
    parser.add_argument("models", type=int)
    parser.add_argument("samples", type=int)
    parser.add_argument("skip", type=int)
    args = parser.parse_args(argv)
    result: dict[str, Any] = asdict(run_loop(args.variant, args.models, args.samples, args.skip))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
