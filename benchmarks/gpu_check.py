"""GPU check for isolation: the kernel's VRAM stays flat across isolated trials.

1. VRAM this process holds (NVML) before and after 5 isolated Keras trials: must be equal,
   since TensorFlow only ever starts inside the children.
2. The same tiny fit as ``%%fresh_model`` (in this process) and ``%%fresh_model --isolate``,
   side by side: wall time, and this process's VRAM and RSS afterwards.

3. NVML: time of the first reading (nvmlInit), of a reading through the 150 ms deadline the cell
   hooks use (median and worst of 200; none may come back stale), and of the recovery after a
   user's own ``pynvml.nvmlShutdown()``.

Run: ``python benchmarks/gpu_check.py`` (prints JSON). Without a GPU it says so and still runs
every code path on CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kerasmagic
from kerasmagic.probes import nvml, read_ram
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
    gpus = read_gpus(timeout_s=10)  # a figure, not a cell hook: wait for a fresh one
    if not gpus.devices:
        return None
    return sum(d.process_used_bytes or 0 for d in gpus.devices)


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    return fn(), (time.perf_counter() - start) * 1000


def nvml_checks(reads: int = 200) -> dict[str, Any]:
    """Return NVML's start-up, per-reading and restart-after-user-shutdown figures (ms)."""
    nvml.shutdown()
    first, init_ms = _timed(lambda: read_gpus(timeout_s=30))
    if first.status != "ok":
        return {"status": first.status, "message": first.message, "first_read_ms": init_ms}
    timed = [_timed(read_gpus) for _ in range(reads)]
    ms = sorted(t for _, t in timed)
    import pynvml

    while True:  # what a user's own cell does, until NVML is really down
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError_Uninitialized:
            break
    again, restart_ms = _timed(lambda: read_gpus(timeout_s=30))
    return {
        "first_read_ms": round(init_ms, 1),
        "read_median_ms": round(ms[len(ms) // 2], 3),
        "read_max_ms": round(ms[-1], 3),
        "stale_or_failed_reads": sum(r.status != "ok" for r, _ in timed),
        "deadline_ms": nvml.DEADLINE_S * 1000,
        "after_user_shutdown": {"status": again.status, "message": again.message},
        "restart_ms": round(restart_ms, 1),
        "process_notes": sorted({d.process_note or "-" for d in again.devices}),
    }


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
    gpus = read_gpus(timeout_s=30)
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
        "nvml": nvml_checks(),
        "isolated_trials": TRIALS,
        "isolated_trials_wall_s": round(isolated_s, 2),
        "trial_losses": [round(v, 4) for v in losses],
        "side_by_side": side_by_side(),  # isolated first: in-process starts TF in this process
        "gpu_tests": gpu_tests(),  # TF, JAX and PyTorch on the GPU, each backend in its own process
    }


def gpu_tests() -> dict[str, str]:
    """Run ``pytest -m gpu tests/test_gpu.py``; return each test's outcome (passed/failed/...)."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-m", "gpu",
         str(root / "tests" / "test_gpu.py")],
        capture_output=True, text=True, cwd=root,
    )  # fmt: skip
    outcomes = {}
    for line in done.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "SKIPPED", "ERROR"):
            outcomes[rest.split(" - ")[0]] = word.lower()
    return outcomes or {"pytest": done.stdout[-500:]}


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
