"""Memory per model: no cleanup vs. Keras's own vs. kerasmagic, in a script and in a real kernel.

Part 1 (one process per variant): N models built, fitted and predicted in a loop with (a) no
cleanup, (b) ``del`` + ``keras.backend.clear_session()`` + ``gc.collect()``, (c)
``with kerasmagic.fresh():``. Part 2 (a real IPython kernel over jupyter_client): one model cell
re-run R times, once with hand-written cleanup at its top and once under ``%%fresh_model``.
Prints RSS slope (MB/model), live-object slope and cleanup time; writes
``benchmarks/results/leak_loop.json``. Targets: kerasmagic's RSS slope <= 0.1 MB/model and
<= 5% of Keras's; median cleanup <= 0.5 s; the same in the kernel.

    python benchmarks/leak_loop.py [--models 60] [--samples 20000] [--runs 30]
                                   [--skip-script] [--skip-kernel]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import psutil

from kerasmagic._demo import VARIANTS, run_variant_process, slope, table

RESULTS = Path(__file__).parent / "results"
SETUP = """
import gc, os, time, numpy as np, keras, tensorflow as tf
starts = []  # TF's allocator as each re-run's own code starts (after any cleanup)
rng = np.random.default_rng(0)
x = rng.random(({samples}, 100), dtype=np.float32); y = rng.integers(0, 10, {samples})
def build():
    m = keras.Sequential([keras.Input((100,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m
"""
BODY = (
    "starts.append(tf.config.experimental.get_memory_info('CPU:0')['current'])\n"
    "model = build()\nhistory = model.fit(x, y, epochs=1, verbose=0)\n"
    "model.predict(x[:256], verbose=0)"
)
CELLS = {
    "hand-written cleanup (del, clear_session, gc)": (
        "t0 = time.perf_counter()\ntry:\n    del model, history\nexcept NameError:\n    pass\n"
        "keras.backend.clear_session()\ngc.collect()\ncleanup_s = time.perf_counter() - t0\n" + BODY
    ),
    "%%fresh_model": "%%fresh_model -q\n" + BODY,
}


def _execute(kc: Any, code: str, timeout_s: float = 600) -> None:
    msg_id = kc.execute(code)
    while True:
        msg = kc.get_iopub_msg(timeout=timeout_s)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            raise RuntimeError("\n".join(msg["content"]["traceback"]))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return


def kernel_variant(
    name: str, cell: str, runs: int, samples: int, before: str = ""
) -> dict[str, Any]:
    """Re-run one model cell ``runs`` times in a fresh kernel (after running ``before`` once);
    return its per-run figures."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(
        kernel_name="python3", env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    )
    try:
        _execute(kc, SETUP.format(samples=samples) + "\n%load_ext kerasmagic\npid = os.getpid()")
        if before:
            _execute(kc, before)
        proc = psutil.Process(km.provisioner.process.pid)  # type: ignore[union-attr]
        rss, times = [], []
        for _ in range(runs):
            start = time.perf_counter()
            _execute(kc, cell)
            times.append(time.perf_counter() - start)
            rss.append(proc.memory_info().rss / 2**20)
        starts = _value(kc, "starts")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return {
        "variant": name,
        "runs": runs,
        "rss_mb_per_run": round(slope(rss, 5), 4),
        "run_s_median": round(statistics.median(times), 3),
        "rss_mb": [round(r, 1) for r in rss],
        "allocator_start_mb": [round(s / 2**20, 2) for s in starts],
    }


def _value(kc: Any, expr: str) -> Any:
    """Return ``expr`` evaluated in the kernel, through JSON."""
    msg_id = kc.execute(f"import json as _j; print(_j.dumps({expr}))")
    out = ""
    while True:
        msg = kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return json.loads(out.strip().splitlines()[-1])


def save(name: str, args: argparse.Namespace, rows: list[Any], targets: dict[str, bool]) -> None:
    """Print the targets and write ``benchmarks/results/NAME.json`` with the machine."""
    print("targets:", ", ".join(f"{k} {'OK' if v else 'MISSED'}" for k, v in targets.items()))
    RESULTS.mkdir(exist_ok=True)
    out = {"args": vars(args), "machine": platform.platform(), "cpus": os.cpu_count()}
    out |= {"rows": rows, "targets": targets}
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=60)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--skip-kernel", action="store_true")
    parser.add_argument("--skip-script", action="store_true")
    args = parser.parse_args()
    script = (
        []
        if args.skip_script
        else [run_variant_process(v, args.models, args.samples, skip=5) for v in VARIANTS]
    )
    if script:
        print(table(script))
    kernel = (
        []
        if args.skip_kernel
        else [kernel_variant(name, cell, args.runs, args.samples) for name, cell in CELLS.items()]
    )
    for k in kernel:
        start = k["allocator_start_mb"]
        print(
            f"kernel, {k['variant']:<48} {k['rss_mb_per_run']:>8.3f} MB/run, "
            f"{k['run_s_median']:.2f} s/run, TF allocator at re-run start "
            f"{start[1]:.2f} -> {start[-1]:.2f} MB"
        )
    checks = {}
    if script:
        ours, theirs = script[2].rss_mb_per_model, script[1].rss_mb_per_model
        checks["script_slope_le_0.1"] = ours <= 0.1
        checks["script_slope_le_5pct_of_keras"] = ours <= 0.05 * theirs
        checks["reset_median_le_0.5s"] = (script[2].cleanup_s_median or 0) <= 0.5
    if kernel:
        checks["kernel_slope_le_0.1"] = kernel[1]["rss_mb_per_run"] <= 0.1
        checks["kernel_slope_le_5pct_of_hand"] = kernel[1]["rss_mb_per_run"] <= 0.05 * max(
            kernel[0]["rss_mb_per_run"], 1e-9
        )
    print("targets:", ", ".join(f"{k} {'OK' if v else 'MISSED'}" for k, v in checks.items()))
    RESULTS.mkdir(exist_ok=True)
    out = {
        "args": vars(args),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "script": [vars(r) for r in script],
        "kernel": kernel,
        "targets": checks,
    }
    (RESULTS / "leak_loop.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
