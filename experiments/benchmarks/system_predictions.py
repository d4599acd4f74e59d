"""Benchmark: kvjax's prediction of every published serving-system row the simulator can run
(`kvjax.serving.system_predict`: offline and fixed-rate rows of fixed lengths, one
tensor-parallel group a replica, known engine settings), each step predicted from its kernels
with fits that left the row's source group out, written to
experiments/results/system_predictions.csv for `kvjax validate` to read.

    python3 -m experiments.benchmarks.system_predictions [--out FILE] [--limit N] [--resume]

Prints each row's measured, predicted and their ratio, and the median |predicted/measured - 1|.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd

from kvjax.errors import KvjaxError
from kvjax.files import write_text_atomic
from kvjax.serving.system_predict import SLO_SCENARIOS, predict_row, step_fits, why_not
from kvjax.serving.systems import read_systems

OUT = Path("experiments/results/system_predictions.csv")
HOPPER = ("h100-sxm", "h200", "h800", "h20")


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--limit", type=int, default=None, help="the first N runnable rows only")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows --out already holds and run the others")  # fmt: skip
    a = p.parse_args()
    # the quick rows first: offline and fixed-rate runs, then the servers' rate searches
    # (each a bisection of simulations), Hopper before Blackwell
    rows = sorted(
        (r for r in read_systems() if why_not(r) is None),
        key=lambda r: (r["scenario"] in SLO_SCENARIOS, r["chip"] not in HOPPER),
    )
    rows = rows[: a.limit]  # fmt: skip
    out = []
    if a.resume and Path(a.out).exists():
        out = pd.read_csv(a.out).to_dict("records")
    done = {(o["source"], o["metric"]) for o in out}
    fits = step_fits()
    for r in rows:
        if (r["source"], r["metric"]) in done:
            continue
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
              f"{pred['seconds']:.1f} s", flush=True)  # fmt: skip
        # written after every row, atomically: an interrupted run resumes with --resume
        write_text_atomic(a.out, pd.DataFrame(out).to_csv(index=False))
    errors = [abs(o["ratio"] - 1) for o in out]
    inside = [o["predicted_lo"] <= o["measured"] <= o["predicted_hi"] for o in out]
    print(f"{len(out)} rows; median |predicted/measured - 1| = {statistics.median(errors):.1%}; "
          f"{statistics.mean(inside):.0%} inside the 80% interval")  # fmt: skip


if __name__ == "__main__":
    main()
