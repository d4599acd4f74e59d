"""Sizes in closed form: parameters, weight bytes, and the KV cache = 2 * L * K * H * S * B * bytes
(the 2 is K and V; MLA caches L * (A + P) * S * B * bytes; L counts attention layers only), beside
a hybrid's flat states (`kvjax.analytic.hybrid`). Pure Python; letters: kvjax.kernels."""

from __future__ import annotations

from kvjax.analytic.costs import SCORE_BYTES, Workload
from kvjax.analytic.hybrid import state_bytes
from kvjax.analytic.params import (  # noqa: F401 (re-exported: analytic's public names)
    layer_param_counts,
    mla_attention_param_counts,
    num_params,
    param_counts,
    weight_bytes,
)
from kvjax.analytic.primitives import _act_bytes
from kvjax.analytic.quant import exact, scale_bytes_per_token_per_layer, tensor_scale_bytes
from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig


def kv_elements_per_token_per_layer(cfg: ModelConfig) -> int:
    """2*K*H (a key and a value per kv head), or MLA's A + P (one latent and one shared RoPE
    key, whatever the number of heads)."""
    if cfg.is_mla:
        return cfg.kv_lora_rank + cfg.qk_rope_head_dim
    return 2 * cfg.num_kv_heads * cfg.head_dim


def kv_bytes_per_token_per_layer(cfg: ModelConfig) -> int:
    """The cached elements' bytes, and a 1-byte cache's per-token scales (`analytic.quant`)."""
    return exact(
        kv_elements_per_token_per_layer(cfg) * cfg.kv_bytes_per_element
        + scale_bytes_per_token_per_layer(cfg)
    )


def kv_bytes_per_token(cfg: ModelConfig) -> int:
    """Per token while every attention layer holds it (S <= sliding_window); past the window only
    the global layers' share grows: `kv_cache_bytes`. State layers (D, C) hold no KV."""
    return cfg.num_attention_layers * kv_bytes_per_token_per_layer(cfg)


def cache_bytes(cfg: ModelConfig, context: int, batch: int = 1, page_size: int = 0) -> int:
    """The whole cache of `batch` sequences: the KV cache at `context` and the state layers'
    recurrent states and conv caches (`hybrid.state_bytes`, flat in S)."""
    return kv_cache_bytes(cfg, context, batch, page_size) + state_bytes(cfg, batch)


def paged(positions: int, page_size: int = 0) -> int:
    """Positions a paged cache holds for `positions` tokens: whole pages of `page_size` (vLLM's
    blocks, 16 by default there), ceil(S / P) * P; the positions themselves when not paged (0)."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 0:
        raise KvjaxError(f"page_size={page_size!r} must be an integer >= 1 (or 0: not paged)")
    return -(-positions // page_size) * page_size if page_size else positions


def kv_positions_held(cfg: ModelConfig, context: int, page_size: int = 0) -> dict[str, int]:
    """Positions each kind of layer holds at context S: a global layer S, a sliding layer
    min(S, window + sink_tokens) (its rolling buffer), and their total over the layers; on pages of
    `page_size` each rounded up to whole pages (`paged`)."""
    sliding = cfg.num_sliding_layers
    span = cfg.sliding_window + cfg.sink_tokens  # the window and the kept first tokens
    per_sliding = paged(min(context, span), page_size) if sliding else 0
    per_global = paged(context, page_size)
    attending = cfg.num_attention_layers  # state layers (D, C) hold no positions
    return {
        "global_layers": attending - sliding,
        "sliding_layers": sliding,
        "global_positions": per_global,
        "sliding_positions": per_sliding,
        "total": (attending - sliding) * per_global + sliding * per_sliding,
    }


def kv_cache_bytes(cfg: ModelConfig, context: int, batch: int = 1, page_size: int = 0) -> int:
    """Sum over layers of the positions each holds (`kv_positions_held`, on pages of
    `page_size` if given) x bytes per position, and per-tensor scales (a K and a V scale per
    layer) where the cache has them."""
    per_position = kv_bytes_per_token_per_layer(cfg)
    held = kv_positions_held(cfg, context, page_size)["total"]
    return per_position * held * batch + tensor_scale_bytes(cfg)


def _context_for_bytes(cfg: ModelConfig, budget: float, batch: int, page_size: int = 0):
    """Largest S whose cache (KV and the state layers' flat states) for `batch` sequences is at
    most `budget` bytes (None: any S, when no layer's cache grows past its window and the full
    windows fit; -1: the states alone exceed it); on pages, a whole number of pages."""
    budget -= state_bytes(cfg, batch)
    if budget < 0:
        return -1
    per = kv_bytes_per_token_per_layer(cfg) * batch
    rows = budget // per  # layer-positions affordable
    L, sliding = cfg.num_attention_layers, cfg.num_sliding_layers
    if not L:  # no attention layer: the cache is the states alone
        return None
    W = paged(cfg.sliding_window + cfg.sink_tokens, page_size) if sliding else 0
    if not sliding or rows < L * W:  # still inside the window: every layer holds every position
        fits = int(rows // L)
    elif sliding == L:
        return None
    else:
        fits = int((rows - sliding * W) // (L - sliding))
    return fits // page_size * page_size if page_size else fits


def kv_exceeds_weights_at_context(cfg: ModelConfig, batch: int = 1) -> int | None:
    """Smallest context S at which the cache of `batch` sequences (KV, and a hybrid's states:
    `cache_bytes`) is larger than the weights (None: never, a model whose every layer is sliding
    or keeps a state and whose windows and states stay smaller; 0: the states alone are)."""
    fits = _context_for_bytes(cfg, weight_bytes(cfg), batch)
    return None if fits is None else fits + 1


def cache_equals_at_context(cfg: ModelConfig, other: ModelConfig, batch: int = 1) -> float | None:
    """The context S at which `cfg`'s whole cache (states + KV) equals `other`'s (both growing
    linearly in S: no sliding layers), solved exactly: (state - state') / (kv' - kv) per token;
    None when they never meet at S > 0."""
    if cfg.num_sliding_layers or other.num_sliding_layers:
        raise KvjaxError("cache_equals_at_context: sliding-window layers are not linear in S")
    per, per_other = kv_bytes_per_token(cfg), kv_bytes_per_token(other)
    flat = state_bytes(cfg) + tensor_scale_bytes(cfg)
    flat_other = state_bytes(other) + tensor_scale_bytes(other)
    if per == per_other or (flat - flat_other) / (per_other - per) <= 0:
        return None
    return (flat - flat_other) / (per_other - per)


def max_batch_that_fits(
    cfg: ModelConfig, memory_bytes: float, context: int, page_size: int = 0
) -> int:
    """Largest B whose cache at `context` (KV on pages of `page_size` if given, and a hybrid's
    states) fits beside the weights (activations not counted)."""
    free = memory_bytes - weight_bytes(cfg)
    return max(0, int(free // cache_bytes(cfg, context, 1, page_size)))


def max_context_that_fits(
    cfg: ModelConfig, memory_bytes: float, batch: int, page_size: int = 0
) -> int | None:
    """Longest S whose KV cache for `batch` sequences fits beside the weights (None: any S, when
    every layer is sliding and `batch` full windows fit); on pages, a whole number of them."""
    free = memory_bytes - weight_bytes(cfg)
    if free < 0:
        return 0
    fits = _context_for_bytes(cfg, free, batch, page_size)
    return None if fits is None else max(0, fits)


def activation_bytes(cfg: ModelConfig, wl: Workload) -> int:
    """The decode (or prefill) step's live activations, as the model runs one layer at a time:
    the residual stream in and out (2 x B*T x D) and the largest intermediate: a layer's scores
    (f32) with its probabilities (unfused attention; a fused kernel keeps them on chip), its
    MLP's gate/up output, or the f32 logits."""
    M, D, a = wl.tokens, cfg.d_model, _act_bytes(cfg)
    S, N = wl.context, cfg.num_heads
    scores = 0 if cfg.attention_kernel == "flash" else M * N * S * (SCORE_BYTES + a)
    F = max(cfg.d_ff, cfg.moe_d_ff * cfg.experts_per_token + cfg.shared_d_ff)
    mlp = M * (2 if cfg.gated_mlp else 1) * F * a
    logits = M * cfg.vocab_size * SCORE_BYTES
    return 2 * M * D * a + max(scores, mlp, logits)
