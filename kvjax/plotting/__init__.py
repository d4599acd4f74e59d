"""Figures from records only (never jax, never the model), a module per subject:

- `figures`: the figure names (`FIGURES`) and `make_figures`, PNG and PDF with fixed metadata
- `style`: what every figure shares: the palette keyed by num_kv_heads, device names, log ticks
- `roofline`: every kernel on a chip's roofline, closed form, traced and measured
- `compiled`: the roofline in three views, the third the executable compiled for an accelerator
- `measured`: kernels timed in situ against their bound; the decode step over KV bytes a token
- `kv_cache`: the KV cache against context, per variant, window and hybrid
- `decode`: ms per decode step and the decode intensity against batch
- `parallel`: the KV cache and decode floor per device against tensor parallelism
- `serving`: the serving frontier, tokens/s per chip against ms/token per sequence
- `goodput`: requests served within the SLO against the arrival rate
- `published`: the published measurements against kvjax's bounds and predictions
- `quality`: quality over num_kv_heads, and the helpers every quality figure shares
- `mla_quality`: MLA beside MHA/GQA/MQA at equal KV bytes
- `uptrain`: MHA converted to GQA or MLA and fine-tuned
- `explorer`: the offline interactive page, built from the presets
"""

from kvjax.plotting.explorer import write_explorer
from kvjax.plotting.figures import FIGURES, make_figures

__all__ = ["FIGURES", "make_figures", "write_explorer"]
