"""What every figure shares: one palette (a colour per num_kv_heads, ordered by value; MLA its
own), the measured device as a title names it, readable log ticks, sizes in GiB, a key and
caption below the data, red rings."""

from __future__ import annotations

import seaborn as sns

GIB = 2**30  # sizes are drawn in GiB (binary), rates in decimal units


def kv_palette(values) -> dict[int, tuple]:
    """One colour per num_kv_heads, the same in every figure (ordered by value)."""
    keys = sorted({int(v) for v in values})
    colors = sns.color_palette("viridis", n_colors=max(len(keys), 2))
    return {k: colors[i] for i, k in enumerate(keys)}


MLA_COLOR = "#c44e52"  # multi-head latent attention, outside the h_kv scale


def variant_color(variant: str, num_kv_heads: int, palette: dict[int, tuple]):
    """MLA rows in their own colour (their head count is not a cache size), the rest by h_kv."""
    return MLA_COLOR if str(variant).startswith("MLA") else palette[int(num_kv_heads)]


def device_name(name, cpu=None) -> str:
    """A measured device as a title names it: the host CPU from the run's environment
    (`AMD EPYC 7B13 (2 cores)`) for `cpu:cpu` or `measured cpu:cpu`, else the name itself."""
    name = str(name).removeprefix("measured ")
    if not name.startswith("cpu"):
        return name
    return str(cpu) if isinstance(cpu, str) and cpu else "this host's CPU"


def host_cpu(df) -> str | None:
    """The CPU named in a frame's records (`host_cpu`, from the run's environment.json)."""
    if "host_cpu" not in df or not df.host_cpu.notna().any():
        return None
    return str(df.host_cpu.dropna().iloc[0])


def log_ticks(axis) -> None:
    """Plain-number labels on a log axis, dense enough to read: 1-2-5 per decade, 1-1.5-2-3-5-7
    when the axis spans under a decade and a half (one label per decade reads as none)."""
    import math

    from matplotlib import ticker

    lo, hi = sorted(axis.get_view_interval())
    span = math.log10(hi / lo) if lo > 0 else 2.0
    subs = (1, 1.5, 2, 3, 5, 7) if span < 1.5 else (1, 2, 5) if span < 3.5 else (1,)
    decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
    ticks = [s * 10.0**d for d in decades for s in subs if lo <= s * 10.0**d <= hi]
    axis.set_major_locator(ticker.FixedLocator(ticks))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def key_below(ax, y: float, fontsize: float = 5.5, **kwargs) -> None:
    """The axes' key centred below them, off the data (`y`: its top, in axes fractions)."""
    ax.legend(
        fontsize=fontsize, frameon=False, loc="upper center", bbox_to_anchor=(0.5, y), **kwargs
    )


def caption_below(key, lines: list[str], fontsize: float) -> None:
    """A caption's lines at the foot of a key row, centred, in grey."""
    key.text(
        0.5,
        0.0,
        "\n".join(lines),
        ha="center",
        va="bottom",
        fontsize=fontsize,
        color="0.25",
        transform=key.transAxes,
    )


def red_rings(ax, xs, ys, **kwargs) -> None:
    """Red rings round points no reader may miss (flagged, or above their roof)."""
    ax.scatter(xs, ys, s=45, facecolors="none", edgecolors="red", linewidths=0.7, **kwargs)
