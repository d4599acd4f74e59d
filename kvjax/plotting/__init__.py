"""Figures from records only (never jax, never the model): one seaborn theme, a palette keyed by
num_kv_heads, PNG and PDF with fixed metadata so regenerating gives identical files; and the
offline explorer page (`explorer`), built from the presets."""

from kvjax.plotting.explorer import write_explorer
from kvjax.plotting.figures import FIGURES, make_figures

__all__ = ["FIGURES", "make_figures", "write_explorer"]
