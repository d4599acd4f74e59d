"""Benchmark: kvjax's prediction of every published serving-system row the simulator can run
(`kvjax.serving.system_predict`: offline and fixed-rate rows of fixed lengths, one
tensor-parallel group a replica, known engine settings), each step predicted from its kernels
with fits that left the row's source group out, written to
experiments/results/system_predictions.csv for `kvjax validate` to read.

    python3 -m experiments.benchmarks.system_predictions [--out FILE] [--limit N]

Prints each row's measured, predicted and their ratio, and the median |predicted/measured - 1|.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd

from kvjax.errors import KvjaxError
from kvjax.files import write_text_atomic
from kvjax.serving.system_predict import predict_row, step_fits, why_not
from kvjax.serving.systems import read_systems

OUT = Path("experiments/results/system_predictions.csv")


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--limit", type=int, default=None, help="the first N runnable rows only")
    a = p.parse_args()
    rows = [r for r in read_systems() if why_not(r) is None][: a.limit]
    fits, out = step_fits(), []
    for r in rows:
        try:
            pred = predict_row(r, fits)
        except KvjaxError as exc:  # a deployment kvjax's memory model cannot hold: said
            print(f"{r['source']}: not simulated: {exc}")
            continue
        pred["measured"] = r["measured"]
        pred["ratio"] = pred["predicted_value"] / r["measured"]
        out.append(pred)
        print(f"{r['source']}: measured {_num(r['measured'])}, predicted "
              f"{_num(pred['predicted_value'])} ({pred['ratio'] - 1:+.1%}), "
              f"{pred['seconds']:.1f} s")  # fmt: skip
    write_text_atomic(a.out, pd.DataFrame(out).to_csv(index=False))
    errors = [abs(o["ratio"] - 1) for o in out]
    inside = [o["predicted_lo"] <= o["measured"] <= o["predicted_hi"] for o in out]
    print(f"{len(out)} rows; median |predicted/measured - 1| = {statistics.median(errors):.1%}; "
          f"{statistics.mean(inside):.0%} inside the 80% interval")  # fmt: skip


if __name__ == "__main__":
    main()
