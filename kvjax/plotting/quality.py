"""The quality figures: every point the mean over seeds with its 95% Student-t interval as an
error bar (`kvjax.stats`), from the records of `hkv_quality` and `gqa_uptrain`."""

from __future__ import annotations

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


def _bars(ax, x, s, metric, color, label, marker="o", ls="-"):
    ci = s[f"{metric}_ci"].fillna(0.0) if f"{metric}_ci" in s else 0.0
    ax.errorbar(x, s[metric], yerr=ci, color=color, marker=marker, ms=3.5, lw=0.9, ls=ls,
                capsize=2, label=label)  # fmt: skip


def hkv_quality(records: pd.DataFrame, fig) -> None:
    """stdlib: validation loss against KV bytes per token, one point per num_kv_heads; recall:
    accuracy against the number of key-value pairs, one line per num_kv_heads (or, with one
    pair count, against KV bytes). Means over seeds with 95% intervals."""
    df = _own_cache(records[records.experiment == "hkv_quality"])
    tasks = [t for t in ("stdlib", "recall") if t in set(df.task)]
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    palette = kv_palette(df.num_kv_heads)
    for ax, task in zip(axes, tasks, strict=True):
        g = df[df.task == task]
        metric = "val_loss" if task == "stdlib" else "val_accuracy"
        pairs = g["num_pairs"].dropna().unique() if "num_pairs" in g else []
        if task == "recall" and len(pairs) > 1:
            s = summarize(g, ["num_kv_heads", "num_pairs"], [metric])
            for k, sk in s.groupby("num_kv_heads"):
                sk = sk.sort_values("num_pairs")
                _bars(ax, sk.num_pairs, sk, metric, palette[int(k)], f"h_kv={int(k)}")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("key-value pairs in context")
        else:
            s = summarize(g, ["num_kv_heads", "kv_bytes_per_token"], [metric])
            ax.plot(s.kv_bytes_per_token / 2**10, s[metric], color="0.6", lw=0.8, zorder=1)
            for _, r in s.iterrows():
                _bars(ax, [r.kv_bytes_per_token / 2**10], r.to_frame().T, metric,
                      palette[int(r.num_kv_heads)], f"h_kv={int(r.num_kv_heads)}")  # fmt: skip
            ax.set_xscale("log", base=2)
            ax.set_xlabel("KV cache per token (KiB)")
        if task == "recall" and "chance_accuracy" in g and g.chance_accuracy.notna().all():
            ax.axhline(g.chance_accuracy.iloc[0], color="0.5", ls=":", lw=0.8, label="chance")
        seeds = int(g.seed.nunique()) if "seed" in g else 1
        ax.set_ylabel("validation loss (nats/byte)" if task == "stdlib" else "recall accuracy")
        ax.set_title(f"{g.model.iloc[0]}: {task}, {int(g.tokens.iloc[0]):,} tokens, "
                     f"{seeds} seeds (95% CI)", fontsize=7)  # fmt: skip
        ax.legend(fontsize=5, frameon=True)


def kv_pareto(records: pd.DataFrame, fig) -> None:
    """The seed's trade-off in one picture: stdlib validation loss against KV bytes per token
    (scales included) over num_kv_heads x the cache's dtype (the model's own, int8, fp8,
    int4, int2)."""
    df = records[(records.experiment == "hkv_quality") & (records.task == "stdlib")]
    ax = fig.subplots()
    palette = kv_palette(df.num_kv_heads)
    s = summarize(df, ["eval_kv_dtype", "num_kv_heads", "kv_bytes_per_token"], ["val_loss"])
    for dtype, sd in s.groupby("eval_kv_dtype", sort=False):
        sd = sd.sort_values("kv_bytes_per_token")
        ax.plot(sd.kv_bytes_per_token, sd.val_loss, color="0.7", lw=0.7, zorder=1)
        for _, r in sd.iterrows():
            ax.errorbar(r.kv_bytes_per_token, r.val_loss, yerr=r.get("val_loss_ci", 0.0),
                        color=palette[int(r.num_kv_heads)], marker=DTYPE_MARKERS.get(dtype, "D"),
                        ms=4, capsize=2, lw=0.8, ls="none")  # fmt: skip
        ax.plot([], [], color="0.3", marker=DTYPE_MARKERS.get(dtype, "D"), ls="none",
                label=f"{dtype} cache")  # fmt: skip
    for k in sorted(palette):
        ax.plot([], [], color=palette[k], lw=3, label=f"h_kv={k}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("KV cache per token (bytes, scales included)")
    ax.set_ylabel("stdlib validation loss (nats/byte)")
    seeds = int(df.seed.nunique()) if "seed" in df else 1
    ax.set_title(f"{df.model.iloc[0]}: quality against KV bytes, {seeds} seeds (95% CI)",
                 fontsize=7)  # fmt: skip
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
    same against the fine-tune steps. Right: the fine-tune's curves (seed 0)."""
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
    first = tuned[tuned.method.isin(["mean", "first", "random"]) & (tuned.finetune == budget)]
    if "seed" in first:
        first = first[first.seed == first.seed.min()]
    for _, r in first[first.num_kv_heads == first.num_kv_heads.min()].iterrows():
        steps = [h["step"] for h in r.history]
        ax_curve.plot(steps, [h["val_loss"] for h in r.history], marker="o", ms=2.5,
                      color=UPTRAIN_COLORS[r.method], label=r.method)  # fmt: skip
    ax_curve.set_xlabel("fine-tune steps")
    ax_curve.set_title(f"fine-tune of h_kv={int(first.num_kv_heads.min())}", fontsize=7)
    ax_curve.legend(fontsize=5, frameon=True)
