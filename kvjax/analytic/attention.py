"""Decode attention as the seed states it: the fused kernel's cost (the cache read once) and the
intensity QK^T + PV FLOPs over KV bytes. Pure Python; letters: `kvjax.kernels`."""

from __future__ import annotations

from kvjax import kernels
from kvjax.analytic.costs import KernelCost, Workload
from kvjax.analytic.step import _act_bytes, attention_cost
from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig


def fused_attention_cost(cfg: ModelConfig, wl: Workload) -> KernelCost:
    """Decode attention as one fused kernel (FlashAttention / FlashMLA style): the FLOPs of
    scores, softmax and av, moving only what such a kernel must: the cache it attends read once,
    the queries read and the outputs written (scores and probabilities stay on chip). The
    cache is K and V (2*K*H per position), MLA absorbed its latent and RoPE key (A + P), MLA
    naive the per-head keys and values kv_b_proj expanded (N*(U + W)) and the shared RoPE key.
    Its intensity tends to `attention_intensity` as S grows (tests check it)."""
    if wl.phase != "decode":
        raise KvjaxError("fused_attention_cost is the decode attention (phase='decode')")
    B, C, N = wl.batch, wl.context - 1, cfg.num_heads
    a, kv = _act_bytes(cfg), cfg.kv_bytes_per_element
    if cfg.is_mla and cfg.mla_decode == "absorbed":
        A, P = cfg.kv_lora_rank, cfg.qk_rope_head_dim
        cache, q, out = B * C * (A + P) * kv, B * N * (A + P) * a, B * N * A * a
    elif cfg.is_mla:  # naive: the expanded per-head keys (U) and values (W), the shared RoPE key
        H, U, W, P = cfg.head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.qk_rope_head_dim
        cache = B * C * (N * (U + W) * a + P * kv)
        q, out = B * N * H * a, B * N * W * a
    else:
        K, H = cfg.num_kv_heads, cfg.head_dim
        cache, q, out = 2 * B * C * K * H * kv, B * N * H * a, B * N * H * a
    unfused = attention_cost(cfg, wl)
    return KernelCost(
        kernels.ATTENTION, unfused.flops, cache + q + out, unfused.transcendentals, 0.0, cache
    )


def attention_intensity(cfg: ModelConfig) -> float:
    """The seed's decode attention intensity: (QK^T + PV FLOPs) / KV cache bytes read.

    Per cached position: 2*N*H FLOPs for the scores and 2*N*H for P.V, over K*H keys and K*H
    values of `kv` bytes: 4NH / (2KH * kv) = 2N / (K * kv), exactly N/K in a 2-byte cache, for
    any S and B (the kernels' own ratio tends to it as S grows; tests check both). MLA:
    `kvjax.analytic.mla.mla_attention_intensity`.
    """
    if cfg.is_mla:
        from kvjax.analytic.mla import mla_attention_intensity

        return mla_attention_intensity(cfg)
    return (
        4
        * cfg.num_heads
        * cfg.head_dim
        / (2 * cfg.num_kv_heads * cfg.head_dim * cfg.kv_bytes_per_element)
    )
