"""`roofline`: every kernel on a chip's roofline, a panel per (model, chip): closed form and XLA
trace on an accelerator, and the kernels timed in situ on the host CPU against its own measured
roof. One key below the panels (the same markers in every panel), the attention intensities and
the unlabelled kernels in the caption beneath it: nothing is written on the data."""

from __future__ import annotations

import math

import pandas as pd

from kvjax.plotting.measured import PHASE_COLORS, _matters, short_kernel
from kvjax.plotting.style import caption_below, device_name, host_cpu, red_rings

ATTENTION_COLORS = {"prefill": "#8c1c13", "decode": "#dd8452"}  # the attention both ways
MARKERS = {"prefill": "s", "decode": "o"}
KEY_FONT = 6.5
TOP_PRODUCTS = 3  # the longest-running products labelled per phase, beside the attention


def roofline(records: pd.DataFrame, fig) -> bool | None:
    """Every kernel on the roofline: hollow = closed form, x = traced, filled = measured."""
    df = records[records.experiment == "roofline"]
    if "target" in df:  # runs compiled for an accelerator: their own figure
        df = df[df.target.isna()]
    panels = list(dict.fromkeys(zip(df.model, df.chip, strict=True)))
    if not panels:
        return False
    fig.set_size_inches(max(2, len(panels)) * 3.5, 4.1)  # a column per panel, the key below
    grid = fig.add_gridspec(2, len(panels), height_ratios=[1.0, 0.36])
    axes = [fig.add_subplot(grid[0, i]) for i in range(len(panels))]
    captions, intensities, handles = [], [], {}
    for ax, (model, chip) in zip(axes, panels, strict=True):
        g = df[(df.model == model) & (df.chip == chip)]
        caption, attention = _panel(ax, g, chip)
        captions += [caption] if caption else []
        if attention:
            intensities.append(f"{model}: {attention}")
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    key = fig.add_subplot(grid[1, :])
    key.axis("off")
    order = sorted(
        handles,
        key=lambda s: (s.startswith("above"), " attention, " in s, not s.startswith("decode"), s),
    )
    key.legend(
        [handles[k] for k in order],
        order,
        loc="upper center",
        ncol=4,
        frameon=False,
        fontsize=KEY_FONT,
        columnspacing=1.5,
        handletextpad=0.4,
    )
    lines = []
    if intensities:
        lines.append("attention intensity I (fused / unfused sum): " + "; ".join(intensities))
    lines += captions
    caption_below(key, lines, KEY_FONT - 0.5)


def _panel(ax, df: pd.DataFrame, chip) -> tuple[str | None, str]:
    """One (model, chip): the roof, its points; returns the panel's caption (what is not
    labelled) and its attention intensities for the figure's caption."""
    peak, bw = df.peak_flops_per_s.iloc[0], df.bandwidth_bytes_per_s.iloc[0]
    draw_roof(ax, peak, bw, df.intensity, fontsize=6)
    attention: dict[str, dict[bool, str]] = {}
    for (phase, source), g in df.groupby(["phase", "source"]):
        _points(ax, g, phase, source, peak, bw, attention)
    measured = df[df.source == "measured"]
    caption = _label_measured(ax, measured, peak, bw) if len(measured) else None
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("FLOP/s (attainable or achieved)")
    if len(measured):
        where = device_name(chip, host_cpu(df))
        ax.set_title(
            f"{df.model.iloc[0]}: timed in situ on\n{where} (its measured roof)", fontsize=7
        )
    else:
        ax.set_title(f"{df.model.iloc[0]} on {chip}:\nclosed form and XLA trace", fontsize=7)
    text = "; ".join(
        f"{phase} {v.get(True, '-')} / {v.get(False, '-')}"
        for phase, v in sorted(attention.items())
    )
    return caption, text


def draw_roof(ax, peak: float, bw: float, intensity: pd.Series, fontsize: float) -> None:
    """The roof min(peak, I x bandwidth) across the points' intensities, and the ridge marked."""
    ridge = peak / bw
    xs = [min(1e-2, intensity.min() / 2), ridge, max(1e5, intensity.max() * 2)]
    ax.plot(xs, [min(peak, x * bw) for x in xs], color="0.2", lw=1)
    ax.axvline(ridge, color="0.5", ls=":", lw=0.8)
    # at the foot of the ridge line: under the roof's right end no kernel lands this low
    ax.text(
        ridge * 1.15,
        0.03,
        f"ridge {ridge:.3g}",
        fontsize=fontsize,
        color="0.3",
        transform=ax.get_xaxis_transform(),
    )


def _points(ax, g: pd.DataFrame, phase: str, source: str, peak, bw, attention: dict) -> None:
    """One phase's kernels from one source, in that source's marker; the attention both ways
    also noted in `attention` (phase -> fused -> intensities) for the caption."""
    roof = [min(peak, i * bw) for i in g.intensity]
    mark = MARKERS.get(phase, "o")
    colors = PHASE_COLORS
    if source in ("closed form, fused", "closed form, unfused"):
        fused = source.endswith(" fused")
        form = "fused" if fused else "unfused (sum)"
        attention.setdefault(phase, {})[fused] = ", ".join(f"{x:.3g}" for x in g.intensity)
        ax.scatter(
            g.intensity,
            roof,
            marker="*" if fused else "D",
            s=40 if fused else 16,
            color=ATTENTION_COLORS[phase],
            edgecolors="0.2",
            linewidths=0.4,
            zorder=4,
            label=f"{phase} attention, {form}",
        )
    elif source == "closed form":  # above the measured points: a hollow mark stays visible
        ax.scatter(
            g.intensity,
            roof,
            marker=mark,
            s=14,
            facecolors="none",
            zorder=3,
            edgecolors=colors[phase],
            linewidths=0.8,
            label=f"{phase}, closed form",
        )
    elif source == "traced":
        ax.scatter(
            g.intensity,
            roof,
            color=colors[phase],
            marker="x",
            s=10,
            linewidths=0.6,
            zorder=3,
            label=f"{phase}, traced (XLA)",
        )
    else:
        ax.scatter(
            g.intensity,
            g.achieved_flops_per_s,
            marker=mark,
            s=11,
            color=colors[phase],
            alpha=0.6,
            linewidths=0,
            zorder=2,
            label=f"{phase}, measured",
        )


def _pick(rows: pd.DataFrame) -> list[tuple[str, pd.Series, list[str]]]:
    """The kernels worth a label, per phase: the attention rows and the longest-running
    products; kernels whose points coincide (within 0.2 decade both ways) share one label."""
    groups = []
    for phase, g in rows.groupby("phase", sort=False):
        products = g[[_matters(k) for k in g.kernel]]
        attn = products[products.kernel.str.contains("attn/scores|attn/av")]
        top = products.drop(attn.index).nlargest(TOP_PRODUCTS, "median_s")
        for chosen in (top, attn.sort_values("median_s", ascending=False)):
            clusters: list[tuple[pd.Series, list[str]]] = []
            for _, r in chosen.iterrows():
                near = next((c for c in clusters if _near(c[0], r)), None)
                if near is None:
                    clusters.append((r, [short_kernel(r.kernel)]))
                else:
                    near[1].append(short_kernel(r.kernel))
            groups += [(phase, anchor, names) for anchor, names in clusters]
    return groups


def _near(a: pd.Series, b: pd.Series) -> bool:
    return (
        abs(math.log10(a.intensity / b.intensity)) < 0.2
        and abs(math.log10(a.achieved_flops_per_s / b.achieved_flops_per_s)) < 0.2
    )


def _label_measured(ax, g: pd.DataFrame, peak: float, bw: float) -> str | None:
    """A few labels (see `_pick`) in one column in the panel's empty lower right, ordered by
    their points' heights so no two leader lines cross; every other measured kernel is named in
    the caption this returns. A point above the roof (by the record's flag or by where it lands)
    is circled in red, so the figure never shows one silently."""
    rows = g.sort_values("achieved_flops_per_s")
    if "median_s" not in rows:
        rows = rows.assign(median_s=1.0 / rows.achieved_flops_per_s)
    groups = sorted(_pick(rows), key=lambda t: -t[1].achieved_flops_per_s)
    for i, (phase, r, names) in enumerate(groups):
        ax.annotate(
            f"{phase}: {', '.join(names)}",
            (r.intensity, r.achieved_flops_per_s),
            xytext=(0.5, 0.46 - 0.075 * i),
            textcoords="axes fraction",
            fontsize=5.5,
            va="center",
            ha="left",
            color=PHASE_COLORS.get(phase, "0.25"),
            arrowprops={
                "arrowstyle": "-",
                "lw": 0.4,
                "color": "0.55",
                "shrinkA": 1,
                "shrinkB": 2,
                "relpos": (0.0, 0.5),
            },
        )
    named = {(phase, n) for phase, _, names in groups for n in names}
    rest = sorted(
        {
            short_kernel(k)
            for p, k in zip(rows.phase, rows.kernel, strict=True)
            if (p, short_kernel(k)) not in named
        }
    )
    caption = None
    if rest:
        caption = (
            f"timed panel: labelled per phase, the attention and the {TOP_PRODUCTS} "
            "longest-running products; not labelled: " + ", ".join(rest)
        )
    above = [
        r.achieved_flops_per_s > min(peak, r.intensity * bw) * 1.0001
        or ("above_roof" in r and isinstance(r.above_roof, str))
        for _, r in rows.iterrows()
    ]
    if any(above):
        hot = rows[above]
        red_rings(ax, hot.intensity, hot.achieved_flops_per_s, zorder=5)
        red_rings(ax, [], [], label="above the measured roof (the record says why)")
    return caption
