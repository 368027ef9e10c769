"""Random Ctrl-Cs of a PyTorch ``fit`` loop in a real kernel: how many does a cell swallow?

The cell of ``tests/test_faults.py`` (``%%fresh_model``, a new model, 60 ``fit`` calls) runs
``--tries`` times on Keras's PyTorch backend (Keras imports JAX, whose gc callback then runs
at every collection); each run is interrupted after a random 0-2 s. A run that ends ``ok``, or
prints "Exception ignored", swallowed its Ctrl-C. Measured: 1 of 150 before kerasmagic followed
an interrupt lost in a gc callback under a library's bare ``except:``, 0 of 250 after.

    python benchmarks/lost_interrupts.py [--tries 250] [--seed 2] [--backend torch]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from conftest import kernel_run, real_kernel
from test_faults import FIT, SETUP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=250)
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--backend", default="torch")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    swallowed = 0
    with tempfile.TemporaryDirectory() as cwd, real_kernel(cwd, args.backend) as (km, client):
        kernel_run(client, SETUP, timeout_s=180)
        for _ in range(args.tries):
            delay = rng.uniform(0, 2)

            def interrupt(delay: float = delay) -> None:
                time.sleep(delay)
                km.interrupt_kernel()

            content, text = kernel_run(client, FIT, on_busy=interrupt)
            lost = content["status"] == "ok" or "Exception ignored" in text
            swallowed += lost
            if lost:
                print(f"swallowed after {delay:.3f} s:\n{text[-1500:]}", flush=True)
    print(f"{args.backend}: {swallowed} of {args.tries} Ctrl-Cs swallowed")


if __name__ == "__main__":
    main()
