"""MLA beside MHA/GQA/MQA at equal KV bytes (configs/mla_quality.yaml, mla_recall.yaml beside
hkv_quality.yaml and hkv_recall_paired.yaml): the quality each spends its cache bytes for."""

from __future__ import annotations

import pandas as pd
from matplotlib import ticker

from kvjax.plotting.quality import _bars, _own_cache, _seeds, key_row, model_title, shifts
from kvjax.stats import summarize

FAMILY_COLORS = {"GQA": "#4C72B0", "MLA": "#C44E52"}


def _family(variant: str) -> str:
    return "MLA" if variant.startswith("MLA") else "GQA"


def _with_mla(df: pd.DataFrame) -> pd.DataFrame:
    """Per task, the records of the (pairs, steps) setting MLA ran, with MLA among them."""
    if "kv_lora_rank" not in df or "variant" not in df:
        return df.iloc[:0]
    keys = [c for c in ("task", "num_pairs", "steps") if c in df]
    ran = df[df.kv_lora_rank.fillna(0) > 0][keys].drop_duplicates()
    return df.merge(ran, on=keys) if len(ran) else df.iloc[:0]


def _paired(g: pd.DataFrame, metric: str) -> pd.DataFrame:
    """`metric` minus the same seed's MHA model's (the column `delta`)."""
    mha = g[g.variant == "MHA"].set_index("seed")[metric]
    g = g[g.seed.isin(mha.index)]
    return g.assign(delta=g[metric].to_numpy() - mha.loc[g.seed].to_numpy())


def mla_quality(records: pd.DataFrame, fig) -> bool | None:
    """(a) stdlib: validation loss minus the same seed's MHA model's against KV bytes per token,
    the GQA family (h_kv 4, 2, 1) and MLA (latent widths of the same bytes) one line each;
    (b) recall, where MLA ran it: accuracy per variant against KV bytes, each seed a dot, and
    how many seeds learned. Means over seeds with 95% intervals."""
    df = _with_mla(_own_cache(records[records.experiment == "hkv_quality"]))
    if df.empty:
        return False
    tasks = [t for t in ("stdlib", "recall") if t in set(df.task)]
    fig.set_size_inches(fig.get_figwidth(), 3.8)
    grid = fig.add_gridspec(2, len(tasks), height_ratios=[1.0, 0.3])
    axes = [fig.add_subplot(grid[0, i]) for i in range(len(tasks))]
    caption = ["points: means over seeds; bars: 95% Student-t intervals; dots: each seed"]
    for i, (ax, task) in enumerate(zip(axes, tasks, strict=True)):
        g = df[df.task == task]
        letter = f"({chr(ord('a') + i)})" if len(tasks) > 1 else ""
        metric = "val_loss" if task == "stdlib" else "val_accuracy"
        d = _paired(g, metric) if task == "stdlib" else g.assign(delta=g[metric])
        s = summarize(d, ["variant", "kv_bytes_per_token"], ["delta"])
        s["family"] = s.variant.map(_family)
        for (fam, sf), shift in zip(s.groupby("family"), shifts(2, 5.0), strict=True):
            sf = sf.sort_values("kv_bytes_per_token")
            if task == "stdlib":  # MHA (0 by construction) starts both lines
                sf = sf[sf.variant != "MHA"]
            color = FAMILY_COLORS[fam]
            _bars(
                ax,
                sf.kv_bytes_per_token,
                sf,
                "delta",
                color,
                fam,
                shift=shift,
                bounds=None if task == "stdlib" else (0.0, 1.0),
            )
            rows = d[d.variant.map(_family) == fam]
            _seeds(ax, rows.kv_bytes_per_token, rows.delta, color, shift=shift)
            for _, r in sf.iterrows():
                ax.annotate(
                    r.variant,
                    (r.kv_bytes_per_token, r.delta),
                    fontsize=5.5,
                    color=color,
                    xytext=(shift + 3, -7 if fam == "MLA" else 4),
                    textcoords="offset points",
                )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.set_xlabel("KV cache per token (bytes)")
        if task == "stdlib":
            ax.axhline(0.0, color="0.5", lw=0.6)
            ax.set_ylabel("loss - MHA's (nats/byte)")
            what = "validation loss minus the same seed's MHA model's"
        else:
            ax.set_ylabel("recall accuracy")
            what = f"recall accuracy at {int(g.num_pairs.iloc[0])} pairs"
            if "chance_accuracy" in g and g.chance_accuracy.notna().all():
                ax.axhline(g.chance_accuracy.iloc[0], color="0.5", ls=":", lw=0.8)
            if "learned" in g and g.learned.notna().any():
                learned = g.groupby("variant").learned.agg(lambda x: f"{int(x.sum())}/{len(x)}")
                caption.append(
                    f"{letter} seeds that learned recall (final accuracy >= 0.9): "
                    + ", ".join(f"{v} {n}" for v, n in learned.items())
                )
        named = g.sort_values("kv_lora_rank", kind="stable")  # the GQA model's name and shape
        ax.set_title(
            f"{letter} {what}\n{model_title(named, sep=chr(10))}, {int(g.steps.iloc[0]):,} steps",
            fontsize=7.5,
        )
    caption.append(
        "MLA's latent width A chosen so A + RoPE 8 equals GQA's 2 x h_kv x 16: each MLA point "
        "sits at a GQA point's bytes"
    )
    handles: dict = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    key_row(fig, grid[1, :], handles, caption, ncol=len(handles))
    return None
