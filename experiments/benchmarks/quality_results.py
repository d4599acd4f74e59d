"""The quality runs named, exported with their intervals (the records behind the quality figures):

    python3 -m experiments.benchmarks.quality_results RUN_DIR [RUN_DIR ...] [--out DIR]

(each RUN_DIR a run's own folder, e.g. runs/hkv_quality/3fdc894f82) writes to
experiments/results/:
- hkv_quality.csv, gqa_uptrain.csv: one row per (point, seed, evaluation), without the curves;
- hkv_quality_history.json, gqa_uptrain_history.json: the validation curves;
- hkv_quality_summary.csv, gqa_uptrain_summary.csv: per group the mean over seeds, its 95%
  Student-t half width (`_ci`), n and std (`kvjax.stats.summarize`);
- quality_differences.csv: each comparison the README states, as a difference paired by seed
  (`kvjax.stats.paired_difference`) with its interval, whether it excludes 0, the smallest
  difference its seeds detect 80% of the time (`detectable`, `kvjax.stats.detectable_difference`)
  and, on recall, how many seeds of each side learned the task (`learned`).

The runs' records are merged into the committed exports (a record of the same experiment, task,
method, variant, h_kv, pairs, seed, evaluation and steps replaces the committed one; `--replace`
writes these runs' alone), so one config can be re-run without the others (20-45 minutes each).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from kvjax.runs.exports import load_exports, with_variants
from kvjax.runs.records import load_records
from kvjax.stats import detectable_difference, paired_difference, summarize

RESULTS = Path(__file__).resolve().parent.parent / "results"
UPTRAIN_PAIRS = [
    ("mean", "first"), ("mean", "random"), ("first", "random"), ("scratch", "mean"),
    ("scratch", "first"), ("scratch", "mha"), ("mean", "mha"), ("first", "mha"),
]  # fmt: skip


def _row(family, comparison, condition, metric, a, b, learned=None) -> dict:
    seeds = sorted(set(a.index) & set(b.index))  # the seeds both sides ran
    a, b = a.loc[seeds], b.loc[seeds]
    ci = paired_difference(a, b)
    return {"family": family, "comparison": comparison, "condition": condition, "metric": metric,
            "mean": ci.mean, "ci": ci.half_width, "low": ci.low, "high": ci.high, "n": ci.n,
            "per_seed": " ".join(f"{x:+.4f}" for x in (a - b)),
            "excludes_zero": bool(ci.low > 0 or ci.high < 0),
            # the smallest true difference these pairs find 80% of the time (kvjax.stats)
            "detectable": detectable_difference(ci.std, ci.n) if ci.n > 1 else float("nan"),
            "learned": learned}  # fmt: skip


def _gqa_name(variant: str) -> str:
    """The comparisons' names for the GQA family (kept from before MLA: `h_kv=2 - MHA`)."""
    return {"MQA": "h_kv=1"}.get(variant, variant.replace("GQA-", "h_kv="))


def _learned(g, *variants) -> str | None:
    """`MHA 5/5, MQA 3/5`: how many seeds of each side learned the recall task."""
    if "learned" not in g or g.learned.isna().all():
        return None
    parts = []
    for v in variants:
        runs = g[g.variant == v].learned.dropna()
        parts.append(f"{v} {int(runs.astype(bool).sum())}/{len(runs)}")
    return ", ".join(parts)


def quality_differences(q: pd.DataFrame) -> list[dict]:
    """Per task (recall: per pairs in context and training steps), each variant against MHA and
    each MLA width against the GQA model of the same KV bytes per token, on the model's own
    cache; then each quantized cache against the same GQA model's own. stdlib compares
    validation loss; recall the final accuracy, the final loss and the steps to learn (where
    every run of both sides learned)."""
    rows = []
    for task, t in q.groupby("task"):
        own = t[t.eval_kv_dtype == t.eval_kv_dtype.iloc[0]]
        # recall: the final accuracy, the final loss (no ceiling) and the steps to learn the task
        metrics = RECALL_METRICS if task == "recall" else ["val_loss"]
        if task == "recall":
            groups = own.groupby(["num_pairs", "steps"])
        else:  # the steps named where runs of several lengths are exported
            groups = (((None, s), g) for s, g in own.groupby("steps"))
        several = own.steps.nunique() > 1
        for c, g in groups:
            cond = (f"num_pairs={c[0]:.0f}, {c[1]:.0f} steps" if task == "recall"
                    else f"{c[1]:.0f} steps" if several else "")  # fmt: skip
            if "MHA" not in set(g.variant):
                continue
            gqa = g[g.kv_lora_rank == 0].sort_values("num_kv_heads", ascending=False)
            same_bytes = dict(zip(gqa.kv_bytes_per_token, gqa.variant, strict=True))
            mla = g[g.kv_lora_rank > 0].sort_values("kv_lora_rank", ascending=False)
            pairs = [(f"{_gqa_name(v)} - MHA", cond, v, "MHA")
                     for v in dict.fromkeys(gqa.variant) if v != "MHA"]  # fmt: skip
            for v, nbytes in dict(zip(mla.variant, mla.kv_bytes_per_token, strict=True)).items():
                pairs.append((f"{v} - MHA", cond, v, "MHA"))
                twin = same_bytes.get(nbytes)
                if twin and twin != "MHA":
                    pairs.append((f"{v} - {_gqa_name(twin)}", f"{cond}{'; ' * bool(cond)}equal KV "
                                  f"bytes ({nbytes:.0f} B/token)", v, twin))  # fmt: skip
            for metric in [m for m in metrics if m in g]:
                by = g.set_index(["variant", "seed"])[metric]
                for name, where, a, b in pairs:
                    if by.loc[a].isna().any() or by.loc[b].isna().any():
                        continue  # a run that never learned has no steps to learn
                    rows.append(_row(task, name, where, metric, by.loc[a], by.loc[b],
                                     _learned(g, a, b)))  # fmt: skip
        metric = metrics[0]
        gqa = t[t.kv_lora_rank == 0]
        by = gqa.set_index(["eval_kv_dtype", "num_kv_heads", "seed"])[metric].sort_index()
        base = own.eval_kv_dtype.iloc[0]
        for dtype in [d for d in gqa.eval_kv_dtype.unique() if d != base]:
            for k in sorted(gqa[gqa.eval_kv_dtype == dtype].num_kv_heads.unique(), reverse=True):
                rows.append(_row(task, f"{dtype} cache - {base}", f"h_kv={k}", metric,
                                 by.loc[(dtype, k)], by.loc[(base, k)]))  # fmt: skip
    return rows


def uptrain_differences(u: pd.DataFrame) -> list[dict]:
    """Per h_kv and fine-tune budget: the methods against each other, scratch and MHA."""
    mha = u[u.method == "mha"].set_index("seed").val_loss
    pretrain = int(u[u.method == "mha"].steps.min())
    rows = []
    for (k, steps), g in u[~u.method.isin(["mha", "mha2mla"])].groupby(["num_kv_heads", "steps"]):
        by = {m: s.set_index("seed").val_loss for m, s in g.groupby("method")}
        by["mha"] = mha
        for a, b in UPTRAIN_PAIRS:
            if a in by and b in by:
                rows.append(_row("uptrain", f"{a} - {b}", f"h_kv={k}; fine-tune {steps - pretrain}",
                                 "val_loss", by[a], by[b]))  # fmt: skip
    return rows + mla_uptrain_differences(u, mha, pretrain)


def mla_uptrain_differences(u: pd.DataFrame, mha: pd.Series, pretrain: int) -> list[dict]:
    """Each MHA -> MLA conversion (method mha2mla) against the mean-pooled GQA of the same KV
    bytes per token and fine-tune budget (after the fine-tune, and right after the conversion),
    and against the MHA model it came from."""
    rows = []
    per_head = (
        u[u.method == "mha"].kv_bytes_per_token.max() / u[u.method == "mha"].num_kv_heads.max()
    )
    for (a, nbytes, steps), g in u[u.method == "mha2mla"].groupby(
        ["kv_lora_rank", "kv_bytes_per_token", "steps"]
    ):
        mla = g.set_index("seed")
        k = nbytes / per_head  # the h_kv whose GQA cache has these bytes
        where = (f"MLA-{a:.0f} vs h_kv={k:g} ({nbytes:.0f} B/token); "
                 f"fine-tune {steps - pretrain}")  # fmt: skip
        twin = u[(u.method == "mean") & (u.kv_bytes_per_token == nbytes) & (u.steps == steps)]
        if not twin.empty:
            twin = twin.set_index("seed")
            for metric in ("val_loss", "val_loss_before"):
                if metric not in twin or twin[metric].isna().any() or mla[metric].isna().any():
                    continue
                rows.append(_row("uptrain", "mha2mla - mean", where, metric, mla[metric],
                                 twin[metric]))  # fmt: skip
        rows.append(_row("uptrain", "mha2mla - mha", where, "val_loss", mla.val_loss, mha))
    return rows


RECALL_METRICS = ["val_accuracy", "val_loss", "steps_to_learn"]


def steps_to_learn(history) -> float:
    """The first evaluated step at which a recall run's accuracy reached LEARNED_ACCURACY (nan if
    none did; the resolution is the run's eval_every)."""
    from experiments.hkv_quality import LEARNED_ACCURACY

    for h in history if isinstance(history, list) else []:
        if h.get("val_accuracy", 0.0) >= LEARNED_ACCURACY:
            return float(h["step"])
    return float("nan")


KEYS = ["experiment", "task", "method", "variant", "num_kv_heads", "num_pairs", "seed",
        "eval_kv_dtype", "steps"]  # fmt: skip


def export(run_dirs, out: Path = RESULTS, merge: bool = True) -> dict[str, int]:
    """The runs' records (with `merge`, added to the exports already in `out`: a record of the
    same experiment, task, method, variant, h_kv, pairs, seed, evaluation and steps replaces the
    committed one, the others stay) written as the files the module's docstring lists."""
    df = load_records(run_dirs)
    if df.empty:
        raise SystemExit(f"no records under {', '.join(map(str, run_dirs))}")
    hkv = df.experiment == "hkv_quality"
    if hkv.any():
        part = df[hkv].copy()
        with_variants(part)
        df = pd.concat([part, df[~hkv]], ignore_index=True)
    if merge and any((out / f"{e}.csv").exists() for e in ("hkv_quality", "gqa_uptrain")):
        df = pd.concat([load_exports(out), df], ignore_index=True)
    # a budget run retrains the same MHA model per seed: each record once, the newest
    df = df.drop_duplicates([c for c in KEYS if c in df], keep="last")
    out.mkdir(parents=True, exist_ok=True)
    rows, counts = [], {}
    for exp, by in (("hkv_quality", ["task", "num_pairs", "steps", "eval_kv_dtype", "variant",
                                     "num_kv_heads", "kv_lora_rank", "kv_bytes_per_token"]),
                    ("gqa_uptrain", ["method", "num_kv_heads", "kv_lora_rank",
                                     "steps"])):  # fmt: skip
        e = df[df.experiment == exp].dropna(axis=1, how="all")
        if e.empty:
            continue
        if exp == "gqa_uptrain" and "kv_lora_rank" in e:  # 0: GQA (before MHA -> MLA ran)
            e["kv_lora_rank"] = e.kv_lora_rank.fillna(0)
        keep = [c for c in ("task", "method", "variant", "num_kv_heads", "num_pairs", "seed",
                            "eval_kv_dtype", "steps", "history") if c in e]  # fmt: skip
        if exp == "hkv_quality" and "task" in e:
            e["steps_to_learn"] = [steps_to_learn(h) if t == "recall" else float("nan")
                                   for h, t in zip(e.history, e.task, strict=True)]  # fmt: skip
        with open(out / f"{exp}_history.json", "w") as f:
            json.dump(e[keep].to_dict("records"), f, default=str)
        e = e.drop(columns=["history"])
        e.to_csv(out / f"{exp}.csv", index=False)
        metrics = [m for m in ("val_loss", "val_accuracy", "val_loss_before", "steps_to_learn")
                   if m in e]  # fmt: skip
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
    ap.add_argument(
        "--replace",
        action="store_true",
        help="write only these runs' records (default: merge into --out's exports)",
    )
    args = ap.parse_args()
    print(export(args.runs, args.out, merge=not args.replace))


if __name__ == "__main__":
    main()
