"""The published measurements on each chip's roofline (issue 38): one panel per chip class."""

from __future__ import annotations

import numpy as np
import pandas as pd

PANELS = (
    ("Hopper: H100 SXM, H800, H200", ("h100-sxm", "h800", "h200")),
    ("H20", ("h20",)),
    ("A100 (40 / 80 GB)", ("a100-80gb", "a100-40gb")),
    ("TPU v5e", ("tpu-v5e",)),
)
MARKERS = {"attention_prefill": "o", "attention_decode": "s", "matmul": "^", "decode_step": "D",
           "prefill_step": "P"}  # fmt: skip


def published_roofline(records: pd.DataFrame, fig) -> bool | None:
    import seaborn as sns

    df = records[records.experiment == "published_roofline"]
    if df.empty:
        return False
    panels = [(t, chips) for t, chips in PANELS if df.chip.isin(chips).any()]
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    colors = dict(zip(MARKERS, sns.color_palette("colorblind", len(MARKERS)), strict=True))
    for ax, (title, chips) in zip(axes, panels, strict=True):
        d = df[df.chip.isin(chips)]
        # placed by the bound (exact FLOPs / compulsory bytes); records of runs before issue 49
        # have the implementation model's intensity only
        at = d.bound_intensity if "bound_intensity" in d else d.closed_intensity
        x = np.geomspace(0.5, max(3e4, at.max() * 2), 200)
        roofs = d.groupby(["chip_peak_flops_per_s", "chip_bandwidth_bytes_per_s"])
        for i, ((peak, bw), roof) in enumerate(roofs):
            chip = ", ".join(sorted(set(roof.chip)))
            dtypes = "/".join(sorted(set(roof.dtype)))
            ax.plot(x, np.minimum(peak, x * bw), lw=0.7, color="0.45", ls=("-", "--", ":")[i % 3])
            ax.annotate(f"{chip} {dtypes}: {peak / 1e12:,.0f} TF/s, {bw / 1e12:.2f} TB/s",
                        (x[-1], peak), fontsize=4, ha="right",
                        va="bottom" if i % 2 == 0 else "top")  # fmt: skip
        for kernel, g in d.groupby("kernel"):
            ax.scatter(at[g.index], g.measured_flops_per_s, s=6, marker=MARKERS[kernel],
                       color=colors[kernel], label=kernel, alpha=0.8, lw=0)  # fmt: skip
        above = d[d.above_bound]
        if not above.empty:
            ax.scatter(at[above.index], above.measured_flops_per_s, s=30,
                       facecolors="none", edgecolors="red", lw=0.8,
                       label="above its bound")  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="FLOP/byte (exact FLOPs / compulsory bytes)",
               title=f"{title} ({len(d)} rows)")  # fmt: skip
        ax.title.set_fontsize(6)
    axes[0].set_ylabel("FLOP/s per chip\n(exact FLOPs / published time)")
    axes[0].legend(fontsize=5, frameon=True, loc="lower right")
    fig.suptitle(f"{len(df)} published measurements under kvjax's roofs; "
                 f"{int(df.above_bound.sum())} above their bound", fontsize=7)  # fmt: skip
    return None
