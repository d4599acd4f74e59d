"""The quality figures: every point the mean over seeds with its 95% Student-t interval as an
error bar (`kvjax.stats`), from the records of `hkv_quality` and `gqa_uptrain`."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib import ticker

from kvjax.plotting.style import caption_below, kv_palette
from kvjax.stats import summarize

DTYPE_MARKERS = {"f32": "o", "bf16": "o", "int8": "s", "fp8": "^", "int4": "v", "int2": "X"}


def _own_cache(df: pd.DataFrame) -> pd.DataFrame:
    """Records evaluated with the model's own KV dtype (not a quantized re-evaluation)."""
    if "eval_kv_dtype" not in df:
        return df
    own = df.groupby(["task", "num_kv_heads"], dropna=False).eval_kv_dtype.transform("first")
    return df[df.eval_kv_dtype.fillna(own) == own]


def gqa_sweep(df: pd.DataFrame) -> pd.DataFrame:
    """The h_kv sweep's records: no MLA (`kv_lora_rank` 0 or not recorded), and per task the
    training length most of its records ran (the longer paired recall runs are mla_quality's)."""
    if "kv_lora_rank" in df:
        df = df[df.kv_lora_rank.fillna(0) == 0]
    if "steps" in df and len(df):
        usual = df.groupby("task").steps.agg(lambda s: s.mode().iloc[0])
        df = df[df.steps == df.task.map(usual)]
    return df


def _bars(ax, x, s, metric, color, label, marker="o", ls="-", bounds=None, shift=0.0):
    """Means with their intervals; `bounds` (lo, hi) clips the bars to the metric's range (an
    accuracy's t interval over 3 seeds can pass 0 or 1); `shift` draws them that many points
    to the side (`dodge`), the data unchanged."""
    ci = s[f"{metric}_ci"].fillna(0.0).to_numpy(float) if f"{metric}_ci" in s else 0.0 * s[metric]
    y = s[metric].to_numpy(float)
    yerr = (
        [ci, ci]
        if bounds is None
        else [np.minimum(ci, y - bounds[0]), np.minimum(ci, bounds[1] - y)]
    )
    ax.errorbar(
        x,
        y,
        yerr=yerr,
        color=color,
        marker=marker,
        ms=3.5,
        lw=0.9,
        ls=ls,
        capsize=2,
        label=label,
        transform=dodge(ax, shift),
    )
    x = np.asarray(x, float)
    _span(ax, np.r_[x, x], np.r_[y - yerr[0], y + yerr[1]])


def _seeds(ax, x, values, color, marker="o", shift=0.0):
    """Each seed's value, small, behind the mean."""
    ax.scatter(
        x,
        values,
        s=9,
        color=color,
        alpha=0.5,
        marker=marker,
        lw=0,
        zorder=0,
        transform=dodge(ax, shift),
    )
    _span(ax, x, values)


def _span(ax, x, y) -> None:
    """Count points drawn through `dodge` in the axes' limits (matplotlib leaves out artists
    whose transform is not the data's)."""
    ax.update_datalim(np.column_stack([np.asarray(x, float), np.asarray(y, float)]))
    ax.autoscale_view()


def dodge(ax, points: float):
    """Data coordinates drawn `points` to the right: markers that share an x side by side, their
    data (and the axes' data) unchanged."""
    from matplotlib.transforms import ScaledTranslation

    return ax.transData + ScaledTranslation(points / 72, 0, ax.figure.dpi_scale_trans)


def shifts(n: int, step: float = 3.5) -> list[float]:
    """`n` offsets in points, `step` apart, centred on 0."""
    return [step * (i - (n - 1) / 2) for i in range(n)]


DATA = {"stdlib": "stdlib bytes", "recall": "associative recall"}
KEY_FONT = 8


def model_title(g: pd.DataFrame, sep: str = " ") -> str:
    """`quality-small (4 layers, d 128) on stdlib bytes, 3 seeds`: the model, its shape where
    the records hold it, the data and the seeds."""
    r = g.iloc[0]
    have = [c for c in ("num_layers", "d_model") if c in g and pd.notna(r[c])]
    shape = [f"{int(r[c])} layers" if c == "num_layers" else f"d {int(r[c])}" for c in have]
    seeds = int(g.seed.nunique()) if "seed" in g else 1
    model = f"{r.model} ({', '.join(shape)})" if shape else str(r.model)
    return f"{model}{sep}on {DATA.get(r.task, r.task)}, {seeds} seed{'s' * (seeds > 1)}"


def key_row(fig, grid_cell, handles: dict, caption: list[str], ncol: int) -> None:
    """The figure's key and caption in a row of their own below the panels, off the data."""
    key = fig.add_subplot(grid_cell)
    key.axis("off")
    key.legend(
        list(handles.values()),
        list(handles),
        loc="upper center",
        ncol=ncol,
        fontsize=KEY_FONT,
        frameon=False,
        columnspacing=1.2,
        handletextpad=0.4,
    )
    caption_below(key, caption, KEY_FONT - 1)


def _handles(axes) -> dict:
    out: dict = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            out.setdefault(label, h)
    return out


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
    """(a) stdlib: validation loss minus the MHA model's of the same seed against KV bytes per
    token, one point per num_kv_heads; (b) recall: accuracy against the number of key-value
    pairs, one line per num_kv_heads (or, with one pair count, against KV bytes). Means over
    seeds with 95% intervals, each seed a dot; the key and a caption below."""
    df = _own_cache(gqa_sweep(records[records.experiment == "hkv_quality"]))
    tasks = [t for t in ("stdlib", "recall") if t in set(df.task)]
    fig.set_size_inches(fig.get_figwidth(), 4.0)
    grid = fig.add_gridspec(2, len(tasks), height_ratios=[1.0, 0.36])
    axes = [fig.add_subplot(grid[0, i]) for i in range(len(tasks))]
    palette = kv_palette(df.num_kv_heads)
    caption = ["points: means over seeds; bars: 95% Student-t intervals; dots: each seed"]
    for i, (ax, task) in enumerate(zip(axes, tasks, strict=True)):
        g = df[df.task == task]
        letter = f"({chr(ord('a') + i)})" if len(tasks) > 1 else ""
        pairs = g["num_pairs"].dropna().unique() if "num_pairs" in g else []
        if task == "recall" and len(pairs) > 1:
            caption += _recall_over_pairs(ax, g, df, pairs, palette, letter)
        else:
            caption += _against_kv_bytes(ax, g, df, task, palette, letter)
        if task == "recall" and "chance_accuracy" in g and g.chance_accuracy.notna().all():
            ax.axhline(
                g.chance_accuracy.iloc[0], color="0.5", ls=":", lw=0.8, label="chance (recall)"
            )
    handles = _handles(axes)
    handles = {
        k: handles[k] for k in sorted(handles, key=lambda s: (not s.startswith("h_kv"), len(s), s))
    }
    key_row(fig, grid[1, :], handles, caption, ncol=len(handles))


def _recall_over_pairs(ax, g, df, pairs, palette, letter: str) -> list[str]:
    """Recall accuracy against the key-value pairs in context, one line per num_kv_heads, the
    h_kv at one pair count side by side; returns the panel's caption lines."""
    caption = []
    s = summarize(g, ["num_kv_heads", "num_pairs"], ["val_accuracy"])
    heads = sorted(s.num_kv_heads.unique())
    for k, shift in zip(heads, shifts(len(heads), 4.0), strict=True):
        sk = s[s.num_kv_heads == k].sort_values("num_pairs")
        _bars(
            ax,
            sk.num_pairs,
            sk,
            "val_accuracy",
            palette[int(k)],
            f"h_kv={int(k)}",
            bounds=(0.0, 1.0),
            shift=shift,
        )
        gk = g[g.num_kv_heads == k]
        _seeds(ax, gk.num_pairs, gk.val_accuracy, palette[int(k)], shift=shift)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(pairs), [f"{p:g}" for p in sorted(pairs)])
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.margins(x=0.08)
    ax.set_xlabel("key-value pairs in context")
    ax.set_ylabel("recall accuracy")
    ax.set_title(
        f"{letter} recall accuracy vs key-value pairs in context\n{model_title(g, sep=chr(10))}",
        fontsize=7.5,
    )
    caption.append(
        f"{letter} {int(g.tokens.iloc[0]):,} training tokens per model; bars clipped to "
        "[0, 1]; the h_kv at one pair count drawn side by side"
    )
    missing = sorted(set(df.num_kv_heads) - set(heads))
    if missing:
        ran = "/".join(str(int(k)) for k in sorted(heads, reverse=True))
        caption.append(
            f"{letter} recall ran h_kv {ran} only (no "
            f"h_kv={', '.join(str(int(k)) for k in missing)})"
        )
    return caption


def _against_kv_bytes(ax, g, df, task: str, palette, letter: str) -> list[str]:
    """The metric minus the same seed's MHA model's against KV bytes per token, one point per
    num_kv_heads and a grey line through the means; returns the panel's caption lines."""
    metric = "val_loss" if task == "stdlib" else "val_accuracy"
    d, mha = _minus_mha(g, metric, ["task"])
    s = summarize(d, ["num_kv_heads", "kv_bytes_per_token"], ["delta"])
    ax.plot(s.kv_bytes_per_token / 2**10, s.delta, color="0.6", lw=0.8, zorder=1)
    for _, r in s.iterrows():
        _bars(
            ax,
            [r.kv_bytes_per_token / 2**10],
            r.to_frame().T,
            "delta",
            palette[int(r.num_kv_heads)],
            f"h_kv={int(r.num_kv_heads)}",
        )
    _seeds(ax, d.kv_bytes_per_token / 2**10, d.delta, [palette[int(k)] for k in d.num_kv_heads])
    ax.axhline(0.0, color="0.5", lw=0.6)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("KV cache per token (KiB)")
    unit = "nats/byte" if task == "stdlib" else "accuracy"
    ax.set_ylabel(f"{'loss' if task == 'stdlib' else 'accuracy'} - MHA's ({unit})")
    what = "validation loss" if task == "stdlib" else "recall accuracy"
    ax.set_title(
        f"{letter} {what} minus MHA's ({mha:.4f}) vs KV per token\n{model_title(g, sep=chr(10))}",
        fontsize=7.5,
    )
    return [
        f"{letter} {int(g.tokens.iloc[0]):,} training tokens per model; paired: each seed minus "
        f"the same seed's MHA model (h_kv={int(df.num_kv_heads.max())}); grey line joins the means"
    ]


# f32 right, int2 left of where they land, 11% (a marker's width): their bytes coincide with
# fp8's of another h_kv
PARETO_SHIFT = {"f32": 2**0.15, "bf16": 2**0.15, "int2": 2**-0.15}
HOLLOW = ("int4", "int2")


def kv_pareto(records: pd.DataFrame, fig) -> None:
    """The seed's trade-off in one picture: stdlib validation loss, minus the MHA model's with
    its own cache for the same seed, against KV bytes per token (scales included) over
    num_kv_heads x the cache's dtype (the model's own, int8, fp8, int4, int2). A line per
    num_kv_heads joins one model read through each cache."""
    df = gqa_sweep(records[(records.experiment == "hkv_quality") & (records.task == "stdlib")])
    fig.set_size_inches(fig.get_figwidth(), 4.9)
    grid = fig.add_gridspec(2, 1, height_ratios=[1.0, 0.75])
    ax = fig.add_subplot(grid[0])
    palette = kv_palette(df.num_kv_heads)
    d, mha = _minus_mha(df, "val_loss", ["task"])
    s = summarize(d, ["eval_kv_dtype", "num_kv_heads", "kv_bytes_per_token"], ["delta"])
    s = s.assign(x=s.kv_bytes_per_token * s.eval_kv_dtype.map(PARETO_SHIFT).fillna(1.0))
    for k, sk in s.groupby("num_kv_heads"):
        sk = sk.sort_values("x")
        ax.plot(sk.x, sk.delta, color=palette[int(k)], lw=0.8, alpha=0.7, zorder=1)
        ax.plot([], [], color=palette[int(k)], lw=2.5, label=f"h_kv={int(k)}")
    dtypes = list(dict.fromkeys(df.eval_kv_dtype))
    for dtype in dtypes:
        marker, hollow = DTYPE_MARKERS.get(dtype, "D"), dtype in HOLLOW
        for _, r in s[s.eval_kv_dtype == dtype].iterrows():
            ci = r.get("delta_ci", 0.0)
            color = palette[int(r.num_kv_heads)]
            ax.errorbar(
                r.x,
                r.delta,
                yerr=0.0 if pd.isna(ci) else ci,
                color=color,
                marker=marker,
                ms=4.5 if hollow else 4,
                mfc="white" if hollow else color,
                mew=1.0,
                capsize=2,
                lw=0.8,
                ls="none",
                zorder=2,
            )
        ax.plot(
            [],
            [],
            color="0.3",
            marker=marker,
            ls="none",
            mfc="white" if hollow else "0.3",
            label=f"{dtype} cache",
        )
    ax.axhline(0.0, color="0.5", lw=0.6)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("KV cache per token (bytes, scales included)")
    ax.set_ylabel("stdlib loss - MHA's (nats/byte)")
    ax.set_title(
        f"validation loss minus MHA's (f32, {mha:.4f}) vs KV bytes\n"
        f"{model_title(df)}, paired by seed",
        fontsize=7.5,
    )
    handles = _handles([ax])
    order = [f"{t} cache" for t in dtypes] + [f"h_kv={k}" for k in sorted(palette)]
    caption = [
        "colour: the model (h_kv); a line joins one model",
        "read back through each cache; marker: the cache",
        "bars: 95% Student-t intervals over seeds;",
        "f32 drawn 11% right, int2 11% left (bytes coincide)",
    ]
    key_row(fig, grid[1], {k: handles[k] for k in order}, caption, ncol=2)
