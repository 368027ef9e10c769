"""What the probes' freeze saves a prediction: ``predict_fit`` with it and without, alternated.

Each probe collects the last probe's garbage first (its dataset holds a copy of the data in the
allocator). A full collection walks every object of a TF process; with what was alive before the
prediction frozen (``oom/batch.py``'s ``_young_only``) it walks only the probes' own. This times
whole predictions (``benchmarks/predict.py``'s models, batch 128 of 2,048 samples, 10% held out
for validation) in one process, with the freeze and with it swapped for a no-op, in turns.

    python benchmarks/predict_cost.py [--kinds mlp lstm] [--runs 4]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # as predict.py measures
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(__file__))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=["mlp", "lstm"])
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    import predict

    import kerasmagic
    from kerasmagic.oom import batch

    freeze = batch._young_only
    for kind in args.kinds:
        x, y = predict.data(kind, 2048, 0)
        model = predict.model(kind)
        model.fit(x[:256], y[:256], batch_size=64, verbose=0)
        times: dict[str, list[float]] = {"frozen": [], "full collections": []}
        for run in range(args.runs):
            for name in sorted(times, reverse=bool(run % 2)):
                batch._young_only = freeze if name == "frozen" else contextlib.nullcontext
                start = time.perf_counter()
                kerasmagic.predict_fit(model, x, y, batch_size=128, validation_split=0.1,
                                       verbose=False)  # fmt: skip
                times[name].append(time.perf_counter() - start)
        batch._young_only = freeze
        said = ", ".join(f"{name} {statistics.median(t):.2f} s" for name, t in times.items())
        print(f"{kind}: a prediction, median of {args.runs}: {said}")


if __name__ == "__main__":
    main()
