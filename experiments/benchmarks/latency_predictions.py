"""Benchmark: MLPerf's P99 TTFT and TPOT predicted at the rate each Server and Interactive
submission ran (`kvjax.serving.latency_predict`), held out by implementation, written to
experiments/results/latency_predictions.csv for `kvjax validate` to summarize.

    python3 -m experiments.benchmarks.latency_predictions [--out F] [--only TEXT] [--chips C,..]
        [--resume]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from kvjax.files import write_text_atomic
from kvjax.serving.latency_predict import LATENCY_CSV, latency_summary, predict_latencies
from kvjax.serving.systems import read_systems


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(LATENCY_CSV))
    p.add_argument("--only", default="", help="sources containing this text only")
    p.add_argument("--chips", default="", help="these chips only, comma-separated (default all)")
    p.add_argument("--resume", action="store_true", help="keep the rows --out holds, run the rest")
    a = p.parse_args()
    done: list[dict] = []
    if a.resume and Path(a.out).exists():
        done = pd.read_csv(a.out).to_dict("records")
    kept = {r["source"] for r in done}
    chips = set(filter(None, a.chips.split(",")))

    def on_row(r: dict) -> None:
        done.append(r)
        print(
            f"{r['source']} {r['metric']}: predicted {r['predicted_value']:.4g} "
            f"[{r['predicted_lo']:.4g}, {r['predicted_hi']:.4g}], measured {r['measured']:.4g}",
            flush=True,
        )
        write_text_atomic(a.out, pd.DataFrame(done).to_csv(index=False))  # each row kept

    rows = [
        r
        for r in read_systems()
        if a.only in r["source"] and r["source"] not in kept and (not chips or r["chip"] in chips)
    ]
    predict_latencies(rows, on_row)
    print(latency_summary(Path(a.out)))


if __name__ == "__main__":
    main()
