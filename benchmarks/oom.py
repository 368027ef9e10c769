"""Out of memory, for real: TensorFlow's allocator capped at 160 MB as a GPU's memory is.

TF's GPU allocator is put on the CPU (``TF_CPU_ALLOCATOR_USE_BFC=true``,
``TF_CPU_BFC_MEM_LIMIT_IN_MB=160``), so allocations past the cap raise the
``ResourceExhaustedError`` a GPU raises. In a real kernel over jupyter_client:

1. Ten folds of a 256-1024-1024-10 model in one loop, three ways: cleanup by hand in the loop
   (``del``, ``clear_session()``, ``gc.collect()``), ``with kerasmagic.fresh()`` around each
   fold (the extension not loaded), and a plain loop in a ``%%fresh_model`` cell. Folds
   finished of 10, and the allocator after each.
2. A model that fits, one too big (an out-of-memory error while it is built), then the one that
   fitted, three times: by hand, and as ``%%fresh_model`` cells. Whether each fits, and the
   allocator after each.
3. The same with a batch too big for ``fit`` (the error inside fit's traced train step). TF's
   CPU build runs such a step in oneDNN's kernels, and TF 2.21's capped CPU allocator crashes
   the process when one runs out, so this kernel runs with ``TF_ENABLE_ONEDNN_OPTS=0`` (TF's own
   kernels, which raise as on a GPU).

Writes ``benchmarks/results/oom.json``.

    python benchmarks/oom.py [--skip-folds] [--skip-sequence]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from leak_loop import _execute

from kerasmagic._demo import CAP_ENV, CAP_MB, FOLD, FOLDS, HAND, PLAIN, SETUP

RESULTS = Path(__file__).parent / "results"
MB = 2**20
FRESH = f"""
for fold in range(1, {FOLDS + 1}):
    with kerasmagic.fresh(rebinding=["model", "history"]):{FOLD.replace("    ", "        ")}
    done(fold)
"""
LOOPS = {  # label -> (extension loaded, the loop cell)
    "cleanup by hand in the loop": (False, HAND),
    "with kerasmagic.fresh() around each fold": (False, "import kerasmagic\n" + FRESH),
    "%%fresh_model cell, a plain loop": (True, PLAIN),
}
FITS = "model = build(1024)\nhistory = model.fit(x, y, epochs=1, batch_size=128, verbose=0)\n"
TOO_BIG = "model = build(6000)\n"  # 144 MB of weights for one layer: runs out while building
BIG_BATCH = (  # 64 MB per layer's activations: runs out inside fit's traced step
    "model = build(1024)\n"
    "model.fit(np.repeat(x, 8, 0), np.repeat(y, 8, 0), batch_size=16384, epochs=1, verbose=0)\n"
)
NO_ONEDNN = {"TF_ENABLE_ONEDNN_OPTS": "0"}
HAND_CELL = "globals().pop('model', None); globals().pop('history', None)\n"
HAND_CELL += "keras.backend.clear_session(); gc.collect()\n"
SEQUENCES = {  # label -> (extension loaded, how each cell starts)
    "by hand (del, clear_session, gc)": (False, HAND_CELL),
    "%%fresh_model": (True, "%%fresh_model -q\n"),
}
OOMS = {  # what runs out -> (the cell, the kernel's extra environment)
    "a model too big (while building)": (TOO_BIG, {}),
    "a batch too big (in fit)": (BIG_BATCH, NO_ONEDNN),
}


class Kernel:
    """A real kernel with TensorFlow's allocator capped; kerasmagic loaded if asked."""

    def __init__(self, load: bool, extra: dict[str, str] | None = None) -> None:
        from jupyter_client.manager import start_new_kernel

        env = {**os.environ, **CAP_ENV, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
        env.update(extra or {})
        self.km, self.kc = start_new_kernel(kernel_name="python3", env=env)
        _execute(self.kc, SETUP + ("\n%load_ext kerasmagic" if load else ""))

    def run(self, code: str, timeout_s: float = 900) -> tuple[str, str]:
        """Run a cell; return (its printed output, the error's name or "")."""
        msg_id = self.kc.execute(code)
        out, error = "", ""
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout_s)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "stream":
                out += msg["content"]["text"]
            elif kind == "error":
                error = msg["content"]["ename"]
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                return out, error

    def in_use_mb(self) -> float:
        out, _ = self.run("print(in_use())")
        return round(int(out.strip().splitlines()[-1]) / MB, 1)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def folds(label: str) -> dict[str, Any]:
    """Run one way of the K-fold loop; return the folds finished and the allocator per fold."""
    load, cell = LOOPS[label]
    kernel = Kernel(load)
    try:
        out, error = kernel.run(cell)
    finally:
        kernel.close()
    done = [json.loads(line) for line in out.splitlines() if line.startswith('{"fold"')]
    return {
        "way": label,
        "folds": len(done),
        "error": error or None,
        "in_use_mb": [round(d["in_use"] / MB, 1) for d in done],
    }


def sequence(label: str, oom: str) -> dict[str, Any]:
    """Fit, run out, fit again three times; return whether each fitted and the allocator."""
    load, start = SEQUENCES[label]
    too_big, extra = OOMS[oom]
    kernel = Kernel(load, extra)
    steps = []
    try:
        for name, cell in _steps(too_big):
            _, error = kernel.run(start + cell)
            steps.append({"step": name, "error": error or None, "in_use_mb": kernel.in_use_mb()})
    finally:
        kernel.close()
    return {"way": label, "oom": oom, "steps": steps}


def _steps(too_big: str) -> tuple[tuple[str, str], ...]:
    return ("fits", FITS), ("too big", too_big), ("again", FITS), ("again", FITS), ("again", FITS)


def folds_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"| {FOLDS} folds, allocator capped at {CAP_MB} MB | folds finished | allocator "
             "after each fold (MB) |", "| --- | ---: | --- |"]  # fmt: skip
    for r in rows:
        figures = ", ".join(f"{v:.0f}" for v in r["in_use_mb"])
        lines.append(f"| {r['way']} | {r['folds']} of {FOLDS} | {figures} |")
    return "\n".join(lines)


def sequence_table(rows: list[dict[str, Any]]) -> str:
    names = [name for name, _ in _steps("")]
    lines = ["| cells | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for r in rows:
        if r is rows[0] or r["oom"] != rows[rows.index(r) - 1]["oom"]:
            lines.append(f"| **{r['oom']}** |" + " |" * len(names))
        cells = [
            ("out of memory" if s["error"] else "fits") + f", {s['in_use_mb']:.1f} MB"
            for s in r["steps"]
        ]
        lines.append(f"| {r['way']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-folds", action="store_true")
    parser.add_argument("--skip-sequence", action="store_true")
    args = parser.parse_args()
    saved = RESULTS / "oom.json"
    out: dict[str, Any] = (
        json.loads(saved.read_text()) if saved.exists() else {}
    )  # a part skipped keeps its figures
    out.update(machine=platform.platform(), cpus=os.cpu_count())
    if not args.skip_folds:
        out["folds"] = [folds(label) for label in LOOPS]
        print(folds_table(out["folds"]))
    if not args.skip_sequence:
        out["sequence"] = [sequence(label, oom) for oom in OOMS for label in SEQUENCES]
        print(sequence_table(out["sequence"]))
    RESULTS.mkdir(exist_ok=True)
    saved.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
