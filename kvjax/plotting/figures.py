"""The paper figures, each a function of a records DataFrame."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib import ticker  # noqa: E402

from kvjax.plotting import quality  # noqa: E402
from kvjax.plotting.compiled import roofline_compiled  # noqa: E402
from kvjax.plotting.goodput import goodput  # noqa: E402
from kvjax.plotting.measured import kernel_bound, mark_flags  # noqa: E402
from kvjax.plotting.mla_quality import mla_quality  # noqa: E402
from kvjax.plotting.published import (  # noqa: E402
    published_residuals,
    published_roofline,
    published_systems,
)
from kvjax.plotting.roofline import roofline  # noqa: E402
from kvjax.plotting.serving import mark_unheld, serving_frontier  # noqa: E402
from kvjax.plotting.style import (  # noqa: E402
    MLA_COLOR,
    device_name,
    host_cpu,
    kv_palette,
    log_ticks,
    variant_color,
)
from kvjax.plotting.uptrain import gqa_uptrain, mla_uptrain  # noqa: E402

COLUMN_WIDTH_IN = 3.5  # one column of a two-column paper
GIB = 2**30
# Fixed metadata: no dates or versions in the files, so reruns are byte-identical.
PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}


def theme() -> None:
    sns.set_theme(context="paper", style="whitegrid", font_scale=0.9)
    plt.rcParams.update({"svg.hashsalt": "kvjax", "pdf.fonttype": 42})


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
    ax.legend(fontsize=6, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol)


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
    ax.legend(fontsize=6, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)


def _decode_lines(g: pd.DataFrame):
    """(label, style, rows) per line of a decode_latency panel: the dense model per num_kv_heads
    (the seed's palette), each MoE model in its own colour with square markers."""
    moe = g["moe"].fillna(False).astype(bool) if "moe" in g else pd.Series(False, index=g.index)
    palette = kv_palette(g[~moe].num_kv_heads) if (~moe).any() else {}
    kernel = g["attention_kernel"].fillna("xla") if "attention_kernel" in g else "xla"
    g = g.assign(attention_kernel=kernel)
    both = g.attention_kernel.nunique() > 1  # fused lines beside the unfused: say which is which
    for (_, k, fused, source), gk in g[~moe].groupby(
        ["model", "num_kv_heads", "attention_kernel", "source"]
    ):
        flash = fused == "flash"
        label = f"h_kv={int(k)}" + ((", fused attn" if flash else ", unfused attn") if both else "")
        style = {"color": palette[int(k)], "marker": "*" if flash else "o"}
        yield label, style | ({"alpha": 0.6} if flash else {}), source, gk
    for i, ((model, fused, source), gk) in enumerate(
        g[moe].groupby(["model", "attention_kernel", "source"], sort=False)
    ):
        label = f"{model} (MoE)" + (
            f", {'fused' if fused == 'flash' else 'unfused'} attn" if both else ""
        )
        yield label, {"color": MOE_COLORS[i % 2], "marker": "s"}, source, gk


MOE_COLORS = ("#8c564b", "#e377c2")


def _one_line(lines: list, column: str, within: float = 0.03) -> list:
    """Lines of one colour and source whose values agree within `within` (h_kv=64's fused and
    unfused attention) keyed once, with the largest gap: a line hidden under its twin is not
    listed as two. Both are still drawn; the twin gets no key entry (label None)."""
    out = []
    for label, style, source, g in lines:
        g = g.sort_values("batch")
        for i, (label0, style0, source0, g0) in enumerate(out):
            if (str(style0["color"]), source0, tuple(g0.batch)) != (
                str(style["color"]),
                source,
                tuple(g.batch),
            ) or label0 is None:
                continue
            gap = (g[column].to_numpy() / g0[column].to_numpy() - 1).__abs__().max()
            if gap <= within:
                base = label0.replace(", fused attn", "").replace(", unfused attn", "")
                out[i] = (f"{base}, fused = unfused attn (within {gap:.1%})", style0, source0, g0)
                label = None
                break
        out.append((label, style, source, g))
    return out


def decode_latency(records: pd.DataFrame, fig) -> None:
    """Minimum ms/token against batch, one line per num_kv_heads (and per MoE model), per chip;
    each panel's key below it, off the lines."""
    df = records[records.experiment == "decode_latency"]
    panels = list(dict.fromkeys(df.chip))
    fig.set_size_inches(fig.get_figwidth(), 3.5)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, chip in zip(axes, panels, strict=True):
        g = df[df.chip == chip]
        has_measured = (g.source == "measured").any()
        for label, style, source, gk in _one_line(list(_decode_lines(g)), "step_floor_s"):
            bound = source == "closed form" and has_measured
            suffix = (" bound" if source == "closed form" else " measured") if has_measured else ""
            ax.plot(
                gk.batch,
                gk.step_floor_s * 1e3,
                ms=3,
                ls="--" if bound else "-",
                mfc="none" if bound else style["color"],
                label=None if label is None else label + suffix,
                **style,
            )
            if source == "measured" and "flagged" in gk:
                mark_flags(ax, gk.batch, gk.step_floor_s * 1e3, gk["flagged"])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        log_ticks(ax.yaxis)
        ax.set_xlabel("batch B")
        ax.set_ylabel("ms per decode step (= per token)")
        ctx = int(g.context.iloc[0])
        where = (
            f"measured on {device_name(chip, host_cpu(g))}, S={ctx} (dashed: bound)"
            if has_measured
            else f"closed form on {chip}, S={ctx}"
        )
        ax.set_title(f"{where}\n{', '.join(dict.fromkeys(g.model))}", fontsize=7)
        mark_unheld(ax, g[g.source == "closed form"], chip)
        ax.legend(
            fontsize=5.5,
            frameon=False,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.2),
            ncol=2,
            columnspacing=1.0,
        )


def decode_intensity(records: pd.DataFrame, fig) -> None:
    """Decode intensity against batch per num_kv_heads, the MoE models beside, with the seed's
    I = B: a dense model's weights are read once whatever B, an MoE model's grow with the experts
    its batch touches. The key below the axes, off the lines."""
    df = records[(records.experiment == "decode_latency") & (records.source == "closed form")]
    fig.set_size_inches(fig.get_figwidth(), 3.6)
    ax = fig.subplots()
    first = df[df.chip == df.chip.iloc[0]]
    for label, style, _, g in _one_line(list(_decode_lines(first)), "decode_intensity"):
        ax.plot(g.batch, g.decode_intensity, ms=3, label=label, **style)
    b = sorted(first.batch.unique())
    ax.plot(b, b, color="0.3", ls="--", lw=0.8, label="I = B (seed)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch B")
    ax.set_ylabel("decode intensity (FLOP/byte)")
    ctx = int(first.context.iloc[0])
    ax.set_title(
        f"decode intensity vs batch, closed form (any chip), S={ctx}\n"
        f"{', '.join(dict.fromkeys(first.model))}",
        fontsize=7,
    )
    ax.legend(
        fontsize=5.5,
        frameon=False,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.22),
        ncol=2,
        columnspacing=1.0,
    )


def hkv_ablation(records: pd.DataFrame, fig) -> None:
    """Decode step time over KV-cache bytes per token: GQA sweeping num_kv_heads and MLA sweeping
    kv_lora_rank on one axis, predicted (closed-form bound on the measured ceilings) against
    measured, each point labelled with its h_kv or latent width."""
    df = records[records.experiment == "hkv_ablation"].copy()
    if "attention_kind" not in df:
        df["attention_kind"] = "GQA"
    df["family"] = df.attention_kind.fillna("GQA").map(lambda a: "MLA" if a == "MLA" else "GQA")
    fig.set_size_inches(fig.get_figwidth(), 3.7)
    ax = fig.subplots()
    colors = {"GQA": "#4c72b0", "MLA": MLA_COLOR}
    for family, g in df.groupby("family", sort=True):
        g = g.sort_values("kv_bytes_per_token")
        x = g.kv_bytes_per_token / 2**10
        what = "h_kv" if family == "GQA" else "latent A"
        c = colors[family]
        ax.plot(
            x,
            g.predicted_s * 1e3,
            marker="o",
            ms=3,
            mfc="none",
            color=c,
            ls="--",
            lw=0.8,
            label=f"{family} over {what}: predicted (bound)",
        )
        if "measured_s" in g and g.measured_s.notna().any():
            ax.plot(
                x,
                g.measured_s * 1e3,
                marker="o",
                ms=3,
                color=c,
                label=f"{family}: measured (median, interleaved)",
            )
            if "flagged" in g:
                mark_flags(ax, x, g.measured_s * 1e3, g["flagged"])
        # the tags in a strip of their own above the time axis's empty foot, one row per family,
        # each under its point: noisy measured lines that cross never carry a tag into a line
        row = 0.03 if family == "MLA" else 0.1
        for xi, (_, r) in zip(x, g.iterrows(), strict=True):
            tag = f"A={int(r.kv_lora_rank)}" if family == "MLA" else f"h_kv={int(r.num_kv_heads)}"
            ax.text(
                xi,
                row,
                tag,
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=5,
                color=c,
            )
    ax.set_xscale("log", base=2)
    ax.margins(x=0.1)  # room for the outermost tags inside the frame
    ax.set_ylim(0, ax.get_ylim()[1])  # a time axis from zero: the gap is read as a ratio
    low = ax.get_ylim()[1] * 0.18
    if min(df.predicted_s.min(), df.get("measured_s", df.predicted_s).min()) * 1e3 < low:
        ax.set_ylim(0, ax.get_ylim()[1] * 1.25)  # keep the strip clear of the data
    ax.set_xlabel("KV cache per token (KiB, binary)")
    ax.set_ylabel("decode step (ms)")
    r = df.iloc[0]
    models = " vs ".join(dict.fromkeys(df.model))
    where = device_name(r.device, host_cpu(df))
    ax.set_title(
        "decode step vs KV cache per token\n"
        f"{models}, B={int(r.batch)}, S={int(r.context)}\n"
        f"measured on {where}",
        fontsize=6.5,
    )
    ax.legend(
        fontsize=5.5,
        frameon=False,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.22),
        ncol=1,
        title="tags above the axis: each point's h_kv (GQA) or latent A (MLA)",
        title_fontsize=5.5,
    )


def tensor_parallel(records: pd.DataFrame, fig) -> None:
    """Per-device KV cache and decode floor against tp, one line per num_kv_heads (closed form);
    hollow markers: the bytes the sharded model's own shardings put on a device. Each h_kv has
    its own marker shape and size, so lines that coincide (h_kv=1 and 8 from tp=8) both show."""
    df = records[records.experiment == "tensor_parallel"].sort_values("tp")
    r0 = df.iloc[0]
    fig.set_size_inches(fig.get_figwidth(), 3.0)
    ax_kv, ax_t = fig.subplots(1, 2)
    palette = kv_palette(df.num_kv_heads)
    marks = [("o", 14), ("s", 30), ("D", 20), ("^", 26)]
    shapes = {k: marks[i % len(marks)] for i, k in enumerate(sorted(palette))}
    for k, g in df.groupby("num_kv_heads"):
        color, (marker, size) = palette[int(k)], shapes[int(k)]
        ax_kv.plot(
            g.tp, g.kv_cache_bytes_per_device / GIB, color=color, lw=1, label=f"h_kv={int(k)}"
        )
        ax_kv.scatter(
            g.tp,
            g.sharded_kv_cache_bytes_per_device / GIB,
            s=size,
            marker=marker,
            facecolors="none",
            edgecolors=color,
            linewidths=0.8,
            zorder=3,
        )
        ax_t.plot(
            g.tp,
            g.step_floor_s * 1e3,
            color=color,
            lw=1,
            marker=marker,
            ms=size**0.5,
            mfc="none",
            mew=0.8,
            label=f"h_kv={int(k)}",
        )
        # tp = h_kv: one KV head per device; beyond it devices hold copies, no saving
        if g.tp.min() < k <= g.tp.max():
            ax_kv.axvline(k, color=color, ls=":", lw=0.7)
    for ax in (ax_kv, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.set_xlabel("tensor-parallel devices tp")
        low, high = ax.get_ylim()  # from a power of two below the lowest line: it has a label
        ax.set_ylim(2.0 ** math.floor(math.log2(low)), high)
    ax_kv.set_ylabel("KV cache per device (GiB, binary)")
    ax_kv.set_title(
        f"KV cache per device, closed form: {r0.model},\n"
        f"B={int(r0.batch)}, S={int(r0.context):,} (any chip)",
        fontsize=6.5,
    )
    ax_kv.scatter([], [], s=18, facecolors="none", edgecolors="0.3", label="sharded arrays")
    ax_kv.plot([], [], color="0.4", ls=":", lw=0.7, label="tp = h_kv (beyond: copies)")
    ax_kv.legend(fontsize=5.5, frameon=True)
    ax_t.set_ylabel("decode floor per token (ms)")
    link = r0.interconnect_bytes_per_s / 1e9
    title = f"decode floor on {r0.chip}: HBM + link bytes / {link:g} GB/s"
    if r0.get("link_latency_s", 0):
        title += f" + messages x {r0.link_latency_s * 1e6:g} us"
    if "traced_flops_per_device" in df and df.traced_flops_per_device.notna().any():
        t = df[df.traced_flops_per_device.notna()]
        flops = (t.traced_flops_per_device / t.traced_closed_flops_per_device - 1).abs().max()
        coll = (t.traced_collective_bytes / t.traced_closed_collective_bytes - 1).abs().max()
        title += (
            f"\ncompiled tp<={int(t.tp.max())} ({t.traced_dtype.iloc[0]}) vs closed form:\n"
            f"FLOPs {flops:.1%}, collectives {coll:.1%} apart"
        )
    ax_t.set_title(title, fontsize=6)
    ax_t.legend(fontsize=5.5, frameon=True)


FIGURES: dict[str, tuple[str, Callable, tuple[float, float]]] = {
    "roofline": ("roofline", roofline, (2 * COLUMN_WIDTH_IN, 2.8)),
    "roofline_compiled": ("roofline", roofline_compiled, (2 * COLUMN_WIDTH_IN, 5.0)),
    "kv_vs_context": ("kv_vs_context", kv_vs_context, (2 * COLUMN_WIDTH_IN, 2.6)),
    "decode_latency": ("decode_latency", decode_latency, (2 * COLUMN_WIDTH_IN, 2.6)),
    "decode_intensity": ("decode_latency", decode_intensity, (COLUMN_WIDTH_IN, 2.6)),
    "hkv_ablation": ("hkv_ablation", hkv_ablation, (COLUMN_WIDTH_IN, 2.6)),
    "hkv_quality": ("hkv_quality", quality.hkv_quality, (2 * COLUMN_WIDTH_IN, 2.6)),
    "kv_pareto": ("hkv_quality", quality.kv_pareto, (COLUMN_WIDTH_IN, 2.8)),
    "mla_quality": ("hkv_quality", mla_quality, (2 * COLUMN_WIDTH_IN, 2.6)),
    "gqa_uptrain": ("gqa_uptrain", gqa_uptrain, (3 * COLUMN_WIDTH_IN, 2.4)),
    "mla_uptrain": ("gqa_uptrain", mla_uptrain, (3 * COLUMN_WIDTH_IN, 2.4)),
    "tensor_parallel": ("tensor_parallel", tensor_parallel, (2 * COLUMN_WIDTH_IN, 2.8)),
    "kernel_bound": ("profile", kernel_bound, (2 * COLUMN_WIDTH_IN, 2.8)),
    "serving_frontier": ("serving_frontier", serving_frontier, (2 * COLUMN_WIDTH_IN, 4.4)),
    "goodput": ("serving_goodput", goodput, (2 * COLUMN_WIDTH_IN, 3.2)),
    "published_roofline": ("published_roofline", published_roofline, (4 * COLUMN_WIDTH_IN, 3.2)),
    "published_residuals": (
        "published_roofline",
        published_residuals,
        (4.6 * COLUMN_WIDTH_IN, 4.2),
    ),
    "published_systems": ("published_roofline", published_systems, (3 * COLUMN_WIDTH_IN, 2.8)),
}


def make_figures(records: pd.DataFrame, out: str | Path) -> list[Path]:
    """Every figure whose records exist, as PNG and PDF in `out`."""
    theme()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (experiment, draw, size) in FIGURES.items():
        if records.empty or experiment not in set(records.experiment):
            continue
        fig = plt.figure(figsize=size, dpi=200)
        if draw(records, fig) is False:  # its experiment ran, but not the records it draws
            plt.close(fig)
            continue
        fig.tight_layout()
        for ext, meta in (("png", PNG_METADATA), ("pdf", PDF_METADATA)):
            path = out / f"{name}.{ext}"
            fig.savefig(path, metadata=meta)
            written.append(path)
        plt.close(fig)
    return written
