"""One palette for every figure: a colour per num_kv_heads, ordered by value."""

from __future__ import annotations

import seaborn as sns


def kv_palette(values) -> dict[int, tuple]:
    """One colour per num_kv_heads, the same in every figure (ordered by value)."""
    keys = sorted({int(v) for v in values})
    colors = sns.color_palette("viridis", n_colors=max(len(keys), 2))
    return {k: colors[i] for i, k in enumerate(keys)}
