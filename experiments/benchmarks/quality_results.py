"""The quality runs named, exported with their intervals (the records behind the quality figures):

    python3 -m experiments.benchmarks.quality_results RUN_DIR [RUN_DIR ...] [--out DIR]

(each RUN_DIR a run's own folder, e.g. runs/hkv_quality/3fdc894f82) writes to
experiments/results/:
- hkv_quality.csv, gqa_uptrain.csv: one row per (point, seed, evaluation), without the curves;
- hkv_quality_history.json, gqa_uptrain_history.json: the validation curves;
- hkv_quality_summary.csv, gqa_uptrain_summary.csv: per group the mean over seeds, its 95%
  Student-t half width (`_ci`), n and std (`kvjax.stats.summarize`);
- quality_differences.csv: each comparison the README states, as a difference paired by seed
  (`kvjax.stats.paired_difference`) with its interval and whether it excludes 0.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from kvjax.runs.records import load_records
from kvjax.stats import paired_difference, summarize

RESULTS = Path(__file__).resolve().parent.parent / "results"
UPTRAIN_PAIRS = [
    ("mean", "first"), ("mean", "random"), ("first", "random"), ("scratch", "mean"),
    ("scratch", "first"), ("scratch", "mha"), ("mean", "mha"), ("first", "mha"),
]  # fmt: skip


def _row(family, comparison, condition, metric, a, b) -> dict:
    ci = paired_difference(a, b)
    return {"family": family, "comparison": comparison, "condition": condition, "metric": metric,
            "mean": ci.mean, "ci": ci.half_width, "low": ci.low, "high": ci.high, "n": ci.n,
            "per_seed": " ".join(f"{x:+.4f}" for x in (a - b.loc[a.index])),
            "excludes_zero": bool(ci.low > 0 or ci.high < 0)}  # fmt: skip


def quality_differences(q: pd.DataFrame) -> list[dict]:
    """stdlib: each h_kv against MHA (the model's own cache), each quantized cache against the
    same model's own; recall: each h_kv's accuracy against MHA's, per number of pairs."""
    rows = []
    for task, t in q.groupby("task"):
        N = int(t.num_heads.max())
        own = t[t.eval_kv_dtype == t.eval_kv_dtype.iloc[0]]
        cond = "num_pairs" if task == "recall" else None
        metric = "val_accuracy" if task == "recall" else "val_loss"
        for c, g in own.groupby(cond) if cond else [(None, own)]:
            by = g.set_index(["num_kv_heads", "seed"])[metric]
            for k in sorted(set(g.num_kv_heads) - {N}, reverse=True):
                rows.append(_row(task, f"h_kv={k} - MHA", f"{cond}={c:.0f}" if cond else "",
                                 metric, by.loc[k], by.loc[N]))  # fmt: skip
        by = t.set_index(["eval_kv_dtype", "num_kv_heads", "seed"])[metric].sort_index()
        base = own.eval_kv_dtype.iloc[0]
        for dtype in [d for d in t.eval_kv_dtype.unique() if d != base]:
            for k in sorted(t.num_kv_heads.unique(), reverse=True):
                rows.append(_row(task, f"{dtype} cache - {base}", f"h_kv={k}", metric,
                                 by.loc[(dtype, k)], by.loc[(base, k)]))  # fmt: skip
    return rows


def uptrain_differences(u: pd.DataFrame) -> list[dict]:
    """Per h_kv and fine-tune budget: the methods against each other, scratch and MHA."""
    mha = u[u.method == "mha"].set_index("seed").val_loss
    pretrain = int(u[u.method == "mha"].steps.min())
    rows = []
    for (k, steps), g in u[u.method != "mha"].groupby(["num_kv_heads", "steps"]):
        by = {m: s.set_index("seed").val_loss for m, s in g.groupby("method")}
        by["mha"] = mha
        for a, b in UPTRAIN_PAIRS:
            if a in by and b in by:
                rows.append(_row("uptrain", f"{a} - {b}", f"h_kv={k}; fine-tune {steps - pretrain}",
                                 "val_loss", by[a], by[b].loc[by[a].index]))  # fmt: skip
    return rows


def export(run_dirs, out: Path = RESULTS) -> dict[str, int]:
    df = load_records(run_dirs)
    if df.empty:
        raise SystemExit(f"no records under {', '.join(map(str, run_dirs))}")
    # a budget run retrains the same MHA model per seed: each record once
    keys = [c for c in ("experiment", "task", "method", "num_kv_heads", "num_pairs", "seed",
                        "eval_kv_dtype", "steps") if c in df]  # fmt: skip
    df = df.drop_duplicates(keys)
    out.mkdir(parents=True, exist_ok=True)
    rows, counts = [], {}
    for exp, by in (("hkv_quality", ["task", "num_pairs", "eval_kv_dtype", "num_kv_heads",
                                     "kv_bytes_per_token"]),
                    ("gqa_uptrain", ["method", "num_kv_heads", "steps"])):  # fmt: skip
        e = df[df.experiment == exp].dropna(axis=1, how="all")
        if e.empty:
            continue
        keep = [c for c in ("task", "method", "num_kv_heads", "num_pairs", "seed", "eval_kv_dtype",
                            "steps", "history") if c in e]  # fmt: skip
        with open(out / f"{exp}_history.json", "w") as f:
            json.dump(e[keep].to_dict("records"), f, default=str)
        e = e.drop(columns=["history"])
        e.to_csv(out / f"{exp}.csv", index=False)
        metrics = [m for m in ("val_loss", "val_accuracy", "val_loss_before") if m in e]
        summarize(e, [c for c in by if c in e], metrics).to_csv(out / f"{exp}_summary.csv",
                                                                 index=False)  # fmt: skip
        rows += quality_differences(e) if exp == "hkv_quality" else uptrain_differences(e)
        counts[exp] = len(e)
    pd.DataFrame(rows).to_csv(out / "quality_differences.csv", index=False)
    counts["differences"] = len(rows)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run folders (or runs roots) to export")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    print(export(args.runs, args.out))


if __name__ == "__main__":
    main()
