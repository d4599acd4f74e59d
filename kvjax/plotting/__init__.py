"""Figures from records only (never jax, never the model): one seaborn theme, a palette keyed by
num_kv_heads, PNG and PDF with fixed metadata so regenerating gives identical files."""

from kvjax.plotting.figures import FIGURES, make_figures

__all__ = ["FIGURES", "make_figures"]
