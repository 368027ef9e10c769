"""The ``kerasmagic`` command line: ``kerasmagic demo`` shows the leak and the fix here."""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import threading
import time
from typing import TextIO

from kerasmagic._demo import (
    CAP_MB,
    FOLD_VARIANTS,
    FOLDS,
    VARIANTS,
    LoopResult,
    run_variant_process,
    table,
)
from kerasmagic._demo import run_folds_process as run_folds

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
        elapsed = time.monotonic() - self._start
        ok = exc[0] is None
        end = f"{self.done}/{self.total} {self.unit} in {elapsed:.0f} s" if ok else "stopped"
        with self._lock:
            self._draw(f"{self.label}: {end}", final=True)

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
        statuses = self._statuses(time.monotonic() - self._start)
        for status in statuses:
            if len(self.label) + 2 + len(status) <= columns - 1:
                return f"{self.label}  {status}"
        status = statuses[0]
        room = max(columns - 1 - len(status) - 2, 8)
        return f"{self.label[: room - 3]}...  {status}"

    def _statuses(self, elapsed: float) -> list[str]:
        """Return the status part of the line, from the fullest to the shortest."""
        clock = f"{elapsed:.0f} s"
        if self.done == 0:
            return [f"starting (importing TensorFlow)  {clock}", f"starting  {clock}"]
        left = remaining_s(self.done, self.total, elapsed, self._first_s)
        end = clock if left is None else f"{clock}, ~{left:.0f} s left"
        counts = f"{self.done}/{self.total} {self.unit}"
        return [
            f"{bar(self.done, self.total)} {counts}  {end}",
            f"{bar(self.done, self.total, BAR_WIDTH // 2)} {counts}  {end}",
            f"{counts}  {end}",
            f"{counts}  {clock}" if left is None else f"{counts}, ~{left:.0f} s left",
        ]

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


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of ``kerasmagic`` and its ``demo`` command."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="kerasmagic", description=DESCRIPTION, formatter_class=raw
    )
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="the leak loop and a capped K-fold loop, with and without us (~5 min)",
        description=DEMO_DESCRIPTION,
        formatter_class=raw,
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
        "kerasmagic (~1 min)",
    )
    demo.add_argument(
        "--samples",
        type=int,
        default=4000,
        metavar="ROWS",
        help="training rows of 100 features per fit (default 4000, at least 256)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.models < 8 or args.samples < 256:
        parser.error("use at least 8 models and 256 samples")
    if importlib.util.find_spec("tensorflow") is None:
        print("kerasmagic demo needs TensorFlow: pip install 'kerasmagic[tf]'", file=sys.stderr)
        return 2
    try:
        return demo(args.models, args.samples, folds=not args.no_folds)
    except KeyboardInterrupt:
        print("\nkerasmagic demo: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"kerasmagic demo: {exc}", file=sys.stderr)
        return 1


def demo(models: int, samples: int, folds: bool = True) -> int:
    """Run every variant in its own process with a progress line, then print the table; then
    the folds under a capped allocator, by hand and with kerasmagic, and the outcome in words."""
    print(
        f"Building, fitting and predicting {models} small Keras models per variant "
        f"({samples} x 100 inputs, CPU), each variant in a fresh process.",
        flush=True,
    )
    steps = len(VARIANTS) + (len(FOLD_VARIANTS) if folds else 0)
    results: list[LoopResult] = []
    for step, (variant, label) in enumerate(VARIANTS.items(), start=1):
        with StepProgress(sys.stdout, f"[{step}/{steps}] {label}", models) as progress:
            results.append(run_variant_process(variant, models, samples, 5, progress.update))
    print(f"\n{table(results)}")
    keras_slope, ours = results[1].rss_mb_per_model, results[2].rss_mb_per_model
    print(
        f"\nkerasmagic keeps {max(ours, 0):.3f} MB per model where Keras's own cleanup keeps "
        f"{keras_slope:.2f} MB."
    )
    if not folds:
        return 0
    print(
        f"\nNow {FOLDS} folds of a 256-1024-1024-10 model in one loop, with TensorFlow's "
        f"allocator capped at {CAP_MB} MB as a GPU's memory is (TF's GPU allocator on the CPU).",
        flush=True,
    )
    outcome = {}
    for step, (variant, (label, _, _)) in enumerate(FOLD_VARIANTS.items(), start=len(VARIANTS) + 1):
        with StepProgress(sys.stdout, f"[{step}/{steps}] {label}", FOLDS, "folds") as progress:
            outcome[variant] = run_folds(variant, progress.update)
    print(f"\nhand cleanup {outcome['hand'].words()}; kerasmagic {outcome['kerasmagic'].words()}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
