"""Decode against batch B: ms per decode step per chip and the decode intensity beside the seed's
I = B, one line per num_kv_heads (and per MoE model, whose weights read grow with the experts its
batch touches); closed form, and measured where a run timed it."""

from __future__ import annotations

import pandas as pd

from kvjax.plotting.measured import mark_flags
from kvjax.plotting.serving import mark_unheld
from kvjax.plotting.style import device_name, host_cpu, key_below, kv_palette, log_ticks


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
        key_below(ax, -0.2, ncol=2, columnspacing=1.0)


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
    key_below(ax, -0.22, ncol=2, columnspacing=1.0)
