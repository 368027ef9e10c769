"""The K-fold story behind ``kerasmagic demo``'s last part and ``benchmarks/oom.py``.

Ten folds of a 256-1024-1024-10 model in one loop, with TensorFlow's allocator capped the way
a GPU's memory is (TF's GPU allocator put on the CPU, capped at ``CAP_MB``): cleaned up by hand
in the loop, or a plain loop in a ``%%fresh_model`` cell. Each variant runs in its own process
(``python -m kerasmagic._demo_folds VARIANT``), in an IPython shell, and prints one JSON line
per fold it finished and one for the error that stopped it, if any.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

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
VARIANTS = {
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

    _, loaded, cell = VARIANTS[variant]
    shell = InteractiveShell.instance()
    if loaded:
        shell.run_line_magic("load_ext", "kerasmagic")
    shell.run_cell(SETUP, silent=True)
    result = shell.run_cell(cell)
    error = result.error_before_exec or result.error_in_exec
    if error is not None:
        print(json.dumps({"error": type(error).__name__}), flush=True)
    return 0


def run_variant_process(variant: str, on_fold: Callable[[int], None] | None = None) -> FoldsResult:
    """Run one variant in a fresh capped process; ``on_fold(n)`` as it finishes fold n."""
    env = {**os.environ, **CAP_ENV, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "kerasmagic._demo_folds", variant]
    result = FoldsResult(variant)
    with tempfile.TemporaryFile("w+") as err:
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env) as proc:
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    _take(result, line, on_fold)
            except BaseException:  # Ctrl-C or a failing callback: stop the child, then re-raise
                proc.kill()
                raise
        if proc.returncode != 0 and result.error is None:
            # TF 2.21's capped CPU allocator can crash, rather than raise, when it runs out
            # inside a traced step: the process is gone, and so is its memory.
            result.error = f"the process died (exit {proc.returncode}) out of memory"
            if result.folds == 0:
                err.seek(0)
                raise RuntimeError(f"{variant} folds failed:\n{err.read()[-3000:]}")
    return result


def _take(result: FoldsResult, line: str, on_fold: Callable[[int], None] | None) -> None:
    try:
        message = json.loads(line)
    except ValueError:
        return
    if not isinstance(message, dict):
        return
    if "fold" in message:
        result.in_use_bytes.append(int(message["in_use"]))
        if on_fold is not None:
            on_fold(result.folds)
    elif "error" in message:
        result.error = str(message["error"])


if __name__ == "__main__":
    raise SystemExit(run_in_shell(sys.argv[1]))
