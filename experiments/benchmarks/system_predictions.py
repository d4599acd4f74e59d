"""Benchmark: kvjax's prediction of every published serving-system row the simulator can run,
held out by implementation (`kvjax.serving.system_predict`), written to
experiments/results/system_predictions.csv for `kvjax validate` to read. A thin wrapper of

    python3 -m kvjax validate --predict --out experiments/results/system_predictions.csv

    python3 -m experiments.benchmarks.system_predictions [--out FILE] [--resume]

Prints each row's measured and predicted value and its seconds, then the summary.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvjax.cli.main import main as kvjax

OUT = Path("experiments/results/system_predictions.csv")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--resume", action="store_true",
                   help="keep the rows --out already holds and run the others")  # fmt: skip
    a = p.parse_args()
    args = ["validate", "experiments/published/systems.csv", "--predict", "--out", a.out]
    sys.exit(kvjax(args + (["--resume"] if a.resume else [])))


if __name__ == "__main__":
    main()
