"""What the measured view adds to the figures: kernel labels and above-the-roof marks on a
roofline panel, each kernel's measured time inside the step against its bound, and the decode
step measured against its bound over the KV bytes a token (the h_kv and MLA latent ablations)."""

from __future__ import annotations

import pandas as pd

from kvjax.plotting.style import (
    MLA_COLOR,
    device_name,
    host_cpu,
    key_below,
    kv_palette,
    red_rings,
)


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
    return any(
        kernels.REGISTRY.get(p) is not None and kernels.REGISTRY[p].kind == kernels.MATMUL
        for p in parts
    )


def _tick(kernel: str, key: dict[str, str]) -> str:
    """A kernel row's tick label: its short name, or for a fused row of three or more kernels a
    letter explained in the caption (`key`), so no tick label outgrows the axis."""
    short = short_kernel(kernel)
    if kernel.count(" + ") < 2:
        return short
    return key.setdefault(short, f"[{chr(ord('a') + len(key))}]")


def kernel_bound(records: pd.DataFrame, fig) -> None:
    """Every kernel (row) timed inside the step against its roofline bound, per num_kv_heads:
    bound / measured, 1 on the roof; a red triangle marks a row flagged above the roof."""
    df = records[records.experiment == "profile"]
    keys = ["device", "model", "phase", "batch", "context"]
    panels = list(dict.fromkeys(zip(*(df[k] for k in keys), strict=True)))
    fig.set_size_inches(fig.get_figwidth(), 3.1)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    palette = kv_palette(df.num_kv_heads)
    for ax, panel in zip(axes, panels, strict=True):
        device, phase = panel[0], panel[2]
        g = df[(df[keys] == pd.Series(panel, index=keys)).all(axis=1)]
        g = g[(g.closed_bytes > 0) | (g.kernel == "step")]
        order = list(dict.fromkeys(g.kernel))
        heads = sorted({int(k) for k in g.num_kv_heads})
        width = 0.8 / len(heads)
        flagged = False
        for j, k in enumerate(heads):
            gk = g[g.num_kv_heads == k].set_index("kernel").reindex(order)
            xs = [i + (j - (len(heads) - 1) / 2) * width for i in range(len(order))]
            ax.bar(xs, gk.fraction_of_bound, width, color=palette[k], label=f"h_kv={k}")
            for x, frac, flag in zip(xs, gk.fraction_of_bound, gk.above_roof, strict=True):
                if isinstance(flag, str):
                    ax.scatter([x], [frac + 0.04], marker="v", s=8, color="red")
                    flagged = True
        if flagged:
            ax.scatter([], [], marker="v", s=8, color="red", label="above the roof (see record)")
        ax.axhline(1.0, color="0.2", lw=0.8, ls="--")
        fused: dict[str, str] = {}
        ax.set_xticks(
            range(len(order)), [_tick(k, fused) for k in order], rotation=65, ha="right", fontsize=5
        )
        if fused:  # the fused rows' names, under the axis
            ax.set_xlabel("; ".join(f"{t} = {name}" for name, t in fused.items()), fontsize=5)
        ax.set_ylabel("bound / measured (1 = roof)", fontsize=6)
        steps = g[g.kernel == "step"]
        cover = (
            f"; step coverage {steps.coverage.min():.0%}-{steps.coverage.max():.0%}"
            if len(steps)
            else ""
        )
        wl = f"B={int(g.batch.iloc[0])}, S={int(g.context.iloc[0])}"
        where = device_name(device, host_cpu(g))
        ax.set_title(
            f"{g.model.iloc[0]} {phase}, {wl}: each kernel in situ\non {where}{cover}", fontsize=6
        )
        # a strip of headroom above the tallest bar holds the legend: it covers no bar
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + (0.45 if flagged else 0.25) * (high - low))
        ax.legend(fontsize=5, frameon=True, loc="upper left", ncol=2 if flagged else 3)


def mark_flags(ax, xs, ys, flags) -> None:
    """Red rings on the measured points whose record carries flags (below the bound, against
    the trend of the bytes): a figure never shows one silently."""
    hit = [(x, y) for x, y, f in zip(xs, ys, flags, strict=True) if isinstance(f, str) and f]
    if hit:
        red_rings(ax, *zip(*hit, strict=True), label="flagged (see the record)", zorder=5)


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
    key_below(
        ax,
        -0.22,
        ncol=1,
        title="tags above the axis: each point's h_kv (GQA) or latent A (MLA)",
        title_fontsize=5.5,
    )
