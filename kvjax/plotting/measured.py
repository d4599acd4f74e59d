"""What the measured view adds to the figures: kernel labels and above-the-roof marks on a
roofline panel, and each kernel's measured time inside the step against its bound."""

from __future__ import annotations

import pandas as pd

from kvjax.plotting.style import kv_palette


def short_kernel(name: str) -> str:
    """`attn/softmax + attn/av` -> `softmax+av`: a kernel row's label on a crowded axis (norms
    and residuals keep their prefix: there is one per sublayer)."""
    drop = ("attn/", "mlp/", "kv_cache/")
    return "+".join(
        part.removeprefix(next((d for d in drop if part.startswith(d)), ""))
        for part in name.split(" + ")
    )


PHASE_COLORS = {"prefill": "#c44e52", "decode": "#4c72b0"}


def _matters(kernel: str) -> bool:
    """A row worth a label: a product, or a fused row holding one (attention, projections)."""
    from kvjax import kernels

    parts = kernel.split(" + ")
    return any(kernels.REGISTRY.get(p) is not None and kernels.REGISTRY[p].kind == kernels.MATMUL
               for p in parts)  # fmt: skip


def _label_measured(ax, g: pd.DataFrame, peak: float, bw: float) -> str | None:
    """The products among the measured points labelled in a column right of the panel, each
    with a leader line to its point, in the order of their heights (labels never overlap); the
    other kernels (norms, RoPE, residuals, activation, cache write) are named in one caption
    line. A point above the roof (by the record's flag or by where it lands) is circled in red,
    so the figure never shows one silently."""
    rows = g.sort_values("achieved_flops_per_s")
    labelled = rows[[_matters(k) for k in rows.kernel]]
    n = max(1, len(labelled))
    for i, (_, r) in enumerate(labelled.iterrows()):
        y_frac = 0.04 + 0.92 * (i + 0.5) / n
        ax.annotate(f"{r.phase[0]} {short_kernel(r.kernel)}",
                    (r.intensity, r.achieved_flops_per_s), xytext=(1.03, y_frac),
                    textcoords="axes fraction", fontsize=4.2, va="center",
                    color=PHASE_COLORS.get(r.phase, "0.25"),
                    arrowprops={"arrowstyle": "-", "lw": 0.3, "color": "0.65",
                                "shrinkA": 0, "shrinkB": 1.5})  # fmt: skip
    others = sorted({short_kernel(k) for k in rows.kernel if not _matters(k)})
    caption = None
    if others:  # the caller shows it off the data (the legend's title below the axes)
        half = (len(others) + 1) // 2
        caption = "unlabelled: " + ", ".join(others[:half]) + ",\n" + ", ".join(others[half:])
    above = [
        r.achieved_flops_per_s > min(peak, r.intensity * bw) * 1.0001
        or ("above_roof" in r and isinstance(r.above_roof, str))
        for _, r in rows.iterrows()
    ]
    if any(above):
        hot = rows[above]
        ax.scatter(hot.intensity, hot.achieved_flops_per_s, s=45, facecolors="none",
                   edgecolors="red", linewidths=0.7)  # fmt: skip
        ax.scatter([], [], s=45, facecolors="none", edgecolors="red", linewidths=0.7,
                   label="above the measured roof (the record says why)")  # fmt: skip
    return caption


def kernel_bound(records: pd.DataFrame, fig) -> None:
    """Every kernel (row) timed inside the step against its roofline bound, per num_kv_heads:
    bound / measured, 1 on the roof; a triangle marks a row flagged above the roof."""
    df = records[records.experiment == "profile"]
    keys = ["device", "model", "phase", "batch", "context"]
    panels = list(dict.fromkeys(zip(*(df[k] for k in keys), strict=True)))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    palette = kv_palette(df.num_kv_heads)
    for ax, panel in zip(axes, panels, strict=True):
        device, phase = panel[0], panel[2]
        g = df[(df[keys] == pd.Series(panel, index=keys)).all(axis=1)]
        g = g[(g.closed_bytes > 0) | (g.kernel == "step")]
        order = list(dict.fromkeys(g.kernel))
        heads = sorted({int(k) for k in g.num_kv_heads})
        width = 0.8 / len(heads)
        for j, k in enumerate(heads):
            gk = g[g.num_kv_heads == k].set_index("kernel").reindex(order)
            xs = [i + (j - (len(heads) - 1) / 2) * width for i in range(len(order))]
            ax.bar(xs, gk.fraction_of_bound, width, color=palette[k], label=f"h_kv={k}")
            for x, frac, flag in zip(xs, gk.fraction_of_bound, gk.above_roof, strict=True):
                if isinstance(flag, str):
                    ax.scatter([x], [frac + 0.04], marker="v", s=8, color="red")
        ax.axhline(1.0, color="0.2", lw=0.8, ls="--")
        ax.set_xticks(range(len(order)), [short_kernel(k) for k in order], rotation=65,
                      ha="right", fontsize=4.5)  # fmt: skip
        ax.set_ylabel("bound / measured (1 = roof)", fontsize=6)
        steps = g[g.kernel == "step"]
        cover = (
            f", coverage {steps.coverage.min():.0%}-{steps.coverage.max():.0%}"
            if len(steps)
            else ""
        )
        wl = f"B={int(g.batch.iloc[0])}, S={int(g.context.iloc[0])}"
        where = "this CPU" if str(device).startswith("cpu") else device
        ax.set_title(f"{g.model.iloc[0]} {phase}, {wl}, in situ on {where}{cover}", fontsize=6)
        # a strip of headroom above the tallest bar holds the legend: it covers no bar
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + 0.25 * (high - low))
        ax.legend(fontsize=5, frameon=True, loc="upper left", ncol=3)


def mark_flags(ax, xs, ys, flags) -> None:
    """Red rings on the measured points whose record carries flags (below the bound, against
    the trend of the bytes): a figure never shows one silently."""
    hit = [(x, y) for x, y, f in zip(xs, ys, flags, strict=True) if isinstance(f, str) and f]
    if hit:
        ax.scatter(*zip(*hit, strict=True), s=45, facecolors="none", edgecolors="red",
                   linewidths=0.7, label="flagged (see the record)", zorder=5)  # fmt: skip
