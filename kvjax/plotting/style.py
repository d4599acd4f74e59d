"""One palette for every figure: a colour per num_kv_heads, ordered by value; MLA its own."""

from __future__ import annotations

import seaborn as sns


def kv_palette(values) -> dict[int, tuple]:
    """One colour per num_kv_heads, the same in every figure (ordered by value)."""
    keys = sorted({int(v) for v in values})
    colors = sns.color_palette("viridis", n_colors=max(len(keys), 2))
    return {k: colors[i] for i, k in enumerate(keys)}


MLA_COLOR = "#c44e52"  # multi-head latent attention, outside the h_kv scale


def variant_color(variant: str, num_kv_heads: int, palette: dict[int, tuple]):
    """MLA rows in their own colour (their head count is not a cache size), the rest by h_kv."""
    return MLA_COLOR if str(variant).startswith("MLA") else palette[int(num_kv_heads)]
