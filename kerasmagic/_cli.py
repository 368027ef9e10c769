"""``kerasmagic demo``: show the leak and the fix on this machine, no GPU needed."""

from __future__ import annotations

import argparse
import importlib.util
import sys

from kerasmagic._demo import VARIANTS, run_variant_process, table


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return its exit status."""
    parser = argparse.ArgumentParser(prog="kerasmagic", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the leak loop with and without kerasmagic")
    demo.add_argument("--models", type=int, default=30, help="models per variant (default 30)")
    demo.add_argument("--samples", type=int, default=4000, help="training rows (default 4000)")
    args = parser.parse_args(argv)
    if args.models < 8 or args.samples < 256:
        parser.error("use at least 8 models and 256 samples")
    if importlib.util.find_spec("tensorflow") is None:
        print("kerasmagic demo needs TensorFlow: pip install 'kerasmagic[tf]'", file=sys.stderr)
        return 2
    print(
        f"Building, fitting and predicting {args.models} small Keras models per variant "
        f"({args.samples} x 100 inputs, CPU), each variant in a fresh process...",
        flush=True,
    )
    results = []
    for variant in VARIANTS:
        results.append(run_variant_process(variant, args.models, args.samples, skip=5))
        print(f"  {VARIANTS[variant]}: done", flush=True)
    print()
    print(table(results))
    keras_slope = results[1].rss_mb_per_model
    ours = results[2].rss_mb_per_model
    print(
        f"\nkerasmagic keeps {max(ours, 0):.3f} MB per model where Keras's own cleanup keeps "
        f"{keras_slope:.2f} MB."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
