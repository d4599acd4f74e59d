"""`roofline_compiled`: every kernel of a step on an accelerator's roofline in three views, the
closed form, XLA's lowered module and the chip's own executable compiled on this host."""

from __future__ import annotations

import pandas as pd
import seaborn as sns

from kvjax import kernels
from kvjax.plotting.roofline import draw_roof

SOURCES = {  # source prefix -> (marker, filled, legend)
    "closed form": ("o", False, "closed form"),
    "traced": ("x", True, "XLA lowered"),
    "compiled for": ("^", True, "compiled for the chip"),
}
PHASES = ("decode", "prefill")


def _source_key(source: str) -> str | None:
    if source.startswith("closed form,"):  # the attention both ways: the roofline figure's
        return None
    return next((k for k in SOURCES if source.startswith(k)), None)


def roofline_compiled(records: pd.DataFrame, fig) -> bool | None:
    """Rows: models; columns: decode, prefill. The products are coloured and named in the
    legend; every other kernel (norms, RoPE, softmax, residuals, activation, cache write) is
    grey, listed in the caption. A thin line joins a product's closed form to its compiled
    point: how far XLA's executable moves it."""
    df = records[
        (records.experiment == "roofline") & records.get("target", pd.Series(dtype=str)).notna()
    ]
    if df.empty:
        return False
    models = list(dict.fromkeys(df.model))
    phases = [p for p in PHASES if p in set(df.phase)]
    fig.set_size_inches(3.3 * len(phases) + 1.2, 2.3 * len(models) + 0.5)
    grid = fig.add_gridspec(len(models), len(phases) + 1, width_ratios=[1] * len(phases) + [0.36])
    axes = [[fig.add_subplot(grid[r, c]) for c in range(len(phases))] for r in range(len(models))]
    key_ax = fig.add_subplot(grid[:, -1])
    key_ax.axis("off")
    products = [
        k
        for k in kernels.REGISTRY
        if kernels.REGISTRY[k].kind == kernels.MATMUL and k in set(df.kernel)
    ]
    palette = _product_palette(products)
    for row, model in enumerate(models):
        for col, phase in enumerate(phases):
            ax = axes[row][col]
            g = df[(df.model == model) & (df.phase == phase)]
            _panel(ax, g, palette)
            ax.set_title(
                f"{model}, {phase} (B={_one(g, 'batch')}, S={_one(g, 'context')})", fontsize=6.5
            )
    _key(key_ax, df, products, palette)
    _title(fig, df)


def _product_palette(products: list[str]) -> dict:
    """A colour per product, in the registry's order."""
    # tab10 without its grey: grey is "the others" (every kernel that is not a product)
    tab = [c for i, c in enumerate(sns.color_palette("tab10", 10)) if i != 7]
    tab += sns.color_palette("tab20b", 20)
    return dict(zip(products, tab[: len(products)], strict=True))


def _key(key_ax, df: pd.DataFrame, products: list[str], palette: dict) -> None:
    """The key column: the three views' markers, the products' colours, the others named."""
    handles = [
        key_ax.scatter(
            [],
            [],
            marker=m,
            s=14,
            label=label,
            **(
                {"color": "0.3"}
                if m == "x"
                else {"facecolors": "0.3" if filled else "none", "edgecolors": "0.3"}
            ),
        )
        for m, filled, label in SOURCES.values()
    ]
    handles += [
        key_ax.scatter([], [], marker="s", color=c, s=14, label=k) for k, c in palette.items()
    ]
    others = sorted(set(df.kernel) - set(products) - {kernels.ATTENTION})
    handles.append(key_ax.scatter([], [], marker="s", color="0.65", s=14, label="the others"))
    key_ax.legend(handles=handles, loc="upper left", fontsize=5.5, frameon=True)
    key_ax.text(
        0.0,
        0.52,
        "the others:\n" + "\n".join(others),
        fontsize=5,
        va="top",
        transform=key_ax.transAxes,
        color="0.3",
    )
    key_ax.text(
        0.0,
        0.0,
        "a line joins a product's\n"
        "closed form to its compiled\n"
        "point; a fused product\n"
        "moves: the bytes between\n"
        "fused kernels are counted\n"
        "on one of them",
        fontsize=4.5,
        va="bottom",
        transform=key_ax.transAxes,
        color="0.3",
    )


def _title(fig, df: pd.DataFrame) -> None:
    """The title: the chip whose roofline it is and the target compiled for on this host."""
    device = df.device.dropna().iloc[0] if "device" in df and df.device.notna().any() else ""
    target = str(df.target.dropna().iloc[0]).upper()
    accelerator = "TPU" if target.startswith(("V", "TPU")) else "GPU"
    fig.suptitle(
        f"every kernel on the {device or df.chip.iloc[0]} roofline: closed form, XLA's lowered "
        f"module, and the executable compiled here for the {target}, no {accelerator} used",
        fontsize=7,
    )


def _one(g: pd.DataFrame, column: str):
    if column not in g or not len(g):
        return "?"
    value = g[column].iloc[0]
    return f"{value:,.0f}" if isinstance(value, float) and value == int(value) else value


def _panel(ax, g: pd.DataFrame, palette: dict) -> None:
    peak, bw = g.peak_flops_per_s.iloc[0], g.bandwidth_bytes_per_s.iloc[0]
    draw_roof(ax, peak, bw, g.intensity, fontsize=5.5)
    for source, r in g.groupby("source"):
        key = _source_key(source)
        if key is None:
            continue
        marker, filled, _ = SOURCES[key]
        for _, k in r.iterrows():
            color = palette.get(k.kernel, "0.65")
            y = min(peak, k.intensity * bw)
            style = (
                {"color": color}
                if key == "traced"
                else {"facecolors": color if filled else "none", "edgecolors": color}
            )
            front = 3 if key == "compiled for" else 2
            ax.scatter(
                [k.intensity],
                [y],
                marker=marker,
                s=16 if key != "traced" else 12,
                linewidths=0.7,
                zorder=front,
                **style,
            )
    closed = g[g.source == "closed form"].set_index("kernel")
    compiled = g[g.source.str.startswith("compiled for")].set_index("kernel")
    for kernel in palette:
        if kernel in closed.index and kernel in compiled.index:
            xs = [closed.intensity[kernel], compiled.intensity[kernel]]
            ax.plot(xs, [min(peak, x * bw) for x in xs], color=palette[kernel], lw=0.5, alpha=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)", fontsize=6)
    ax.set_ylabel("attainable FLOP/s", fontsize=6)
    ax.tick_params(labelsize=5.5)
