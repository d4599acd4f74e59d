"""The quality figures: every point the mean over seeds with its 95% Student-t interval as an
error bar (`kvjax.stats`), from the records of `hkv_quality` and `gqa_uptrain`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvjax.plotting.style import kv_palette
from kvjax.stats import summarize

DTYPE_MARKERS = {"f32": "o", "bf16": "o", "int8": "s", "fp8": "^", "int4": "v", "int2": "X"}


def _own_cache(df: pd.DataFrame) -> pd.DataFrame:
    """Records evaluated with the model's own KV dtype (not a quantized re-evaluation)."""
    if "eval_kv_dtype" not in df:
        return df
    own = df.groupby(["task", "num_kv_heads"], dropna=False).eval_kv_dtype.transform("first")
    return df[df.eval_kv_dtype.fillna(own) == own]


def _bars(ax, x, s, metric, color, label, marker="o", ls="-", bounds=None):
    """Means with their intervals; `bounds` (lo, hi) clips the bars to the metric's range (an
    accuracy's t interval over 3 seeds can pass 0 or 1)."""
    ci = s[f"{metric}_ci"].fillna(0.0).to_numpy(float) if f"{metric}_ci" in s else 0.0 * s[metric]
    y = s[metric].to_numpy(float)
    yerr = [ci, ci] if bounds is None else [np.minimum(ci, y - bounds[0]),
                                            np.minimum(ci, bounds[1] - y)]  # fmt: skip
    ax.errorbar(x, y, yerr=yerr, color=color, marker=marker, ms=3.5, lw=0.9, ls=ls, capsize=2,
                label=label)  # fmt: skip


def _seeds(ax, x, values, color, marker="o"):
    """Each seed's value, small, behind the mean."""
    ax.scatter(x, values, s=9, color=color, alpha=0.5, marker=marker, lw=0, zorder=0)


def _minus_mha(df: pd.DataFrame, metric: str, on: list[str]) -> tuple[pd.DataFrame, float]:
    """`metric` minus the MHA model's (the most KV heads; its own cache) of the same seed and
    the same `on` keys: paired differences, whose interval leaves out the seed-to-seed spread
    both sides share. Also the MHA model's mean."""
    mha = _own_cache(df)
    mha = mha[mha.num_kv_heads == mha.num_kv_heads.max()]
    keys = on + (["seed"] if "seed" in df else [])
    base = mha[keys + [metric]].rename(columns={metric: "_mha"})
    out = df.merge(base, on=keys, how="left")
    return out.assign(delta=out[metric] - out["_mha"]), float(mha[metric].mean())


def hkv_quality(records: pd.DataFrame, fig) -> None:
    """stdlib: validation loss minus the MHA model's of the same seed against KV bytes per
    token, one point per num_kv_heads; recall: accuracy against the number of key-value pairs,
    one line per num_kv_heads (or, with one pair count, against KV bytes). Means over seeds with
    95% intervals, each seed a dot."""
    df = _own_cache(records[records.experiment == "hkv_quality"])
    tasks = [t for t in ("stdlib", "recall") if t in set(df.task)]
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    palette = kv_palette(df.num_kv_heads)
    for ax, task in zip(axes, tasks, strict=True):
        g = df[df.task == task]
        seeds = int(g.seed.nunique()) if "seed" in g else 1
        pairs = g["num_pairs"].dropna().unique() if "num_pairs" in g else []
        if task == "recall" and len(pairs) > 1:
            s = summarize(g, ["num_kv_heads", "num_pairs"], ["val_accuracy"])
            heads = sorted(s.num_kv_heads.unique())
            for k, sk in s.groupby("num_kv_heads"):
                sk = sk.sort_values("num_pairs")
                dodge = 2 ** (0.04 * (heads.index(k) - (len(heads) - 1) / 2))  # apart at each x
                _bars(ax, sk.num_pairs * dodge, sk, "val_accuracy", palette[int(k)],
                      f"h_kv={int(k)}", bounds=(0.0, 1.0))  # fmt: skip
                gk = g[g.num_kv_heads == k]
                _seeds(ax, gk.num_pairs * dodge, gk.val_accuracy, palette[int(k)])
            ax.set_xscale("log", base=2)
            ax.set_xlabel("key-value pairs in context")
            ax.set_ylabel("recall accuracy")
            ax.set_title(f"{g.model.iloc[0]}: recall, {int(g.tokens.iloc[0]):,} tokens\n"
                         f"{seeds} seeds, 95% CI (clipped to [0, 1])", fontsize=7)  # fmt: skip
        else:
            metric = "val_loss" if task == "stdlib" else "val_accuracy"
            d, mha = _minus_mha(g, metric, ["task"])
            s = summarize(d, ["num_kv_heads", "kv_bytes_per_token"], ["delta"])
            ax.plot(s.kv_bytes_per_token / 2**10, s.delta, color="0.6", lw=0.8, zorder=1)
            for _, r in s.iterrows():
                _bars(ax, [r.kv_bytes_per_token / 2**10], r.to_frame().T, "delta",
                      palette[int(r.num_kv_heads)], f"h_kv={int(r.num_kv_heads)}")  # fmt: skip
            _seeds(ax, d.kv_bytes_per_token / 2**10, d.delta, [palette[int(k)] for k in
                                                                 d.num_kv_heads])  # fmt: skip
            ax.axhline(0.0, color="0.5", lw=0.6)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("KV cache per token (KiB)")
            unit = "nats/byte" if task == "stdlib" else "accuracy"
            ax.set_ylabel(f"{'loss' if task == 'stdlib' else 'accuracy'} - MHA's ({unit})")
            ax.set_title(f"{g.model.iloc[0]}: {task}, {int(g.tokens.iloc[0]):,} tokens, MHA "
                         f"{mha:.4f}\n{seeds} seeds, paired, 95% CI", fontsize=7)  # fmt: skip
        if task == "recall" and "chance_accuracy" in g and g.chance_accuracy.notna().all():
            ax.axhline(g.chance_accuracy.iloc[0], color="0.5", ls=":", lw=0.8, label="chance")
        ax.legend(fontsize=5, frameon=True)


def kv_pareto(records: pd.DataFrame, fig) -> None:
    """The seed's trade-off in one picture: stdlib validation loss, minus the MHA model's with
    its own cache for the same seed, against KV bytes per token (scales included) over
    num_kv_heads x the cache's dtype (the model's own, int8, fp8, int4, int2)."""
    df = records[(records.experiment == "hkv_quality") & (records.task == "stdlib")]
    ax = fig.subplots()
    palette = kv_palette(df.num_kv_heads)
    d, mha = _minus_mha(df, "val_loss", ["task"])
    s = summarize(d, ["eval_kv_dtype", "num_kv_heads", "kv_bytes_per_token"], ["delta"])
    for dtype, sd in s.groupby("eval_kv_dtype", sort=False):
        sd = sd.sort_values("kv_bytes_per_token")
        ax.plot(sd.kv_bytes_per_token, sd.delta, color="0.7", lw=0.7, zorder=1)
        for _, r in sd.iterrows():
            ci = r.get("delta_ci", 0.0)
            ax.errorbar(r.kv_bytes_per_token, r.delta, yerr=0.0 if pd.isna(ci) else ci,
                        color=palette[int(r.num_kv_heads)], marker=DTYPE_MARKERS.get(dtype, "D"),
                        ms=4, capsize=2, lw=0.8, ls="none")  # fmt: skip
        ax.plot([], [], color="0.3", marker=DTYPE_MARKERS.get(dtype, "D"), ls="none",
                label=f"{dtype} cache")  # fmt: skip
    for k in sorted(palette):
        ax.plot([], [], color=palette[k], lw=3, label=f"h_kv={k}")
    ax.axhline(0.0, color="0.5", lw=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("KV cache per token (bytes, scales included)")
    ax.set_ylabel("stdlib loss - MHA's (nats/byte)")
    seeds = int(df.seed.nunique()) if "seed" in df else 1
    ax.set_title(f"{df.model.iloc[0]}: quality against KV bytes, MHA (f32) {mha:.4f}\n"
                 f"{seeds} seeds, paired by seed, 95% CI", fontsize=7)  # fmt: skip
    ax.legend(fontsize=5, frameon=True, ncol=2)


UPTRAIN_COLORS = {"mean": "#4c72b0", "first": "#dd8452", "random": "#55a868", "scratch": "0.35"}


def _mha_band(ax, mha: pd.DataFrame) -> None:
    if mha.empty:
        return
    m = summarize(mha, ["method"], ["val_loss"]).iloc[0]
    ci = m.get("val_loss_ci", 0.0)
    ci = 0.0 if pd.isna(ci) else ci
    ax.axhspan(m.val_loss - ci, m.val_loss + ci, color="0.85", zorder=0)
    ax.axhline(m.val_loss, color="0.3", lw=0.8, label="MHA (trained)")


def gqa_uptrain(records: pd.DataFrame, fig) -> None:
    """Left: validation loss after the fine-tune against num_kv_heads per conversion method and
    from scratch for the same tokens, at the smallest fine-tune budget, the MHA model's as a band
    (means over seeds, 95% CIs). Middle (when a num_kv_heads was run at several budgets): the
    same against the fine-tune steps. Right: the longest fine-tune's curves (seed 0)."""
    df = records[records.experiment == "gqa_uptrain"]
    # runs at several budgets retrain the same MHA model per seed: count each once
    df = df.drop_duplicates(["method", "num_kv_heads", "seed", "steps"])
    mha = df[df.method == "mha"]
    pretrain = int(mha.steps.min()) if not mha.empty else 0
    tuned = df[df.method != "mha"].assign(finetune=lambda d: d.steps - pretrain)
    budget = tuned.finetune.min()
    ax, ax_budget, ax_curve = fig.subplots(1, 3)
    s = summarize(tuned[tuned.finetune == budget], ["method", "num_kv_heads"], ["val_loss"])
    for method, sm in s.groupby("method", sort=False):
        sm = sm.sort_values("num_kv_heads")
        _bars(ax, sm.num_kv_heads, sm, "val_loss", UPTRAIN_COLORS.get(method, "0.5"), method,
              ls="--" if method == "scratch" else "-")  # fmt: skip
    _mha_band(ax, mha)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("num_kv_heads after conversion")
    ax.set_ylabel("validation loss")
    seeds = int(df.seed.nunique()) if "seed" in df else 1
    ax.set_title(f"{budget} fine-tune steps, {seeds} seeds (95% CI)", fontsize=7)
    ax.legend(fontsize=5, frameon=True)
    budgets = tuned.groupby("num_kv_heads").finetune.nunique()
    if budgets.max() > 1:
        k = int(budgets.idxmax())
        s = summarize(tuned[tuned.num_kv_heads == k], ["method", "finetune"], ["val_loss"])
        for method, sm in s.groupby("method", sort=False):
            sm = sm.sort_values("finetune")
            _bars(ax_budget, sm.finetune, sm, "val_loss", UPTRAIN_COLORS.get(method, "0.5"),
                  method, ls="--" if method == "scratch" else "-")  # fmt: skip
        _mha_band(ax_budget, mha)
        ax_budget.set_xlabel(f"fine-tune steps (of {pretrain} pre-training; scratch: as many more)")
        ax_budget.set_title(f"h_kv={k}: the conversion's budget", fontsize=7)
        ax_budget.legend(fontsize=5, frameon=True)
    else:
        ax_budget.set_axis_off()
    longest = tuned.finetune.max()  # the curves of the longest fine-tune
    first = tuned[tuned.method.isin(["mean", "first", "random"]) & (tuned.finetune == longest)]
    if "seed" in first:
        first = first[first.seed == first.seed.min()]
    for _, r in first[first.num_kv_heads == first.num_kv_heads.min()].iterrows():
        steps = [h["step"] for h in r.history]
        ax_curve.plot(steps, [h["val_loss"] for h in r.history], marker="o", ms=2.5,
                      color=UPTRAIN_COLORS[r.method], label=r.method)  # fmt: skip
    ax_curve.set_xlabel("fine-tune steps")
    ax_curve.set_title(f"fine-tune of h_kv={int(first.num_kv_heads.min())}", fontsize=7)
    ax_curve.legend(fontsize=5, frameon=True)
