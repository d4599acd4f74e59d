"""Sizes in closed form: parameters, weight bytes, and the KV cache = 2 * L * K * H * S * B * bytes
(the 2 is K and V; MLA caches L * (A + P) * S * B * bytes). Pure Python; letters: kvjax.kernels."""

from __future__ import annotations

from kvjax import kernels
from kvjax.analytic.quant import exact, scale_bytes_per_token_per_layer, tensor_scale_bytes
from kvjax.config import ModelConfig


def mla_attention_param_counts(cfg: ModelConfig) -> dict[str, int]:
    """MLA's attention parameters of one layer (Hugging Face DeepseekV3Attention, no biases):
    q path D*N*H (or D*Q + Q + Q*N*H through the low rank), W_kva D*(A+P), its norm A,
    W_kvb A*N*(U+W) (split here into the key part, read by q_absorb, and the value part), o N*W*D.
    """
    D, N, H, A, P = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    U, W, Q = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.q_lora_rank
    q = (
        {kernels.Q_A_PROJ: D * Q, kernels.NORM_Q_A: Q, kernels.Q_B_PROJ: Q * N * H}
        if Q
        else {kernels.Q_PROJ: D * N * H}
    )
    return {
        **q,
        kernels.KV_A_PROJ: D * (A + P),
        kernels.NORM_KV_A: A,
        kernels.Q_ABSORB: N * U * A,  # W_uk (the key half of kv_b_proj)
        kernels.V_UP: N * W * A,  # W_uv (the value half)
        kernels.O_PROJ: N * W * D,
    }


def layer_param_counts(cfg: ModelConfig, moe: bool = False) -> dict[str, int]:
    """Parameters of one decoder layer, by component; `moe`: an MoE layer of the config (its
    router, experts and shared experts: `kvjax.analytic.moe`) instead of the dense MLP."""
    D, N, K, H, F = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_ff
    bias_q, bias_kv = (N * H, K * H) if cfg.qkv_bias else (0, 0)
    if cfg.is_mla:
        attn = mla_attention_param_counts(cfg)
    else:
        attn = {
            kernels.Q_PROJ: D * N * H + bias_q,
            kernels.K_PROJ: D * K * H + bias_kv,
            kernels.V_PROJ: D * K * H + bias_kv,
            kernels.O_PROJ: N * H * D,
        }
    if cfg.qk_norm:
        attn[kernels.QK_NORM] = 2 * H
    sandwich = {kernels.NORM_POST_ATTN: D, kernels.NORM_POST_MLP: D} if cfg.sandwich_norms else {}
    if moe:
        from kvjax.analytic.moe import moe_layer_param_counts

        mlp = moe_layer_param_counts(cfg)
    else:
        mlp = {
            kernels.GATE_UP if cfg.gated_mlp else kernels.UP: (2 if cfg.gated_mlp else 1) * D * F,
            kernels.DOWN: F * D,
        }
    return {**attn, **mlp, kernels.NORM_ATTN: D, kernels.NORM_MLP: D, **sandwich}


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Exact parameter count by component (summed over layers) and `total`."""
    counts = {kernels.EMBED: cfg.vocab_size * cfg.d_model}
    moe = cfg.num_moe_layers
    for layers, kind in ((cfg.num_layers - moe, False), (moe, True)):
        for name, n in (layer_param_counts(cfg, kind) if layers else {}).items():
            counts[name] = counts.get(name, 0) + n * layers
    counts[kernels.NORM_FINAL] = cfg.d_model
    counts[kernels.LM_HEAD] = 0 if cfg.tied_embeddings else cfg.vocab_size * cfg.d_model
    counts["total"] = sum(counts.values())
    return counts


def num_params(cfg: ModelConfig) -> int:
    return param_counts(cfg)["total"]


def weight_bytes(cfg: ModelConfig) -> int:
    """Parameters x the weight dtype's bytes (DeepSeek-V3's router biases in f32)."""
    from kvjax.analytic.moe import bias_extra_bytes

    return num_params(cfg) * cfg.weight_bytes_per_element + bias_extra_bytes(cfg)


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
    """Per token while every layer holds it (S <= sliding_window); past the window only the global
    layers' share grows: `kv_cache_bytes`."""
    return cfg.num_layers * kv_bytes_per_token_per_layer(cfg)


def kv_positions_held(cfg: ModelConfig, context: int) -> dict[str, int]:
    """Positions each kind of layer holds at context S: a global layer S, a sliding layer
    min(S, window) (its rolling buffer), and their total over the layers."""
    sliding = cfg.num_sliding_layers
    per_sliding = min(context, cfg.sliding_window) if sliding else 0
    return {
        "global_layers": cfg.num_layers - sliding,
        "sliding_layers": sliding,
        "global_positions": context,
        "sliding_positions": per_sliding,
        "total": (cfg.num_layers - sliding) * context + sliding * per_sliding,
    }


def kv_cache_bytes(cfg: ModelConfig, context: int, batch: int = 1) -> int:
    """Sum over layers of the positions each holds (`kv_positions_held`) x bytes per position, and
    per-tensor scales (a K and a V scale per layer) where the cache has them."""
    per_position = kv_bytes_per_token_per_layer(cfg)
    return per_position * kv_positions_held(cfg, context)["total"] * batch + tensor_scale_bytes(cfg)


def _context_for_bytes(cfg: ModelConfig, budget: float, batch: int) -> int | None:
    """Largest S whose cache for `batch` sequences is at most `budget` bytes (None: any S, when
    every layer is sliding and the full windows fit)."""
    per = kv_bytes_per_token_per_layer(cfg) * batch
    rows = budget // per  # layer-positions affordable
    L, sliding, W = cfg.num_layers, cfg.num_sliding_layers, cfg.sliding_window
    if not sliding or rows < L * W:  # still inside the window: every layer holds every position
        return int(rows // L)
    if sliding == L:
        return None
    return int((rows - sliding * W) // (L - sliding))


def kv_exceeds_weights_at_context(cfg: ModelConfig, batch: int = 1) -> int | None:
    """Smallest context S at which the KV cache of `batch` sequences is larger than the weights
    (None: never, a model whose every layer is sliding and whose windows stay smaller)."""
    fits = _context_for_bytes(cfg, weight_bytes(cfg), batch)
    return None if fits is None else fits + 1


def max_batch_that_fits(cfg: ModelConfig, memory_bytes: float, context: int) -> int:
    """Largest B whose KV cache at `context` fits beside the weights (activations not counted)."""
    free = memory_bytes - weight_bytes(cfg)
    return max(0, int(free // kv_cache_bytes(cfg, context, 1)))


def max_context_that_fits(cfg: ModelConfig, memory_bytes: float, batch: int) -> int | None:
    """Longest S whose KV cache for `batch` sequences fits beside the weights (None: any S, when
    every layer is sliding and `batch` full windows fit)."""
    free = memory_bytes - weight_bytes(cfg)
    if free < 0:
        return 0
    return _context_for_bytes(cfg, free, batch)
