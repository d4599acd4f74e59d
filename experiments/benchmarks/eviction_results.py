"""Eviction quality, paired by seed: each eviction's loss minus the full cache's, and sinks +
window minus a plain window of the same budget, with 95% Student-t intervals.

    python3 -m experiments.benchmarks.eviction_results runs/eviction_quality/<run> [--out CSV]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from kvjax.runs.records import load_records, write_text_atomic
from kvjax.stats import paired_difference


def differences(records: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for k, g in records.groupby("num_kv_heads"):
        loss = g.set_index(["eviction", "kv_budget", "seed"]).val_loss.sort_index()
        full = loss.loc["full"].droplevel(0)
        for budget in sorted(set(g[g.eviction != "full"].kv_budget)):
            sides = {e: loss.loc[(e, budget)] for e in ("sinks + window", "window")}
            pairs = [(e, sides[e], full) for e in sides]
            pairs.append(("sinks + window - window", sides["sinks + window"], sides["window"]))
            for what, a, b in pairs:
                i = paired_difference(a, b)
                rows.append({"num_kv_heads": int(k), "kv_budget": int(budget), "comparison": what,
                             "mean": i.mean, "low": i.mean - i.half_width,
                             "high": i.mean + i.half_width, "seeds": i.n,
                             "excludes_zero": abs(i.mean) > i.half_width})  # fmt: skip
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument(
        "--out", type=Path, default=Path("experiments/results/eviction_quality.csv")
    )
    args = parser.parse_args(argv)
    records = load_records(args.runs)
    table = differences(records[records.experiment == "eviction_quality"])
    write_text_atomic(args.out, table.to_csv(index=False))
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
