"""The serving frontier figure: tokens/s per chip against ms/token per sequence, one line per
attention variant and KV dtype, each ending (a dot) where memory ends; a panel per model,
context and chip (records of `experiments/serving_frontier.py`)."""

from __future__ import annotations

import pandas as pd
import seaborn as sns

from kvjax.plotting.style import MLA_COLOR, caption_below, log_ticks

DTYPE_STYLE = {"bf16": "-", "f16": "-", "f32": "-", "fp8": "--", "int8": ":", "int4": "-."}


def _variant_colors() -> dict[str, tuple]:
    mha, gqa, mqa = sns.color_palette("viridis", n_colors=3)[::-1]
    return {"MHA": mha, "GQA": gqa, "MQA": mqa, "MLA": MLA_COLOR}


def _kind(variant: str) -> str:
    return "MLA" if str(variant).startswith("MLA") else str(variant).split()[0]


WIDTH = {"MHA": 1.6, "GQA": 1.3, "MQA": 0.8, "MLA": 0.8}  # a line under an equal one shows


def _panel(ax, g: pd.DataFrame, colors) -> list[tuple[str, str]]:
    """One (model, context, chip): its lines; returns its notes as (kind, what): lines with no
    point (nothing fits, or not modelled), lines of one point (a dot only: one batch fits), and
    lines that coincide (on tp chips GQA-tp and MQA hold one KV head each)."""
    notes, drawn = [], {}
    for (variant, kv), line in g.groupby(["variant", "kv_dtype"], sort=False):
        note = " ".join(str(n) for n in line.get("note", pd.Series(dtype=str)).dropna())
        line = line[line.batch > 0].sort_values("batch")
        name = f"{_kind(variant)} {kv}"
        if line.empty:
            notes.append((NOT_MODELLED if "not modelled" in note else NO_LINE, name))
            continue
        if len(line) == 1:
            notes.append((ONE_POINT, name))
        key = (kv, tuple(line.batch), tuple(line.ms_per_token.round(9)))
        drawn.setdefault(key, []).append(_kind(variant))
        style = {
            "color": colors.get(_kind(variant), "0.4"),
            "lw": WIDTH.get(_kind(variant), 0.9),
            "ls": DTYPE_STYLE.get(kv, "-"),
        }
        ax.plot(line.ms_per_token, line.tokens_per_s, label=f"{_kind(variant)}, {kv} KV", **style)
        end = line.iloc[-1]
        ax.plot([end.ms_per_token], [end.tokens_per_s], "o", ms=2.5, color=style["color"])
    ax.axvline(g.weights_floor_ms_per_token.min(), color="0.6", lw=0.6, ls=":", label=WEIGHTS_FLOOR)
    ax.set_xscale("log")
    ax.set_yscale("log")
    log_ticks(ax.xaxis)
    log_ticks(ax.yaxis)
    ax.tick_params(labelsize=5)
    for (kv, *_), kinds in drawn.items():
        if len(kinds) > 1:
            notes.append((SAME, f"{' = '.join(kinds)} {kv}"))
    return notes


NO_LINE = "no line (nothing fits)"
NOT_MODELLED = "no line (not modelled: the record says why)"
ONE_POINT = "a dot only (one batch fits)"
SAME = "one line for two (equal)"
WEIGHTS_FLOOR = "weights floor (B -> inf)"


def serving_frontier(records: pd.DataFrame, fig) -> bool | None:
    """A panel per (model, tp, context, chip, ep, dp_attention), lettered; one key below them all
    whose caption says, by panel letter, which lines are missing, a dot or drawn once for two."""
    df = records[records.experiment == "serving_frontier"]
    df = df.assign(
        **{k: df[k].fillna(1).astype(int) if k in df else 1 for k in ("tp", "ep", "dp_attention")}
    )
    panels = list(
        dict.fromkeys(
            zip(df.model, df.tp, df.context, df.chip, df.ep, df.dp_attention, strict=True)
        )
    )
    if not panels:
        return False
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig.set_size_inches(1.9 * cols, 1.75 * rows + 1.3)
    grid = fig.add_gridspec(rows + 1, cols, height_ratios=[1.0] * rows + [0.66])
    colors = _variant_colors()
    handles: dict[str, object] = {}
    where_notes: dict[tuple[str, str], list[str]] = {}
    for i, (model, tp, context, chip, ep, dpa) in enumerate(panels):
        ax = fig.add_subplot(grid[i // cols, i % cols])
        g = df[
            (df.model == model)
            & (df.tp == tp)
            & (df.context == context)
            & (df.chip == chip)
            & (df.ep == ep)
            & (df.dp_attention == dpa)
        ]
        letter = f"({chr(ord('a') + i)})"
        for note in _panel(ax, g, colors):  # the notes in the caption, by panel letter
            where_notes.setdefault(note, []).append(letter)
        split = " x ".join(f"{n}{v}" for n, v in (("dp", dpa), ("tp", tp), ("ep", ep)) if v > 1)
        where = (
            f"{chip}"
            if tp * dpa == 1
            else f"{tp * dpa} x {chip}, " + ("per chip" if dpa == 1 else split)
        )
        ax.set_title(f"{letter} {model}, S={int(context) // 1024}k, {where}", fontsize=5.5)
        if i % cols == 0:
            ax.set_ylabel("tokens/s per chip", fontsize=5.5)
        if i // cols == rows - 1:
            ax.set_xlabel("ms/token per sequence", fontsize=5.5)
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    _key(fig.add_subplot(grid[rows, :]), df, handles, where_notes)


def _key(legend, df: pd.DataFrame, handles: dict, where_notes: dict) -> None:
    """The key row: every line's style once, then the notes of all panels by letter."""
    order = {k: i for i, k in enumerate(("MHA", "GQA", "MQA", "MLA"))}
    labels = sorted(handles, key=lambda lab: (order.get(lab.split(",")[0], 9), lab))
    kernel = (
        ", ".join(sorted(set(df.attention_kernel.dropna()))) if "attention_kernel" in df else ""
    )
    fused = {"flash": "attention fused (flash-decoding)", "xla": "attention unfused (XLA)"}
    legend.axis("off")
    legend.legend(
        [handles[k] for k in labels],
        labels,
        loc="upper center",
        ncol=5,
        fontsize=5.5,
        frameon=False,
        title=f"{fused.get(kernel, kernel)}, closed form on each chip; each line ends where "
        "memory ends (dot)",
        title_fontsize=5.5,
    )
    lines = []
    for kind in (NOT_MODELLED, NO_LINE, ONE_POINT, SAME):
        items = [
            f"{what} {' '.join(letters)}" for (k, what), letters in where_notes.items() if k == kind
        ]
        if items:
            lines.append(f"{kind}: " + "; ".join(items))
    caption_below(legend, lines, 5.5)


def mark_unheld(ax, g: pd.DataFrame, chip: str) -> None:
    """Points whose weights and cache one chip cannot hold get an x; the panel names each model
    that does not fit even at B = 1, with the bytes it needs and the chip's."""
    if "fits" not in g or g.fits.isna().all() or g.fits.astype(bool).all():
        return
    out = g[~g.fits.astype(bool)]
    ax.scatter(
        out.batch,
        out.step_floor_s * 1e3,
        marker="x",
        s=10,
        lw=0.6,
        color="0.2",
        zorder=5,
        label=None,
    )
    first = g.sort_values("batch").groupby(["model", "num_kv_heads"]).first()
    unheld = first[~first.fits.astype(bool)]
    chip_bytes = float(g.chip_memory_bytes.iloc[0])
    moe = dict(zip(g.model, g.moe, strict=False))
    lines = [
        f"  {m}{'' if moe[m] else f' h_kv={int(k)}'}: {r.memory_needed_bytes / 1e9:,.0f} GB"
        for (m, k), r in unheld.iterrows()
    ]
    text = f"x: weights + KV do not fit one {chip} ({chip_bytes / 1e9:,.0f} GB)" + (
        "\nnot even at B=1:\n" + "\n".join(lines) if lines else ""
    )
    ax.text(
        0.02,
        0.98,
        text,
        transform=ax.transAxes,
        fontsize=5,
        va="top",
        ha="left",
        bbox=dict(boxstyle="round", fc="white", ec="0.7", lw=0.5),
    )
