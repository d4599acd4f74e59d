"""The published measurements against kvjax's bounds: the kernel corpus on each chip's roofline
(a panel per chip class), the implementation model's held-out residuals, and the serving systems
against their system bound and their held-out prediction."""

from __future__ import annotations

import numpy as np
import pandas as pd

PANELS = (
    ("Hopper: H100 SXM, H800, H200", ("h100-sxm", "h800", "h200")),
    ("H20", ("h20",)),
    ("A100 (40 / 80 GB)", ("a100-80gb", "a100-40gb")),
    ("Blackwell: B200, GB200", ("b200", "gb200")),
    ("TPU v5e", ("tpu-v5e",)),
)
MARKERS = {
    "attention_prefill": "o",
    "attention_decode": "s",
    "matmul": "^",
    "decode_step": "D",
    "prefill_step": "P",
}


def _kernel_rows(records: pd.DataFrame) -> pd.DataFrame:
    """The kernel corpus's records (a record without `row_kind` is a kernel's)."""
    df = records[records.experiment == "published_roofline"]
    return df[df.row_kind == "kernel"] if "row_kind" in df else df


def published_roofline(records: pd.DataFrame, fig) -> bool | None:
    import seaborn as sns

    df = _kernel_rows(records)
    if df.empty:
        return False
    panels = [(t, chips) for t, chips in PANELS if df.chip.isin(chips).any()]
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    colors = dict(zip(MARKERS, sns.color_palette("colorblind", len(MARKERS)), strict=True))
    for ax, (title, chips) in zip(axes, panels, strict=True):
        d = df[df.chip.isin(chips)]
        # placed by the bound (exact FLOPs / compulsory bytes); a record without
        # `bound_intensity` has the implementation model's intensity only
        at = d.bound_intensity if "bound_intensity" in d else d.closed_intensity
        x = np.geomspace(0.5, max(3e4, at.max() * 2), 200)
        roofs = d.groupby(["chip_peak_flops_per_s", "chip_bandwidth_bytes_per_s"])
        for i, ((peak, bw), roof) in enumerate(roofs):
            chip = ", ".join(sorted(set(roof.chip)))
            dtypes = "/".join(sorted(set(roof.dtype)))
            ax.plot(x, np.minimum(peak, x * bw), lw=0.7, color="0.45", ls=("-", "--", ":")[i % 3])
            ax.annotate(
                f"{chip} {dtypes}: {peak / 1e12:,.0f} TF/s, {bw / 1e12:.2f} TB/s",
                (x[-1], peak),
                fontsize=4,
                ha="right",
                va="bottom" if i % 2 == 0 else "top",
            )
        for kernel, g in d.groupby("kernel"):
            ax.scatter(
                at[g.index],
                g.measured_flops_per_s,
                s=6,
                marker=MARKERS[kernel],
                color=colors[kernel],
                label=kernel,
                alpha=0.8,
                lw=0,
            )
        # the rows whose bound counts a sliding window's pairs and keys; any above its bound
        windowed = d[d["window"].notna()] if "window" in d else d.iloc[:0]
        _ring(ax, at, windowed, "sliding window", s=16, marker="s", edgecolors="0.2", lw=0.5)
        _ring(ax, at, d[d.above_bound], "above its bound", s=30, edgecolors="red", lw=0.8)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="FLOP/byte (exact FLOPs / compulsory bytes)",
            title=f"{title} ({len(d)} rows)",
        )
        ax.title.set_fontsize(6)
    axes[0].set_ylabel("FLOP/s per chip\n(exact FLOPs / published time)")
    axes[0].legend(fontsize=5, frameon=True, loc="lower right")
    fig.suptitle(
        f"{len(df)} published measurements under kvjax's roofs; {int(df.above_bound.sum())} "
        "above their bound",
        fontsize=7,
    )
    return None


def _ring(ax, at, rows: pd.DataFrame, label: str, **style) -> None:
    """Hollow markers around `rows` on a roofline panel (none drawn, no legend entry, if empty)."""
    if not rows.empty:
        ax.scatter(
            at[rows.index], rows.measured_flops_per_s, facecolors="none", label=label, **style
        )


def published_residuals(records: pd.DataFrame, fig) -> bool | None:
    """The implementation model's check: each row's held-out residual log2(predicted /
    measured) (the fit that never saw the row's source group) against the head dimension and S
    (fused prefill), a decode's stretch (its busiest core's walk over the mean core's, on the
    schedule its implementation plans: `kvjax.predict.implementations`), the implementation
    (its name up to its first parenthesis), the source group, the chip and how the source timed
    the row (`timing`: a profiler's kernel time, a CUDA graph's
    replay, CUDA events around launches from the host, the host's clock; every class). Structure
    left in these panels is what the model absorbs instead of explains."""
    import seaborn as sns

    df = _kernel_rows(records)
    if df.empty or "seq_kv" not in df:
        return False
    # the fastest measurement of each shape: what the model predicts (slower implementations of
    # a shape, PyTorch's eager attention say, sit far below it by design)
    df = df[df.held_out_predicted_s.notna() & df.best_of_shape.astype(bool)].copy()
    df["residual"] = np.log2(df.held_out_predicted_s.astype(float) / df.measured_s)
    pre = df[df.kernel == "attention_prefill"]
    df["impl"] = [str(i).split(" (")[0][:28] for i in df.implementation.fillna(df.kernel)]
    timing = df["timing"] if "timing" in df else pd.Series("", index=df.index)
    df["timing"] = timing.fillna("").replace("", "unstated")
    axes = fig.subplots(1, 7, gridspec_kw={"width_ratios": (1, 1, 1, 1.3, 1.3, 1, 0.8)})
    colors = dict(zip(MARKERS, sns.color_palette("colorblind", len(MARKERS)), strict=True))
    _prefill_panels(axes[:2], pre)
    _by_stretch(axes[2], df)
    for ax, by in zip(axes[3:], ("impl", "source_group", "chip", "timing"), strict=True):
        sns.stripplot(
            data=df, x="residual", y=by, hue="kernel", ax=ax, size=2.5, palette=colors, jitter=0.25
        )
        ax.set(xlabel="log2(predicted / measured)", ylabel="")
    for ax in axes[:3]:
        ax.set_ylabel("log2(predicted / measured), held out")
        ax.legend(fontsize=4 if ax is axes[2] else 5, frameon=True)
    for ax in axes:
        ax.axhline(0, color="0.3", lw=0.6) if ax in axes[:3] else ax.axvline(0, color="0.3", lw=0.6)
        ax.tick_params(labelsize=5)
        ax.tick_params(axis="y", labelsize=4 if ax in axes[3:5] else 5)
        ax.xaxis.label.set_fontsize(6)
        ax.yaxis.label.set_fontsize(6)
    for ax in (*axes[3:5], axes[6]):  # one legend of the kernel classes, on the chip panel
        ax.get_legend().remove()
    axes[5].legend(fontsize=4, frameon=True)
    fig.suptitle(
        f"Held-out residuals of kvjax's implementation model, the {len(df)} fastest rows of "
        "their shapes (0 = exact; +1 = predicted twice the measured time)",
        fontsize=7,
    )
    return None


def _prefill_panels(axes, pre: pd.DataFrame) -> None:
    """The fused prefills' residuals by head dimension and by S, coloured by their mask."""
    import seaborn as sns

    windowed = pre["window"].notna() if "window" in pre else pd.Series(False, index=pre.index)
    pre = pre.assign(
        mask=np.where(
            windowed, "sliding window", np.where(pre.causal.astype(bool), "causal", "not causal")
        ),
        head=pre.head_dim.astype(int),
    )
    kinds = ("causal", "not causal", "sliding window")
    masks = dict(zip(kinds, sns.color_palette("deep", 3), strict=True))
    sns.stripplot(
        data=pre,
        x="head",
        y="residual",
        hue="mask",
        ax=axes[0],
        size=2.5,
        jitter=0.25,
        dodge=True,
        palette=masks,
        hue_order=list(masks),
    )
    axes[0].set(xlabel="head dim (fused prefill)")
    for mask, g in pre.groupby("mask"):
        axes[1].scatter(
            g.seq_kv.fillna(g.seq_q),
            g.residual,
            s=5,
            alpha=0.7,
            label=mask,
            lw=0,
            color=masks[mask],
        )
    axes[1].set(xscale="log", xlabel="S (fused prefill)")


def _by_stretch(ax, df: pd.DataFrame) -> None:
    """Decode rows' residuals against their schedule's stretch, one colour a schedule (an
    implementation's rule, or kvjax's plan where no rule names the row)."""
    import seaborn as sns

    dec = df[df.kernel == "attention_decode"]
    if "stretch" not in dec or dec.stretch.isna().all():
        ax.set_axis_off()
        return
    names = sorted(dec.schedule.fillna("kvjax").unique())
    colors = dict(zip(names, sns.color_palette("tab10", len(names)), strict=True))
    for name, g in dec.groupby(dec.schedule.fillna("kvjax")):
        ax.scatter(g.stretch, g.residual, s=7, alpha=0.8, lw=0, label=name, color=colors[name])
    ax.set(xscale="log", xlabel="decode: busiest core / mean core (its own schedule)")


def _family(source: str, group: str) -> str:
    """A system row's colour: MLPerf's results together (their submitters' groups are many),
    else its source group (NVIDIA's TensorRT-LLM pages, SGLang's blog, AMD's ROCm docs)."""
    return "MLPerf Inference" if str(source).startswith("mlperf-inference") else group


_MARKERS = {"offline": "o", "at a rate or concurrency": "s", "under an SLO": "D", "latency": "^"}


def _prediction_kind(row: pd.Series) -> str:
    """What a predicted row is: a latency, a throughput under MLPerf's Server or Interactive
    SLO, an offline throughput, or one at a published rate or concurrency."""
    if row.metric.endswith("_s") and not row.metric.endswith("per_s"):
        return "latency"
    scenario = row.get("scenario")
    if scenario in ("server", "interactive"):
        return "under an SLO"
    return "at a rate or concurrency" if scenario in ("rate", "concurrency") else "offline"


def published_systems(records: pd.DataFrame, fig) -> bool | None:
    """Each published serving-system result against its system bound (throughputs: measured
    below the diagonal respects it; latencies: above it), and the held-out prediction against
    the measurement where the simulator ran."""
    import seaborn as sns
    from matplotlib import ticker

    df = records[records.experiment == "published_roofline"]
    if "row_kind" not in df or not (df.row_kind == "system").any():
        return False
    df = df[df.row_kind == "system"]
    df = df.assign(family=[_family(s, g) for s, g in zip(df.source, df.source_group, strict=True)])
    latency = df.metric.str.endswith("_s") & ~df.metric.str.endswith("per_s")
    families = sorted(df.family.unique(), key=lambda f: (f != "MLPerf Inference", f))
    colors = dict(zip(families, sns.color_palette("colorblind", len(families)), strict=True))
    axes = fig.subplots(1, 3)
    _against_bound(axes[0], df[~latency], "throughput (tokens or requests / s)", colors)
    _against_bound(axes[1], df[latency], "latency (TTFT, TPOT; s)", colors)
    axes[0].legend(fontsize=4, frameon=True, loc="upper left")
    pred = df[df.predicted_value.notna()]
    if not pred.empty:
        _held_out(axes[2], pred)
    axes[2].set(
        yscale="log",
        xlabel="rows (by implementation, group, then ratio)",
        ylabel="predicted / measured (80% interval)",
    )
    axes[2].yaxis.set_major_locator(ticker.FixedLocator([0.1, 0.25, 0.5, 1, 2, 4]))
    axes[2].yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    axes[2].yaxis.set_minor_formatter(ticker.NullFormatter())
    for ax in axes:
        ax.title.set_fontsize(6)
        ax.tick_params(which="both", labelsize=5)
        ax.xaxis.label.set_fontsize(6)
        ax.yaxis.label.set_fontsize(6)
    fig.suptitle(
        f"{len(df)} published serving-system results against kvjax's system bound and prediction",
        fontsize=7,
    )
    return None


def _against_bound(ax, part: pd.DataFrame, title: str, colors: dict) -> None:
    """Measured against the system bound, log-log, coloured by source family, the diagonal drawn."""
    for fam, g in part.groupby("family"):
        ax.scatter(
            g.bound_value,
            g.measured,
            s=5,
            lw=0,
            alpha=0.7,
            color=colors[fam],
            label=f"{fam} ({len(g)})",
        )
    lo = min(part.bound_value.min(), part.measured.min()) / 2
    hi = max(part.bound_value.max(), part.measured.max()) * 2
    ax.plot([lo, hi], [lo, hi], color="0.3", lw=0.7)
    beat = int(part.above_bound.astype(bool).sum())
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="kvjax's system bound",
        ylabel="measured",
        title=f"{title}: {beat} of {len(part)} beat the bound",
    )


def _held_out(ax, pred: pd.DataFrame) -> None:
    """Each predicted row's predicted / measured with its 80% interval, by implementation."""
    import seaborn as sns

    impl = pred.implementation if "implementation" in pred else pred.family
    pred = pred.assign(
        ratio=pred.predicted_value.astype(float) / pred.measured,
        kind=pred.apply(_prediction_kind, axis=1),
        impl=impl.fillna("unstated"),
    )
    pred = pred.sort_values(["impl", "source_group", "ratio"]).reset_index(drop=True)
    names = sorted(pred.impl.unique())
    shades = dict(zip(names, sns.color_palette("dark", len(names)), strict=True))
    for (name, kind), g in pred.groupby(["impl", "kind"]):
        color = shades[name]
        if "predicted_lo" in g and g.predicted_lo.notna().all():
            lo, hi = g.predicted_lo.astype(float), g.predicted_hi.astype(float)
            ax.errorbar(
                g.index,
                g.ratio,
                yerr=[g.ratio - lo / g.measured, hi / g.measured - g.ratio],
                fmt="none",
                lw=0.5,
                alpha=0.5,
                color=color,
            )
        n = g.source_group.nunique()
        label = f"{name}: {kind} ({len(g)}, {n} group{'s' * (n > 1)})"
        ax.scatter(g.index, g.ratio, s=8, lw=0, color=color, marker=_MARKERS[kind], label=label)
    ax.axhline(1.0, color="0.3", lw=0.7)
    for f in (0.85, 1.15):
        ax.axhline(f, color="0.6", lw=0.5, ls="--")
    lo = min(0.5, float(pred.ratio.min()) / 1.5) / 5  # room under the rows for the legend
    ax.set_ylim(lo, max(2.0, float(pred.ratio.max())) * 1.5)
    ax.legend(fontsize=4, frameon=True, loc="lower left")
    ax.set_title(
        f"held out by implementation, {len(pred)} rows: median |pred/meas - 1| "
        f"{float((pred.ratio - 1).abs().median()):.1%}"
    )
