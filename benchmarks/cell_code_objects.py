"""What ``%%fresh_model``'s own compile-and-run buys: RSS per re-run with one code object per
cell source (and padding frames) against a fresh code object per run, as IPython runs a cell.

TensorFlow's eager runtime caches the innermost frames of each eager op by code object, and a
re-run cell is a new code object each time IPython compiles it. In a real kernel (over
jupyter_client) one model cell is re-run R times, each variant in a fresh kernel with the same
cleanup (``kerasmagic.reset``, string op stack traces on):

- ``%%fresh_model`` as shipped: the cell's code compiled once per source, run below fixed
  padding frames;
- ``%%fresh_model`` with the cache and the padding turned off: a new code object every run;
- a plain cell calling ``kerasmagic.reset(rebinding=[...])`` at its top: IPython's own
  ``run_cell``, a new code object every run.

Prints the RSS slope per re-run (Theil-Sen, first 5 runs left out) and writes
``benchmarks/results/cell_code_objects.json``.

    python benchmarks/cell_code_objects.py [--runs 30] [--samples 20000]
"""

from __future__ import annotations

import argparse

from leak_loop import BODY, kernel_variant, save

UNCACHED = (
    "import kerasmagic.cells.run as _run\n"
    "_run.MAX_CELLS = 0  # every run compiles afresh: a new code object\n"
    "_run._padded = _run._call  # and runs without the padding frames"
)
VARIANTS: dict[str, tuple[str, str]] = {
    "%%fresh_model (compiled once, padded)": ("", "%%fresh_model -q\n" + BODY),
    "%%fresh_model, compiled every run, no padding": (UNCACHED, "%%fresh_model -q\n" + BODY),
    "plain cell + kerasmagic.reset() (IPython's run_cell)": (
        "import kerasmagic",
        "kerasmagic.reset(rebinding=['model', 'history'])\n" + BODY,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--samples", type=int, default=20000)
    args = parser.parse_args()
    rows = [
        kernel_variant(n, c, args.runs, args.samples, before=b) for n, (b, c) in VARIANTS.items()
    ]
    for row in rows:
        print(
            f"{row['variant']:<56} {row['rss_mb_per_run']:>8.3f} MB/run "
            f"{row['run_s_median']:>6.2f} s/run  allocator at start: "
            f"{row['allocator_start_mb'][1]} -> {row['allocator_start_mb'][-1]} MB"
        )
    save("cell_code_objects", args, rows, {})


if __name__ == "__main__":
    main()
