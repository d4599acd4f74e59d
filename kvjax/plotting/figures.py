"""The paper figures by name (`FIGURES`: the experiment whose records each draws, its drawing
function and its size) and `make_figures`, which writes each whose records exist as PNG and PDF
with fixed metadata, so regenerating from the same records gives identical files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from kvjax.plotting import quality  # noqa: E402
from kvjax.plotting.compiled import roofline_compiled  # noqa: E402
from kvjax.plotting.decode import decode_intensity, decode_latency  # noqa: E402
from kvjax.plotting.goodput import goodput  # noqa: E402
from kvjax.plotting.kv_cache import kv_vs_context  # noqa: E402
from kvjax.plotting.measured import hkv_ablation, kernel_bound  # noqa: E402
from kvjax.plotting.mla_quality import mla_quality  # noqa: E402
from kvjax.plotting.parallel import tensor_parallel  # noqa: E402
from kvjax.plotting.published import (  # noqa: E402
    published_residuals,
    published_roofline,
    published_systems,
)
from kvjax.plotting.roofline import roofline  # noqa: E402
from kvjax.plotting.serving import serving_frontier  # noqa: E402
from kvjax.plotting.uptrain import gqa_uptrain, mla_uptrain  # noqa: E402

COLUMN_WIDTH_IN = 3.5  # one column of a two-column paper
# Fixed metadata: no dates or versions in the files, so reruns are byte-identical.
PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}


def theme() -> None:
    sns.set_theme(context="paper", style="whitegrid", font_scale=0.9)
    plt.rcParams.update({"svg.hashsalt": "kvjax", "pdf.fonttype": 42})


FIGURES: dict[str, tuple[str, Callable, tuple[float, float]]] = {
    "roofline": ("roofline", roofline, (2 * COLUMN_WIDTH_IN, 2.8)),
    "roofline_compiled": ("roofline", roofline_compiled, (2 * COLUMN_WIDTH_IN, 5.0)),
    "kv_vs_context": ("kv_vs_context", kv_vs_context, (2 * COLUMN_WIDTH_IN, 2.6)),
    "decode_latency": ("decode_latency", decode_latency, (2 * COLUMN_WIDTH_IN, 2.6)),
    "decode_intensity": ("decode_latency", decode_intensity, (COLUMN_WIDTH_IN, 2.6)),
    "hkv_ablation": ("hkv_ablation", hkv_ablation, (COLUMN_WIDTH_IN, 2.6)),
    "hkv_quality": ("hkv_quality", quality.hkv_quality, (2 * COLUMN_WIDTH_IN, 2.6)),
    "kv_pareto": ("hkv_quality", quality.kv_pareto, (COLUMN_WIDTH_IN, 2.8)),
    "mla_quality": ("hkv_quality", mla_quality, (2 * COLUMN_WIDTH_IN, 2.6)),
    "gqa_uptrain": ("gqa_uptrain", gqa_uptrain, (3 * COLUMN_WIDTH_IN, 2.4)),
    "mla_uptrain": ("gqa_uptrain", mla_uptrain, (3 * COLUMN_WIDTH_IN, 2.4)),
    "tensor_parallel": ("tensor_parallel", tensor_parallel, (2 * COLUMN_WIDTH_IN, 2.8)),
    "kernel_bound": ("profile", kernel_bound, (2 * COLUMN_WIDTH_IN, 2.8)),
    "serving_frontier": ("serving_frontier", serving_frontier, (2 * COLUMN_WIDTH_IN, 4.4)),
    "goodput": ("serving_goodput", goodput, (2 * COLUMN_WIDTH_IN, 3.2)),
    "published_roofline": ("published_roofline", published_roofline, (5 * COLUMN_WIDTH_IN, 3.2)),
    "published_residuals": (
        "published_roofline",
        published_residuals,
        (5.2 * COLUMN_WIDTH_IN, 4.2),
    ),
    "published_systems": ("published_roofline", published_systems, (3 * COLUMN_WIDTH_IN, 2.8)),
}


def make_figures(records: pd.DataFrame, out: str | Path) -> list[Path]:
    """Every figure whose records exist, as PNG and PDF in `out`."""
    theme()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (experiment, draw, size) in FIGURES.items():
        if records.empty or experiment not in set(records.experiment):
            continue
        fig = plt.figure(figsize=size, dpi=200)
        if draw(records, fig) is False:  # its experiment ran, but not the records it draws
            plt.close(fig)
            continue
        fig.tight_layout()
        for ext, meta in (("png", PNG_METADATA), ("pdf", PDF_METADATA)):
            path = out / f"{name}.{ext}"
            fig.savefig(path, metadata=meta)
            written.append(path)
        plt.close(fig)
    return written
