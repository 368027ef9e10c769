"""The ``kerasmagic`` command line: ``kerasmagic demo`` shows the leak and the fix here; its
loops are behind ``benchmarks/leak_loop.py`` and ``benchmarks/oom.py`` too.

Each variant runs in its own fresh process (``python -m kerasmagic._demo VARIANT ...``) so one
variant's leftovers cannot colour another's figures.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from kerasmagic.compat.registry import works
from kerasmagic.interrupts.held import held_interrupts

DESCRIPTION = """\
kerasmagic: memory-safe Keras/TensorFlow model iteration in Jupyter.

In a notebook or IPython, load it with  %load_ext kerasmagic  and put %%fresh_model on top
of a model cell; %gpu_mem shows what is alive. This command line shows the problem and the
fix on this machine."""

DEMO_DESCRIPTION = """\
Show, on this machine, how much memory re-building Keras models keeps, and what kerasmagic
frees. The same loop (build a Dense 256-256-10 model, fit it one epoch on ROWS random rows,
predict; N times) runs three times, each in a fresh Python process on the CPU (no GPU needed):

  1. no cleanup: the model variable is simply reassigned
  2. Keras's own cleanup: del model + keras.backend.clear_session() + gc.collect()
  3. kerasmagic: kerasmagic.reset() before each model, as %%fresh_model does

It prints, per variant, the RSS and Python objects kept per model, the median cleanup time and
the last layer's name (dense_89, not dense_2: Keras's name counter kept counting).

Last, what runs out on a GPU: ten folds of a 256-1024-1024-10 model in one loop, TensorFlow's
allocator capped at 160 MB (its GPU allocator on the CPU), each way in a fresh process: 4. by
hand in the loop, 5. a plain loop in a %%fresh_model cell; it says how many folds each finished
and what the allocator held (--no-folds skips it).

About 1-3 minutes per variant on 2 CPU cores (4-7 minutes in all with the folds); a progress
line shows where it is. Needs TensorFlow: pip install 'kerasmagic[tf]'."""


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


def run_loop(variant: str, models: int, samples: int, skip: int) -> None:
    """A variant's process: build, fit and predict ``models`` models with one cleanup variant;
    print ``{"done": n}`` after the n-th model and the result as the last JSON line."""
    import keras
    import numpy as np
    import psutil

    import kerasmagic

    rng = np.random.default_rng(0)
    x, y = rng.random((samples, 100), dtype=np.float32), rng.integers(0, 10, samples)
    proc, rss, objects, cleanup, name = psutil.Process(), [], [], [], ""
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
        print(json.dumps({"done": len(rss)}), flush=True)
    slopes = round(slope(rss, skip), 4), round(slope(objects, skip), 1)
    median = None if not cleanup else round(sorted(cleanup)[len(cleanup) // 2], 4)
    result = LoopResult(variant, models, *slopes, median, [round(r, 2) for r in rss], name)
    print(json.dumps(asdict(result)), flush=True)


def run_variant_process(
    variant: str,
    models: int,
    samples: int,
    skip: int,
    on_progress: Callable[[int], None] = lambda done: None,
) -> LoopResult:
    """Run one variant in a fresh Python process and return its result; ``on_progress(n)`` is
    called in this process as the child finishes its n-th model."""
    code, err, said = _run_child([variant, str(models), str(samples), str(skip)], {}, on_progress)
    found = [message for message in said if "variant" in message]
    if code != 0 or not found:
        raise RuntimeError(f"{variant} loop failed:\n{err}")
    return LoopResult(**found[-1])


def _run_child(
    args: list[str], env: dict[str, str], on_step: Callable[[int], None]
) -> tuple[int, str, list[dict[str, Any]]]:
    """Run ``python -m kerasmagic._demo ARGS`` on the CPU; call ``on_step(n)`` as it prints its
    n-th step (``{"done": n}`` or ``{"fold": n, ...}``); return its exit status, the tail of its
    stderr and every JSON object it printed."""
    said: list[dict[str, Any]] = []
    env = {**os.environ, **env, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "kerasmagic._demo", *args]
    # stderr goes to a file: TensorFlow may write more than a pipe holds while we read stdout.
    with tempfile.TemporaryFile("w+") as err:
        # A Ctrl-C while Popen starts the child is held: raised inside Popen, no one would stop it
        with held_interrupts() as held:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        with proc:
            try:
                held.deliver()
                for line in proc.stdout or ():
                    try:
                        message = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(message, dict):
                        said.append(message)
                        step = message.get("done", message.get("fold"))
                        if step is not None:
                            on_step(int(step))
            except BaseException:  # Ctrl-C or a failing callback: stop the child, then re-raise
                proc.kill()
                raise
        err.seek(0)
        return proc.returncode, err.read()[-3000:], said


def table(results: list[LoopResult]) -> str:
    """Return the per-model memory table printed by ``kerasmagic demo``."""
    head = f"{'cleanup between models':<48} {'RSS MB/model':>12} {'objects/model':>13} "
    head += f"{'cleanup s':>9}  last layer name"
    rows = [head, "-" * len(head)]
    for r in results:
        cleanup = "-" if r.cleanup_s_median is None else f"{r.cleanup_s_median:.3f}"
        row = f"{VARIANTS[r.variant]:<48} {r.rss_mb_per_model:>12.3f} "
        rows.append(row + f"{r.objects_per_model:>13.0f} {cleanup:>9}  {r.last_layer_name}")
    return "\n".join(rows)


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


def run_in_shell(variant: str) -> None:
    """A folds variant's process: run its loop in an IPython shell in this process."""
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


def run_folds_process(variant: str, on_fold: Callable[[int], None] = lambda n: None) -> FoldsResult:
    """Run one variant in a fresh capped process; ``on_fold(n)`` as it finishes fold n."""
    code, err, said = _run_child(["folds", variant], CAP_ENV, on_fold)
    in_use = [int(message["in_use"]) for message in said if "fold" in message]
    errors = [str(message["error"]) for message in said if "error" in message]
    result = FoldsResult(variant, in_use, errors[-1] if errors else None)
    if code != 0 and result.error is None:
        # TF 2.21's capped CPU allocator can crash, rather than raise, when it runs out
        # inside a traced step: the process is gone, and so is its memory.
        result.error = f"the process died (exit {code}) out of memory"
        if result.folds == 0:
            raise RuntimeError(f"{variant} folds failed:\n{err}")
    return result


# -- the demo's progress line ----------------------------------------------------------------------
BAR_WIDTH = 20


def bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """Return an ASCII bar such as ``[#######.............]`` for ``done`` of ``total``."""
    filled = 0 if total <= 0 else min(width, done * width // total)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def remaining_s(done: int, total: int, elapsed_s: float, first_s: float) -> float | None:
    """Estimate the seconds left from the pace since the first model (which pays the imports)."""
    if done < 2 or done >= total:
        return None
    return (elapsed_s - first_s) / (done - 1) * (total - done)  # the pace, times what is left


class StepProgress:
    """Show the progress of one step of ``total`` units (models) under a ``label``."""

    def __init__(self, stream: TextIO, label: str, total: int, unit: str = "models") -> None:
        self.stream, self.label, self.total, self.unit = stream, label, total, unit
        self.live, self.done, self._start = stream.isatty(), 0, time.monotonic()
        self._first_s, self._width = 0.0, 0
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)

    def __enter__(self) -> StepProgress:
        if self.live:
            self._ticker.start()
        else:
            self._draw(f"{self.label}: started", final=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker.is_alive():
            self._ticker.join()
        end = f"{self.done}/{self.total} {self.unit} in {time.monotonic() - self._start:.0f} s"
        with self._lock:
            self._draw(f"{self.label}: {end if exc[0] is None else 'stopped'}", final=True)

    def update(self, done: int) -> None:
        """Record that ``done`` units are finished, and redraw on a terminal."""
        with self._lock:
            if self.done == 0 and done > 0:
                self._first_s = time.monotonic() - self._start
            self.done = done
            if self.live:
                self._draw(self.line(_columns()))

    def line(self, columns: int = 80) -> str:
        """Return the progress line as it stands now, within ``columns``.

        The label says what runs, so it is kept whole while a status with the counts and the
        estimate fits beside it (a shorter bar, then none, then no clock); only on a terminal
        too narrow for that is the label cut, beside the full status.
        """
        elapsed = time.monotonic() - self._start
        clock, counts = f"{elapsed:.0f} s", f"{self.done}/{self.total} {self.unit}"
        left = remaining_s(self.done, self.total, elapsed, self._first_s)
        end = clock if left is None else f"{clock}, ~{left:.0f} s left"
        # the statuses beside the label, from the fullest to the shortest
        statuses = [f"starting (importing TensorFlow)  {clock}", f"starting  {clock}"]
        if self.done:
            statuses = [
                f"{bar(self.done, self.total)} {counts}  {end}",
                f"{bar(self.done, self.total, BAR_WIDTH // 2)} {counts}  {end}",
                f"{counts}  {end}",
                f"{counts}  {clock}" if left is None else f"{counts}, ~{left:.0f} s left",
            ]
        for status in statuses:
            if len(self.label) + 2 + len(status) <= columns - 1:
                return f"{self.label}  {status}"
        room = max(columns - 1 - len(statuses[0]) - 2, 8)
        return f"{self.label[: room - 3]}...  {statuses[0]}"

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self._draw(self.line(_columns()))

    def _draw(self, text: str, final: bool = False) -> None:
        """Redraw the line on a terminal (``final``: and end it); in a pipe, write a ``final``
        line whole."""
        if self.live:
            text = text[: _columns() - 1]
            pad, self._width = " " * max(0, self._width - len(text)), 0 if final else len(text)
            text = "\r" + text + pad
        self.stream.write(text + ("\n" if final else ""))
        self.stream.flush()


def _columns() -> int:
    """Return the terminal's width (80 when it cannot be told)."""
    return shutil.get_terminal_size((80, 24)).columns


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return its exit status."""
    raw: dict[str, Any] = {"formatter_class": argparse.RawDescriptionHelpFormatter}
    parser = argparse.ArgumentParser(prog="kerasmagic", description=DESCRIPTION, **raw)
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="the leak loop and a capped K-fold loop, with and without us (4-7 min)",
        description=DEMO_DESCRIPTION,
        **raw,
    )
    demo.add_argument(
        "--models",
        type=int,
        default=30,
        metavar="N",
        help="models built and fitted per variant (default 30, at least 8); time grows with it",
    )
    demo.add_argument(
        "--no-folds",
        action="store_true",
        help="skip the last part: 10 folds under a 160 MB allocator cap, by hand and with "
        "kerasmagic (~2 min)",
    )
    demo.add_argument(
        "--samples",
        type=int,
        default=4000,
        metavar="ROWS",
        help="training rows of 100 features per fit (default 4000, at least 256)",
    )
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    models, samples = args.models, args.samples
    if models < 8 or samples < 256:
        parser.error("use at least 8 models and 256 samples")
    if importlib.util.find_spec("tensorflow") is None:
        print("kerasmagic demo needs TensorFlow: pip install 'kerasmagic[tf]'", file=sys.stderr)
        return 2
    # Every variant in its own process with a progress line, then the table; then the folds
    # under a capped allocator, by hand and with kerasmagic, and the outcome in words.
    steps = len(VARIANTS) + (0 if args.no_folds else len(FOLD_VARIANTS))
    results: list[LoopResult] = []
    outcome = {}
    try:
        print(
            f"Building, fitting and predicting {models} small Keras models per variant "
            f"({samples} x 100 inputs, CPU), each variant in a fresh process.",
            flush=True,
        )
        for step, (variant, label) in enumerate(VARIANTS.items(), start=1):
            with StepProgress(sys.stdout, f"[{step}/{steps}] {label}", models) as progress:
                results.append(run_variant_process(variant, models, samples, 5, progress.update))
        print(f"\n{table(results)}")
        keras_slope, ours = results[1].rss_mb_per_model, results[2].rss_mb_per_model
        print(
            f"\nkerasmagic keeps {max(ours, 0):.3f} MB per model where Keras's own cleanup keeps "
            f"{keras_slope:.2f} MB."
        )
        if args.no_folds:
            return 0
        print(
            f"\nNow {FOLDS} folds of a 256-1024-1024-10 model in one loop, with TensorFlow's "
            f"allocator capped at {CAP_MB} MB as a GPU's memory is (TF's GPU allocator on the"
            " CPU).",
            flush=True,
        )
        for step, (variant, (label, *_)) in enumerate(FOLD_VARIANTS.items(), len(VARIANTS) + 1):
            with StepProgress(sys.stdout, f"[{step}/{steps}] {label}", FOLDS, "folds") as progress:
                outcome[variant] = run_folds_process(variant, progress.update)
    except KeyboardInterrupt:
        print("\nkerasmagic demo: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"kerasmagic demo: {exc}", file=sys.stderr)
        return 1
    print(f"\nhand cleanup {outcome['hand'].words()}; kerasmagic {outcome['kerasmagic'].words()}.")
    return 0


if __name__ == "__main__":  # a variant's process (_run_child)
    if sys.argv[1:2] == ["folds"]:
        run_in_shell(sys.argv[2])
    else:
        child = argparse.ArgumentParser()
        child.add_argument("variant", choices=sorted(VARIANTS))
        for number in ("models", "samples", "skip"):
            child.add_argument(number, type=int)
        run_loop(**vars(child.parse_args()))
