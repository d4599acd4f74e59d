"""The paper figures, each a function of a records DataFrame."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

COLUMN_WIDTH_IN = 3.5  # one column of a two-column paper
GIB = 2**30
# Fixed metadata: no dates or versions in the files, so reruns are byte-identical.
PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}


def theme() -> None:
    sns.set_theme(context="paper", style="whitegrid", font_scale=0.9)
    plt.rcParams.update({"svg.hashsalt": "kvjax", "pdf.fonttype": 42})


def kv_palette(values) -> dict[int, tuple]:
    """One colour per num_kv_heads, the same in every figure (ordered by value)."""
    keys = sorted({int(v) for v in values})
    colors = sns.color_palette("viridis", n_colors=max(len(keys), 2))
    return {k: colors[i] for i, k in enumerate(keys)}


def kv_vs_context(records: pd.DataFrame, ax) -> None:
    """KV cache vs context per variant, with each variant's weights as a dashed line."""
    df = records[records.experiment == "kv_vs_context"]
    model = df.model.iloc[0]
    df = df[df.model == model]
    palette = kv_palette(df.num_kv_heads)
    for (variant, k), g in df.groupby(["variant", "num_kv_heads"], sort=False):
        g = g.sort_values("context")
        color = palette[int(k)]
        ax.plot(
            g.context,
            g.kv_cache_bytes / GIB,
            marker="o",
            ms=3,
            color=color,
            label=f"{variant} (h_kv={k})",
        )
        ax.axhline(g.weight_bytes.iloc[0] / GIB, color=color, ls="--", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context S (tokens)")
    ax.set_ylabel("KV cache (GiB, binary)")
    batch = int(df.batch.iloc[0])
    ax.set_title(f"{model}, B={batch}: KV cache vs weights (dashed)", fontsize=8)
    ax.plot([], [], color="0.4", ls="--", lw=0.8, label="weights (same colour)")
    ax.legend(fontsize=6, frameon=True)


FIGURES: dict[str, tuple[str, Callable]] = {
    "kv_vs_context": ("kv_vs_context", kv_vs_context),
}


def make_figures(records: pd.DataFrame, out: str | Path) -> list[Path]:
    """Every figure whose records exist, as PNG and PDF in `out`."""
    theme()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (experiment, draw) in FIGURES.items():
        if records.empty or experiment not in set(records.experiment):
            continue
        fig, ax = plt.subplots(figsize=(COLUMN_WIDTH_IN, 2.6), dpi=200)
        draw(records, ax)
        fig.tight_layout()
        for ext, meta in (("png", PNG_METADATA), ("pdf", PDF_METADATA)):
            path = out / f"{name}.{ext}"
            fig.savefig(path, metadata=meta)
            written.append(path)
        plt.close(fig)
    return written
