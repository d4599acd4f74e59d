"""The KV cache against context S, the seed's table drawn as curves: per attention variant beside
its weights, the sliding-window presets as published against every layer global, and the hybrids'
KV + flat states against the same attention in every layer. Sizes in GiB (binary)."""

from __future__ import annotations

import pandas as pd

from kvjax.plotting.style import GIB, key_below, kv_palette, variant_color


def kv_vs_context(records: pd.DataFrame, fig) -> None:
    """KV cache vs context per variant, with each variant's weights as a dashed line; beside it
    (records with `window`) the sliding-window presets as published against all-global."""
    df = records[records.experiment == "kv_vs_context"]
    windows = df[df["window"].notna()] if "window" in df else df.iloc[:0]
    hybrids = df[df["state_bytes"].notna()] if "state_bytes" in df else df.iloc[:0]
    panels = 1 + bool(len(windows)) + bool(len(hybrids))
    fig.set_size_inches(fig.get_figwidth() * (1.4 if panels == 3 else 1), 3.2)
    axes = list(fig.subplots(1, panels, squeeze=False)[0])
    _kv_variants(df.drop(windows.index).drop(hybrids.index), axes.pop(0))
    if len(windows):
        _kv_windows(windows, axes.pop(0))
    if len(hybrids):
        _kv_hybrids(hybrids, axes.pop(0))


def _kv_hybrids(df: pd.DataFrame, ax) -> None:
    """Each hybrid's whole cache (KV + flat states: flat until the attention layers' KV takes
    over) against the same attention in every layer (dotted), beside their weights."""
    _published_against_all(
        df,
        ax,
        lambda h: h.state_bytes.iloc[0] > 0,
        lambda model, h: model,
        first_color=3,
        marker="s",
        dotted="same attention in every layer",
        ylabel="KV + state cache (GiB, binary)",
        title=f"hybrids, B={int(df.batch.iloc[0])}: KV + flat states",
        ncol=1,
    )


def _kv_windows(df: pd.DataFrame, ax) -> None:
    def label(model, h):
        return f"{model} ({h.layer_pattern.iloc[0]}, W={int(h.window.iloc[0])})"

    _published_against_all(
        df,
        ax,
        lambda h: h.window.iloc[0] > 0,
        label,
        first_color=0,
        marker="o",
        dotted="same, every layer global",
        ylabel="KV cache (GiB, binary)",
        title=f"sliding windows, B={int(df.batch.iloc[0])}: the KV cache they hold",
        ncol=2,
    )


def _published_against_all(
    df: pd.DataFrame,
    ax,
    published,
    label,
    *,
    first_color: int,
    marker: str,
    dotted: str,
    ylabel: str,
    title: str,
    ncol: int,
) -> None:
    """Each model's cache over S as published (solid, marked, labelled) and its variant with
    every layer attending everything (dotted, one legend entry for all)."""
    for i, (model, g) in enumerate(df.groupby("model", sort=False)):
        color = f"C{i + first_color}"
        for _, h in g.groupby("variant", sort=False):
            h = h.sort_values("context")
            shown = published(h)
            ax.plot(
                h.context,
                h.kv_cache_bytes / GIB,
                color=color,
                ls="-" if shown else ":",
                marker=marker if shown else None,
                ms=2.5,
                label=label(model, h) if shown else None,
            )
    ax.plot([], [], color="0.4", ls=":", label=dotted)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context S (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=8)
    key_below(ax, -0.2, fontsize=6, ncol=ncol)


def _kv_variants(df: pd.DataFrame, ax) -> None:
    model = df.model.iloc[0]
    df = df[df.model == model]
    palette = kv_palette(df[~df.variant.str.startswith("MLA")].num_kv_heads)
    for (variant, k), g in df.groupby(["variant", "num_kv_heads"], sort=False):
        g = g.sort_values("context")
        color = variant_color(variant, k, palette)
        mla = str(variant).startswith("MLA")
        ax.plot(
            g.context,
            g.kv_cache_bytes / GIB,
            marker="D" if mla else "o",
            ms=3,
            color=color,
            label=variant if mla else f"{variant} (h_kv={int(k)})",
        )
        ax.axhline(g.weight_bytes.iloc[0] / GIB, color=color, ls="--", lw=0.8)
    # the variants' weights lie within a few percent: one band, named once above it
    weights = df.groupby("variant", sort=False).weight_bytes.first() / GIB
    ax.annotate(
        f"weights (dashed): {weights.min():.0f}-{weights.max():.0f} GiB",
        (0.02, weights.max()),
        xycoords=("axes fraction", "data"),
        xytext=(0, 3),
        textcoords="offset points",
        fontsize=5.5,
        color="0.25",
        va="bottom",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context S (tokens)")
    ax.set_ylabel("KV cache (GiB, binary)")
    batch = int(df.batch.iloc[0])
    ax.set_title(f"{model}, B={batch}: KV cache vs the weights, per attention", fontsize=8)
    key_below(ax, -0.2, fontsize=6, ncol=2)
