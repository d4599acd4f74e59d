"""The attention layer of MHA/GQA/MQA: one layer's q, k, v and o projections (biases, q/k norms,
partial RoPE, Llama 4's L2 norm and temperature), q shaped [B, T, K, G, H] with the group axis
explicit (gemma, penzai). The attention between them is `kvjax.nn.attend`'s."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kvjax import kernels
from kvjax.model.config import ModelConfig
from kvjax.nn import flash
from kvjax.nn.attend import attend_cache, attend_causal, attend_extend
from kvjax.nn.layers import (
    RMSNorm,
    apply_rope,
    layer_rope_tables,
    linear,
    param,
    read,
    rope_tables,
    weight_dtype,
)
from kvjax.nn.sharding import DATA, GRP, KV, constrain


class Attention(nnx.Module):
    """The projections of one layer; the attention itself is `attend_causal` / `attend_cache`."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, *, rngs: nnx.Rngs):
        self.cfg = cfg
        if cfg.attention_kernel == "flash":
            flash.check_supported(cfg)
        # (base, linear factor or long-context frequencies): Gemma 3's local layers differ
        self.rope = layer_rope_tables(
            cfg, cfg.layer_rope(layer), cfg.layer_is_sliding(layer), cfg.rope_width
        )
        self.use_rope = cfg.layer_has_rope(layer)  # False: a NoPE layer (SmolLM3)
        self.chunked = cfg.layer_is_chunked(layer)  # Llama 4's chunked local layers
        D, N, K, H = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # Weights stored 2-D, (out, in): q (N*H, D), k and v (K*H, D), o (D, N*H).
        # Qwen3-Next (attn_output_gate): each head's H query rows then its H gate rows
        self.q_proj = param(rngs, ((2 if cfg.attn_output_gate else 1) * N * H, D), D, cfg)
        self.k_proj = param(rngs, (K * H, D), D, cfg)
        self.v_proj = param(rngs, (K * H, D), D, cfg)
        self.o_proj = param(rngs, (D, N * H), N * H, cfg)
        if cfg.sink_logits:  # gpt-oss: one learned logit per query head (n = k * G + g)
            self.sink_logits = nnx.Param(jnp.zeros((N,), weight_dtype(cfg)))
        if cfg.qkv_bias:
            self.q_bias = nnx.Param(jnp.zeros((N * H,), weight_dtype(cfg)))
            self.k_bias = nnx.Param(jnp.zeros((K * H,), weight_dtype(cfg)))
            self.v_bias = nnx.Param(jnp.zeros((K * H,), weight_dtype(cfg)))
        if cfg.o_bias:
            self.o_bias = nnx.Param(jnp.zeros((D,), weight_dtype(cfg)))
        if cfg.qk_norm:  # Qwen3, Gemma 3: one RMSNorm over head_dim shared by the heads
            self.q_norm = RMSNorm(cfg, N * H if cfg.qk_norm_full else H)  # OLMo 2: all heads
            self.k_norm = RMSNorm(cfg, K * H if cfg.qk_norm_full else H)

    def project(self, x_BTD: jax.Array, positions_BT: jax.Array):
        """q [B, T, K, G, H] (RoPE applied), k [B, T, K, H] (RoPE applied), v [B, T, K, H]; with
        `attn_output_gate` (Qwen3-Next) also the output gate [B, T, N*H]."""
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        K, G, H = cfg.num_kv_heads, cfg.group_size, cfg.head_dim
        with jax.named_scope(kernels.Q_PROJ):
            q_BTE = linear(x_BTD, read(self.q_proj, cfg))
            if cfg.qkv_bias:
                q_BTE = q_BTE + read(self.q_bias, cfg)
        with jax.named_scope(kernels.K_PROJ):
            k_BTE = linear(x_BTD, read(self.k_proj, cfg))
            if cfg.qkv_bias:
                k_BTE = k_BTE + read(self.k_bias, cfg)
        with jax.named_scope(kernels.V_PROJ):
            v_BTE = linear(x_BTD, read(self.v_proj, cfg))
            if cfg.qkv_bias:
                v_BTE = v_BTE + read(self.v_bias, cfg)
        gate_BTE = None
        if cfg.attn_output_gate:  # per head [q; gate] (HF's view(..., N, 2H).chunk(2))
            q_BTNI = q_BTE.reshape(B, T, cfg.num_heads, 2 * H)
            q_BTE = q_BTNI[..., :H].reshape(B, T, cfg.q_dim)
            gate_BTE = q_BTNI[..., H:].reshape(B, T, cfg.q_dim)
        if cfg.qk_norm_full:  # OLMo 2: the projections normed whole, before the heads split
            with jax.named_scope(kernels.QK_NORM):
                q_BTE, k_BTE = self.q_norm(q_BTE), self.k_norm(k_BTE)
        # Query head n = k * G + g uses kv head k (Hugging Face's repeat_kv order).
        q_BTKGH = q_BTE.reshape(B, T, K, G, H)
        k_BTKH = k_BTE.reshape(B, T, K, H)
        if cfg.qk_norm and not cfg.qk_norm_full:
            with jax.named_scope(kernels.QK_NORM):
                q_BTKGH = self.q_norm(q_BTKGH)
                k_BTKH = self.k_norm(k_BTKH)
        if self.use_rope:
            R = cfg.rope_width  # partial rotary (Phi-3, StableLM, GLM): the first R dims only
            with jax.named_scope(kernels.ROPE):
                cos, sin = rope_tables(positions_BT, R, **self.rope)
                if R == H:
                    q_BTKGH = apply_rope(q_BTKGH, cos, sin)
                    k_BTKH = apply_rope(k_BTKH, cos, sin)
                else:
                    q_BTKGH = jnp.concatenate(
                        [apply_rope(q_BTKGH[..., :R], cos, sin), q_BTKGH[..., R:]], axis=-1
                    )
                    k_BTKH = jnp.concatenate(
                        [apply_rope(k_BTKH[..., :R], cos, sin), k_BTKH[..., R:]], axis=-1
                    )
        if cfg.qk_l2_norm and self.use_rope:  # Llama 4: after RoPE, no scale
            with jax.named_scope(kernels.QK_NORM):
                q_BTKGH, k_BTKH = l2_norm(q_BTKGH, cfg.norm_eps), l2_norm(k_BTKH, cfg.norm_eps)
        if cfg.temperature_floor and not self.use_rope:  # Llama 4's NoPE layers
            with jax.named_scope(kernels.TEMPERATURE):
                q_BTKGH = temperature(q_BTKGH, positions_BT, cfg)
        proj = (
            constrain(q_BTKGH, DATA, None, KV, GRP, None),
            constrain(k_BTKH, DATA, None, KV, None),
            constrain(v_BTE.reshape(B, T, K, H), DATA, None, KV, None),
        )
        return proj if gate_BTE is None else (*proj, gate_BTE)

    # -- the protocol `kvjax.nn.transformer.Block` drives (shared with `LatentAttention`) --------
    def cache_rows(self, proj) -> tuple[jax.Array, jax.Array]:
        """What a position leaves in the cache: (k [B, T, K, H], v [B, T, K, H])."""
        return proj[1], proj[2]

    def causal(self, proj, window: int = 0, cached=None) -> jax.Array:
        cfg = self.cfg
        if cfg.attention_kernel == "flash" and cached is None:
            return flash.flash_causal(*proj[:3], window=window, scale=cfg.attn_scale)
        return attend_causal(
            *proj[:3],
            window=window,
            scale=cfg.attn_scale,
            softcap=cfg.attn_softcap,
            cached=cached,
            sinks=cfg.sink_tokens if window else 0,
            sink_logits_KG=self._sink_logits(),
            chunked=self.chunked,
        )

    def _sink_logits(self):
        """gpt-oss's per-head sink logits as [K, G] in their stored dtype (None without them):
        widened to f32 inside the softmax's scope, where their cost belongs."""
        if not self.cfg.sink_logits:
            return None
        return self.sink_logits[...].reshape(self.cfg.num_kv_heads, -1)

    def over_cache(self, proj, cache_arrays, pos_B: jax.Array, window: int = 0) -> jax.Array:
        q_BTKGH, k_BTKH, v_BTKH = proj[:3]
        k_cache_BKHS, v_cache_BKSH, k_scale, v_scale = cache_arrays
        cfg = self.cfg
        # each sequence's one new position (q, k, v) over its cache, as both kernels take them
        one = (q_BTKGH[:, 0], k_BTKH[:, 0], v_BTKH[:, 0], k_cache_BKHS, v_cache_BKSH, pos_B, window)
        if cfg.attention_kernel == "flash":
            o_BKGH = flash.flash_decode(*one, cfg.attn_scale, cfg.attn_softcap)
            return o_BKGH[:, None]
        sinks = cfg.sink_tokens if window else 0
        o_BKGH = attend_cache(
            *one,
            k_scale,
            v_scale,
            cfg.attn_scale,
            cfg.attn_softcap,
            sinks,
            self._sink_logits(),
            self.chunked,
        )
        return o_BKGH[:, None]

    def over_written_cache(self, proj, cache_arrays, pos_B: jax.Array) -> jax.Array:
        """Extend: the T new queries over the cache that now holds their rows."""
        k_cache_BKHS, v_cache_BKSH, _, _ = cache_arrays
        return attend_extend(
            proj[0], k_cache_BKHS, v_cache_BKSH, pos_B, self.cfg.attn_scale, self._sink_logits()
        )

    def output(self, o_BTKGH: jax.Array) -> jax.Array:
        cfg = self.cfg
        B, T = o_BTKGH.shape[:2]
        o_BTE = o_BTKGH.reshape(B, T, cfg.q_dim)  # outside the kernel: a bitcast once compiled
        with jax.named_scope(kernels.O_PROJ):
            out_BTD = linear(o_BTE, read(self.o_proj, cfg))
            return out_BTD + read(self.o_bias, cfg) if cfg.o_bias else out_BTD


def l2_norm(x: jax.Array, eps: float) -> jax.Array:
    """Llama 4's L2Norm: x * rsqrt(mean(x^2) + eps) over the last axis, in f32, no scale."""
    x32 = x.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * inv).astype(x.dtype)


def temperature(q_BTKGH: jax.Array, positions_BT: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Llama 4's attention temperature tuning: q at position t times
    log(floor((t + 1) / floor_scale) + 1) * scale + 1, multiplied in f32 as Hugging Face does."""
    t_BT = positions_BT.astype(jnp.float32)
    s_BT = jnp.log1p(jnp.floor((t_BT + 1.0) / cfg.temperature_floor)) * cfg.temperature_scale
    s_BT11 = (s_BT + 1.0)[:, :, None, None, None]
    return (q_BTKGH.astype(jnp.float32) * s_BT11).astype(q_BTKGH.dtype)
