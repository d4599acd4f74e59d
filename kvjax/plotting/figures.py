"""The paper figures, each a function of a records DataFrame."""

from __future__ import annotations

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
from kvjax.plotting.measured import _label_measured, kernel_bound, mark_flags  # noqa: E402
from kvjax.plotting.serving import serving_frontier  # noqa: E402
from kvjax.plotting.style import MLA_COLOR, kv_palette, variant_color  # noqa: E402

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
    axes = fig.subplots(1, 2 if len(windows) else 1, squeeze=False)[0]
    _kv_variants(df.drop(windows.index), axes[0])
    if len(windows):
        _kv_windows(windows, axes[1])


def _kv_windows(df: pd.DataFrame, ax) -> None:
    for i, (model, g) in enumerate(df.groupby("model", sort=False)):
        color = f"C{i}"
        for _, h in g.groupby("variant", sort=False):
            h = h.sort_values("context")
            published = h.window.iloc[0] > 0
            label = f"{model} ({h.layer_pattern.iloc[0]}, W={int(h.window.iloc[0])})"
            ax.plot(h.context, h.kv_cache_bytes / GIB, color=color, ls="-" if published else ":",
                    marker="o" if published else None, ms=2.5,
                    label=label if published else None)  # fmt: skip
    ax.plot([], [], color="0.4", ls=":", label="same, every layer global")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context S (tokens)")
    ax.set_title(f"sliding windows, B={int(df.batch.iloc[0])}: the cache they hold", fontsize=8)
    ax.legend(fontsize=6, frameon=True)


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
            label=variant if mla else f"{variant} (h_kv={k})",
        )
        ax.axhline(g.weight_bytes.iloc[0] / GIB, color=color, ls="--", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context S (tokens)")
    ax.set_ylabel("KV cache (GiB, binary)")
    batch = int(df.batch.iloc[0])
    ax.set_title(f"{model}, B={batch}: KV cache vs weights (dashed)", fontsize=8)
    ax.plot([], [], color="0.4", ls="--", lw=0.8, label="weights (same colour)")
    ax.legend(fontsize=6, frameon=True)


ATTENTION_COLORS = {"prefill": "#8c1c13", "decode": "#dd8452"}  # the attention both ways


def _panel_roofline(ax, df, chip) -> None:
    peak, bw = df.peak_flops_per_s.iloc[0], df.bandwidth_bytes_per_s.iloc[0]
    ridge = peak / bw
    xs = [min(1e-2, df.intensity.min() / 2), ridge, max(1e5, df.intensity.max() * 2)]
    ax.plot(xs, [min(peak, x * bw) for x in xs], color="0.2", lw=1)
    ax.axvline(ridge, color="0.5", ls=":", lw=0.8)
    ax.text(ridge * 1.15, peak * 0.35, f"ridge {ridge:.3g}", fontsize=6, color="0.3")
    markers = {"prefill": "s", "decode": "o"}
    colors = {"prefill": "#c44e52", "decode": "#4c72b0"}
    for (phase, source), g in df.groupby(["phase", "source"]):
        y = (
            g.achieved_flops_per_s
            if source == "measured"
            else [min(peak, i * bw) for i in g.intensity]
        )
        style = dict(marker=markers.get(phase, "o"), s=14, linewidths=0.8)
        if source in ("closed form, fused", "closed form, unfused"):
            fused = source.endswith(" fused")
            form = "fused" if fused else "unfused (sum)"
            # the intensities in the legend, not beside the points: nothing to overlap
            values = ", ".join(f"{x:.3g}" for x in g.intensity)
            ax.scatter(g.intensity, y, marker="*" if fused else "D", s=40 if fused else 16,
                       color=ATTENTION_COLORS[phase], edgecolors="0.2", linewidths=0.4, zorder=3,
                       label=f"{phase} attention, {form}: I={values}")  # fmt: skip
        elif source == "closed form":
            ax.scatter(
                g.intensity,
                y,
                facecolors="none",
                edgecolors=colors[phase],
                **style,
                label=f"{phase}, closed form",
            )
        elif source == "traced":
            ax.scatter(
                g.intensity,
                y,
                color=colors[phase],
                marker="x",
                s=10,
                linewidths=0.6,
                label=f"{phase}, traced (XLA)",
            )
        else:
            ax.scatter(g.intensity, y, color=colors[phase], **style, label=f"{phase}, measured")
    measured = df[df.source == "measured"]
    caption = None
    if len(measured):  # labelled once for both phases: one column of labels, no overlaps
        caption = _label_measured(ax, measured, peak, bw)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("FLOP/s (attainable or achieved)")
    if len(measured):
        ax.set_title(f"{df.model.iloc[0]}: timed in situ on {_device(chip)}", fontsize=7)
    else:
        ax.set_title(f"{df.model.iloc[0]} on {chip}: closed form, traced", fontsize=7)
    # below the axes, never on the data; the measured panel's unlabelled kernels as its title
    ax.legend(fontsize=4.5, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2),
              ncol=2, title=caption, title_fontsize=4.2, columnspacing=1.0)  # fmt: skip


def roofline(records: pd.DataFrame, fig) -> bool | None:
    """Every kernel on the roofline: hollow = closed form, x = traced, filled = measured."""
    df = records[records.experiment == "roofline"]
    if "target" in df:  # runs compiled for an accelerator: their own figure
        df = df[df.target.isna()]
    panels = list(dict.fromkeys(zip(df.model, df.chip, strict=True)))
    if not panels:
        return False
    fig.set_size_inches(max(2, len(panels)) * COLUMN_WIDTH_IN, 3.6)  # a column per panel
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (model, chip) in zip(axes, panels, strict=True):
        _panel_roofline(ax, df[(df.model == model) & (df.chip == chip)], chip)


def _device(name: str) -> str:
    """A measured chip's name as a title says it: `measured cpu:cpu` is this CPU."""
    name = str(name).removeprefix("measured ")
    return "this CPU" if name.startswith("cpu") else name


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
        label = f"h_kv={k}" + ((", fused attn" if flash else ", unfused attn") if both else "")
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


def decode_latency(records: pd.DataFrame, fig) -> None:
    """Minimum ms/token against batch, one line per num_kv_heads (and per MoE model), per chip."""
    df = records[records.experiment == "decode_latency"]
    panels = list(dict.fromkeys(df.chip))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, chip in zip(axes, panels, strict=True):
        g = df[df.chip == chip]
        has_measured = (g.source == "measured").any()
        for label, style, source, gk in _decode_lines(g):
            gk = gk.sort_values("batch")
            bound = source == "closed form" and has_measured
            suffix = (" bound" if source == "closed form" else " measured") if has_measured else ""
            ax.plot(gk.batch, gk.step_floor_s * 1e3, ms=3, ls="--" if bound else "-",
                    mfc="none" if bound else style["color"], label=label + suffix,
                    **style)  # fmt: skip
            if source == "measured" and "flagged" in gk:
                mark_flags(ax, gk.batch, gk.step_floor_s * 1e3, gk["flagged"])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel("batch B")
        ax.set_ylabel("ms per decode step (= per token)")
        ctx = int(g.context.iloc[0])
        where = (f"measured on {_device(chip)} (dashed: bound)" if has_measured
                 else f"closed form, {chip}")  # fmt: skip
        ax.set_title(f"{where}, S={ctx}\n{', '.join(dict.fromkeys(g.model))}", fontsize=7)
        ax.legend(fontsize=5, frameon=True)


def decode_intensity(records: pd.DataFrame, fig) -> None:
    """Decode intensity against batch per num_kv_heads, the MoE models beside, with the seed's
    I = B: a dense model's weights are read once whatever B, an MoE model's grow with the experts
    its batch touches."""
    df = records[(records.experiment == "decode_latency") & (records.source == "closed form")]
    ax = fig.subplots()
    first = df[df.chip == df.chip.iloc[0]]
    for label, style, _, g in _decode_lines(first):
        g = g.sort_values("batch")
        ax.plot(g.batch, g.decode_intensity, ms=3, label=label, **style)
    b = sorted(first.batch.unique())
    ax.plot(b, b, color="0.3", ls="--", lw=0.8, label="I = B (seed)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch B")
    ax.set_ylabel("decode intensity (FLOP/byte)")
    ax.set_title(f"decode intensity vs batch, S={int(first.context.iloc[0])}, closed form\n"
                 f"{', '.join(dict.fromkeys(first.model))}", fontsize=7)  # fmt: skip
    ax.legend(fontsize=5, frameon=True)


def hkv_ablation(records: pd.DataFrame, fig) -> None:
    """Decode step time over KV-cache bytes per token: GQA sweeping num_kv_heads and MLA sweeping
    kv_lora_rank on one axis, predicted (closed-form bound on the measured ceilings) against
    measured, each point labelled with its h_kv or latent width."""
    df = records[records.experiment == "hkv_ablation"].copy()
    if "attention_kind" not in df:
        df["attention_kind"] = "GQA"
    df["family"] = df.attention_kind.fillna("GQA").map(lambda a: "MLA" if a == "MLA" else "GQA")
    ax = fig.subplots()
    colors = {"GQA": "#4c72b0", "MLA": MLA_COLOR}
    for family, g in df.groupby("family", sort=True):
        g = g.sort_values("kv_bytes_per_token")
        x = g.kv_bytes_per_token / 2**10
        what = "h_kv" if family == "GQA" else "latent A"
        c = colors[family]
        ax.plot(x, g.predicted_s * 1e3, marker="o", ms=3, mfc="none", color=c, ls="--", lw=0.8,
                label=f"{family} over {what}: predicted (bound)")  # fmt: skip
        if "measured_s" in g and g.measured_s.notna().any():
            ax.plot(x, g.measured_s * 1e3, marker="o", ms=3, color=c,
                    label=f"{family}: measured (median, interleaved)")  # fmt: skip
            if "flagged" in g:
                mark_flags(ax, x, g.measured_s * 1e3, g["flagged"])
        # MLA's tags above its upper line, GQA's below its lower one: the two never cross labels
        mla = family == "MLA"
        for xi, (_, r) in zip(x, g.iterrows(), strict=True):
            measured = "measured_s" in g and pd.notna(r.get("measured_s"))
            y = r.measured_s if mla and measured else r.predicted_s
            tag = f"A={int(r.kv_lora_rank)}" if mla else f"h_kv={int(r.num_kv_heads)}"
            ax.annotate(tag, (xi, y * 1e3), textcoords="offset points", ha="center",
                        xytext=(0, 4) if mla else (0, -8), fontsize=5, color=c)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)  # a time axis from zero: the gap is read as a ratio
    ax.set_xlabel("KV cache per token (KiB, binary)")
    ax.set_ylabel("decode step (ms)")
    r = df.iloc[0]
    models = " vs ".join(dict.fromkeys(df.model))
    ax.set_title(f"{models}\nB={int(r.batch)}, S={int(r.context)}, measured on {_device(r.device)}",
                 fontsize=7)  # fmt: skip
    ax.legend(fontsize=5, frameon=True)


def tensor_parallel(records: pd.DataFrame, fig) -> None:
    """Per-device KV cache and decode floor against tp, one line per num_kv_heads (closed form);
    hollow markers: the bytes the sharded model's own shardings put on a device."""
    df = records[records.experiment == "tensor_parallel"].sort_values("tp")
    r0 = df.iloc[0]
    ax_kv, ax_t = fig.subplots(1, 2)
    palette = kv_palette(df.num_kv_heads)
    for k, g in df.groupby("num_kv_heads"):
        color = palette[int(k)]
        ax_kv.plot(g.tp, g.kv_cache_bytes_per_device / GIB, color=color, lw=1, label=f"h_kv={k}")
        ax_kv.scatter(
            g.tp, g.sharded_kv_cache_bytes_per_device / GIB, s=18, facecolors="none",
            edgecolors=color, linewidths=0.8,
        )  # fmt: skip
        ax_t.plot(g.tp, g.step_floor_s * 1e3, color=color, lw=1, marker="o", ms=2.5,
                  label=f"h_kv={k}")  # fmt: skip
        # tp = h_kv: one KV head per device; beyond it devices hold copies, no saving
        if g.tp.min() < k <= g.tp.max():
            ax_kv.axvline(k, color=color, ls=":", lw=0.7)
    for ax in (ax_kv, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.set_xlabel("tensor-parallel devices tp")
    ax_kv.set_ylabel("KV cache per device (GiB, binary)")
    ax_kv.set_title(
        f"{r0.model}, B={int(r0.batch)}, S={int(r0.context):,} (dotted: tp = h_kv; beyond, copies)",
        fontsize=6.5,
    )
    ax_kv.scatter([], [], s=18, facecolors="none", edgecolors="0.3", label="sharded arrays")
    ax_kv.legend(fontsize=5.5, frameon=True)
    ax_t.set_ylabel("decode floor per token (ms)")
    title = f"{r0.chip}: HBM floor + link bytes / {r0.interconnect_bytes_per_s / 1e9:g} GB/s"
    if r0.get("link_latency_s", 0):
        title += f" + messages x {r0.link_latency_s * 1e6:g} us"
    if "traced_flops_per_device" in df and df.traced_flops_per_device.notna().any():
        t = df[df.traced_flops_per_device.notna()]
        flops = (t.traced_flops_per_device / t.traced_closed_flops_per_device - 1).abs().max()
        coll = (t.traced_collective_bytes / t.traced_closed_collective_bytes - 1).abs().max()
        title += (
            f"\ncompiled tp<={int(t.tp.max())} ({t.traced_dtype.iloc[0]}): FLOPs within "
            f"{flops:.1%}, collectives within {coll:.1%}"
        )
    ax_t.set_title(title, fontsize=6.5)
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
    "gqa_uptrain": ("gqa_uptrain", quality.gqa_uptrain, (3 * COLUMN_WIDTH_IN, 2.4)),
    "tensor_parallel": ("tensor_parallel", tensor_parallel, (2 * COLUMN_WIDTH_IN, 2.8)),
    "kernel_bound": ("profile", kernel_bound, (2 * COLUMN_WIDTH_IN, 2.8)),
    "serving_frontier": ("serving_frontier", serving_frontier, (2 * COLUMN_WIDTH_IN, 4.4)),
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
