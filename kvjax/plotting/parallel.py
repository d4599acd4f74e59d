"""Tensor parallelism: the KV cache per device and the decode floor (HBM + link bytes) against tp,
one line per num_kv_heads, the closed form beside the bytes the sharded model's own shardings put
on a device and, where traced, the compiled program's FLOPs and collectives."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib import ticker

from kvjax.plotting.style import GIB, kv_palette


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
