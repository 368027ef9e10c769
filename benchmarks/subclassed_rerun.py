"""What a subclassed model with its own ``train_step``, fed by a ``tf.data`` pipeline, keeps per
re-run under ``%%fresh_model``: read through TensorFlow's allocator, Python's live objects and
glibc's malloc, beside RSS.

The cell of ``notebook_patterns.py``'s "train_step + tf.data" pattern (a ``keras.Model``
subclass defined in the cell, ``from_tensor_slices().map().batch().prefetch()``, ``fit``) is
re-run R times in a fresh kernel. After each run, in the kernel, after a collection:

- TF's allocator in use on ``CPU:0`` (exact; ``--units 1024`` so the weights, 400 KB a kernel,
  are counted: TF's CPU allocator serves tensors under 256 KB from a pool it does not count);
- Python's live objects tracked by gc, and of those the ones kerasmagic's own per-cell records
  hold (its history of cells, bounded by ``LiveMonitor.history_size``);
- Keras models alive, TF's function library;
- glibc's malloc in use and its arenas (``mallinfo2``), and RSS.

Prints one row per run and the per-run slopes (Theil-Sen, the first ``--skip`` runs left out);
writes ``benchmarks/results/subclassed_rerun.json``.

    python benchmarks/subclassed_rerun.py [--runs 20] [--units 1024]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).parent))
from leak_loop import _execute, _value, save
from notebook_patterns import SETUP, SUBCLASSED

from kerasmagic._demo import slope

PROBE_SETUP = """
import collections, ctypes, gc
from kerasmagic.live import get_monitor
from kerasmagic.snapshot import take_snapshot

class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]

def _malloc():
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd, info.arena + info.hblkhd

def _records_objects():
    # gc-tracked objects of kerasmagic's per-cell records: its record types and the plain
    # containers inside them (nothing else is followed: a record holds no user object)
    monitor = get_monitor(get_ipython())
    plain = (dict, list, tuple, collections.deque)
    seen, todo = set(), [monitor._history, monitor._runs_of]
    while todo:
        obj = todo.pop()
        mine = type(obj).__module__.startswith("kerasmagic.")
        if id(obj) in seen or not gc.is_tracked(obj) or not (mine or type(obj) in plain):
            continue
        seen.add(id(obj))
        todo.extend(gc.get_referents(obj))
    return len(seen)

def _probe():
    gc.collect()
    in_use, arenas = _malloc()
    snap = take_snapshot(globals())
    return {
        "tf_bytes": tf.config.experimental.get_memory_info("CPU:0")["current"],
        "objects": len(gc.get_objects()),
        "record_objects": _records_objects(),
        "models": snap.keras.live_models,
        "functions": len(context.context().list_function_names()),
        "malloc_in_use": in_use,
        "malloc_arenas": arenas,
    }
"""


def measure(
    runs: int, units: int, samples: int, env: dict[str, str], trim: bool
) -> list[dict[str, Any]]:
    """Re-run the cell ``runs`` times in a fresh kernel; return each run's figures."""
    from jupyter_client.manager import start_new_kernel

    cell = "%%fresh_model -q\n" + SUBCLASSED.replace("Dense(256", f"Dense({units}")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env}
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    probe = "(ctypes.CDLL(None).malloc_trim(0), _probe())[1]" if trim else "_probe()"
    try:
        _execute(kc, SETUP.format(samples=samples) + "\n%load_ext kerasmagic\n" + PROBE_SETUP)
        proc = psutil.Process(km.provisioner.process.pid)  # type: ignore[union-attr]
        rows = []
        for _ in range(runs):
            _execute(kc, cell)
            row = _value(kc, probe)
            row["rss"] = proc.memory_info().rss
            rows.append(row)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--units", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--skip", type=int, default=5, help="first re-runs left out of slopes")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the kernel")
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) before each read")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    rows = measure(args.runs, args.units, args.samples, env, args.trim)
    mb = 2**20
    print("run | TF in use MB | objects | of them kerasmagic's records | models | functions |"
          " malloc in use MB | malloc arenas MB | RSS MB")  # fmt: skip
    for i, r in enumerate(rows, 1):
        print(
            f"{i} | {r['tf_bytes'] / mb:.3f} | {r['objects']} | {r['record_objects']} | "
            f"{r['models']} | {r['functions']} | {r['malloc_in_use'] / mb:.2f} | "
            f"{r['malloc_arenas'] / mb:.2f} | {r['rss'] / mb:.1f}"
        )
    per_run = {
        "tf_mb": slope([r["tf_bytes"] / mb for r in rows], args.skip),
        "objects": slope([float(r["objects"]) for r in rows], args.skip),
        "user_objects": slope([float(r["objects"] - r["record_objects"]) for r in rows], args.skip),
        "malloc_in_use_mb": slope([r["malloc_in_use"] / mb for r in rows], args.skip),
        "malloc_arenas_mb": slope([r["malloc_arenas"] / mb for r in rows], args.skip),
        "rss_mb": slope([r["rss"] / mb for r in rows], args.skip),
    }
    print("per re-run:", {k: round(v, 4) for k, v in per_run.items()})
    save("subclassed_rerun", args, [{"rows": rows, "per_run": per_run}], {})


if __name__ == "__main__":
    main()
