"""The serving frontier figure: tokens/s per chip against ms/token per sequence, one line per
attention variant and KV dtype, each ending (a dot) where memory ends; a panel per model,
context and chip (records of `experiments/serving_frontier.py`)."""

from __future__ import annotations

import textwrap

import pandas as pd
import seaborn as sns
from matplotlib import ticker

from kvjax.plotting.style import MLA_COLOR

DTYPE_STYLE = {"bf16": "-", "f16": "-", "f32": "-", "fp8": "--", "int8": ":", "int4": "-."}


def _variant_colors() -> dict[str, tuple]:
    mha, gqa, mqa = sns.color_palette("viridis", n_colors=3)[::-1]
    return {"MHA": mha, "GQA": gqa, "MQA": mqa, "MLA": MLA_COLOR}


def _kind(variant: str) -> str:
    return "MLA" if str(variant).startswith("MLA") else str(variant).split()[0]


WIDTH = {"MHA": 1.6, "GQA": 1.3, "MQA": 0.8, "MLA": 0.8}  # a line under an equal one shows


def _panel(ax, g: pd.DataFrame, colors) -> tuple[list[str], list[str]]:
    """One (model, context, chip): its lines; returns what has no line (no fit, or not
    modelled) and which lines coincide (on tp chips GQA-tp and MQA hold one KV head each)."""
    absent, drawn = [], {}
    for (variant, kv), line in g.groupby(["variant", "kv_dtype"], sort=False):
        line = line[line.batch > 0].sort_values("batch")
        if line.empty:
            absent.append(f"{_kind(variant)} {kv}")
            continue
        key = (kv, tuple(line.batch), tuple(line.ms_per_token.round(9)))
        drawn.setdefault(key, []).append(_kind(variant))
        style = {"color": colors.get(_kind(variant), "0.4"), "lw": WIDTH.get(_kind(variant), 0.9),
                 "ls": DTYPE_STYLE.get(kv, "-")}  # fmt: skip
        ax.plot(line.ms_per_token, line.tokens_per_s, label=f"{_kind(variant)}, {kv} KV", **style)
        end = line.iloc[-1]
        ax.plot([end.ms_per_token], [end.tokens_per_s], "o", ms=2.5, color=style["color"])
    ax.axvline(g.weights_floor_ms_per_token.min(), color="0.6", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers: the ranges span one or two decades
        axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(ticker.NullFormatter())
    ax.tick_params(labelsize=4.5)
    same = sorted({" = ".join(kinds) for kinds in drawn.values() if len(kinds) > 1})
    return absent, same


def serving_frontier(records: pd.DataFrame, fig) -> bool | None:
    df = records[records.experiment == "serving_frontier"]
    df = df.assign(tp=df.tp.fillna(1).astype(int) if "tp" in df else 1)
    panels = list(dict.fromkeys(zip(df.model, df.tp, df.context, df.chip, strict=True)))
    if not panels:
        return False
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig.set_size_inches(1.75 * cols, 1.75 * rows + 0.7)
    grid = fig.add_gridspec(rows + 1, cols, height_ratios=[1.0] * rows + [0.22])
    colors = _variant_colors()
    handles: dict[str, object] = {}
    for i, (model, tp, context, chip) in enumerate(panels):
        ax = fig.add_subplot(grid[i // cols, i % cols])
        g = df[(df.model == model) & (df.tp == tp) & (df.context == context) & (df.chip == chip)]
        absent, same = _panel(ax, g, colors)
        where = f"{chip}" if tp == 1 else f"{tp} x {chip}, per chip"
        # notes go in the title, off the data: no fit / not modelled, and lines that coincide
        notes = ([f"no line: {', '.join(absent)}"] if absent else []) + [
            f"{s} (one line)" for s in same]  # fmt: skip
        note = "\n" + textwrap.fill("; ".join(notes), 34) if notes else ""
        ax.set_title(f"{model}, S={int(context) // 1024}k, {where}{note}", fontsize=5.2)
        if i % cols == 0:
            ax.set_ylabel("tokens/s per chip", fontsize=5.5)
        if i // cols == rows - 1:
            ax.set_xlabel("ms/token per sequence", fontsize=5.5)
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    order = {k: i for i, k in enumerate(("MHA", "GQA", "MQA", "MLA"))}
    labels = sorted(handles, key=lambda lab: (order.get(lab.split(",")[0], 9), lab))
    kernel = (
        ", ".join(sorted(set(df.attention_kernel.dropna()))) if "attention_kernel" in df else ""
    )
    fused = {"flash": "attention fused (flash-decoding)", "xla": "attention unfused (XLA)"}
    legend = fig.add_subplot(grid[rows, :])
    legend.axis("off")
    legend.legend([handles[k] for k in labels], labels, loc="center", ncol=4, fontsize=5,
                  frameon=False, title=f"{fused.get(kernel, kernel)}; each line ends where "
                  "memory ends (dot); dotted: the weights floor", title_fontsize=5)  # fmt: skip
