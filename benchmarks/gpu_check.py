"""GPU check for isolation: the kernel's VRAM stays flat across isolated trials.

1. VRAM this process holds (NVML) before and after 5 isolated Keras trials: must be equal,
   since TensorFlow only ever starts inside the children.
2. The same tiny fit as ``%%fresh_model`` (in this process) and ``%%fresh_model --isolate``,
   side by side: wall time, and this process's VRAM and RSS afterwards.

Run: ``python benchmarks/gpu_check.py`` (prints JSON). Without a GPU it says so and still runs
every code path on CPU.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kerasmagic
from kerasmagic.probes import read_ram
from kerasmagic.probes.nvml import read_gpus

TRIALS = 5
FIT = """
import numpy as np, keras
x = np.random.default_rng(0).random((512, 32), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 2, 512)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(2)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
loss = float(model.fit(x, y, epochs=2, verbose=0).history["loss"][-1])
"""


def trial(seed: int) -> float:
    ns: dict[str, Any] = {}
    exec(FIT, ns)
    return float(ns["loss"]) + seed * 0.0


def vram_bytes() -> int | None:
    """Return the VRAM this process holds over all GPUs, or None without a GPU."""
    gpus = read_gpus()
    if not gpus.devices:
        return None
    return sum(d.process_used_bytes or 0 for d in gpus.devices)


def side_by_side() -> dict[str, Any]:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "kerasmagic")
    rows = {}
    for name, line in (("isolate", "--isolate -q --outputs loss"), ("in_process", "-q")):
        start = time.perf_counter()
        shell.run_cell_magic("fresh_model", line, FIT)
        rows[name] = {
            "wall_s": round(time.perf_counter() - start, 2),
            "kernel_vram_bytes_after": vram_bytes(),
            "kernel_rss_bytes_after": read_ram().rss_bytes,
            "loss": round(float(shell.user_ns["loss"]), 4),
        }
    return rows


def main() -> dict[str, Any]:
    gpus = read_gpus()
    before = vram_bytes()
    start = time.perf_counter()
    losses = [kerasmagic.run_isolated(trial, i) for i in range(TRIALS)]
    isolated_s = time.perf_counter() - start
    after = vram_bytes()
    return {
        "gpu": [d.name for d in gpus.devices] or f"no GPU ({gpus.status}: {gpus.message})",
        "kernel_vram_bytes_before": before,
        "kernel_vram_bytes_after_isolated_trials": after,
        "vram_flat": None if before is None else before == after,
        "isolated_trials": TRIALS,
        "isolated_trials_wall_s": round(isolated_s, 2),
        "trial_losses": [round(v, 4) for v in losses],
        "side_by_side": side_by_side(),  # isolated first: in-process starts TF in this process
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
