"""Grouped-query attention with an explicit group axis: q is [B, T, K, G, H] and K/V are never
repeated to N heads (gemma, penzai). MHA is G = 1, MQA is K = 1."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvjax import kernels
from kvjax.model.config import ModelConfig
from kvjax.nn import flash
from kvjax.nn.fake_quant import read_quantized
from kvjax.nn.kv_cache import dequantize, rolling_slot
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

NEG_INF = -1e30  # finite, so a fully masked row never produces NaN


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
                    )  # fmt: skip
                    k_BTKH = jnp.concatenate(
                        [apply_rope(k_BTKH[..., :R], cos, sin), k_BTKH[..., R:]], axis=-1
                    )  # fmt: skip
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
            *proj[:3], window=window, scale=cfg.attn_scale, softcap=cfg.attn_softcap, cached=cached,
            sinks=cfg.sink_tokens if window else 0, sink_logits_KG=self._sink_logits(),
            chunked=self.chunked,
        )  # fmt: skip

    def _sink_logits(self):
        """gpt-oss's per-head sink logits as [K, G] in their stored dtype (None without them):
        widened to f32 inside the softmax's scope, where their cost belongs."""
        if not self.cfg.sink_logits:
            return None
        return self.sink_logits[...].reshape(self.cfg.num_kv_heads, -1)

    def over_cache(self, proj, cache_arrays, pos_B: jax.Array, window: int = 0) -> jax.Array:
        q_BTKGH, k_BTKH, v_BTKH = proj[:3]
        k_cache_BKHS, v_cache_BKSH, k_scale, v_scale = cache_arrays
        if self.cfg.attention_kernel == "flash":
            o_BKGH = flash.flash_decode(
                q_BTKGH[:, 0], k_BTKH[:, 0], v_BTKH[:, 0], k_cache_BKHS, v_cache_BKSH, pos_B,
                window, self.cfg.attn_scale, self.cfg.attn_softcap,
            )  # fmt: skip
            return o_BKGH[:, None]
        o_BKGH = attend_cache(
            q_BTKGH[:, 0], k_BTKH[:, 0], v_BTKH[:, 0], k_cache_BKHS, v_cache_BKSH, pos_B, window,
            k_scale, v_scale, self.cfg.attn_scale, self.cfg.attn_softcap,
            self.cfg.sink_tokens if window else 0, self._sink_logits(), self.chunked,
        )  # fmt: skip
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


def causal_mask(T: int, window: int = 0, sinks: int = 0, chunked: bool = False) -> jax.Array:
    """[T, T]: query i sees key j <= i, and with a sliding window only i - j < window (the
    window counts the query's own position, as Hugging Face's sliding_window) or, with `sinks`,
    j < sinks (StreamingLLM: the first tokens stay visible). `chunked` (Llama 4): the window is
    a chunk instead, j // window == i // window (a constant: one and an entry)."""
    mask_TS = jnp.tril(jnp.ones((T, T), jnp.bool_))
    if chunked:
        if window and window < T:
            chunk_T = np.arange(T) // window
            mask_TS = mask_TS & jnp.asarray(chunk_T[:, None] == chunk_T[None, :])
        return mask_TS
    if window and window < T:
        band_TS = ~jnp.tril(jnp.ones((T, T), jnp.bool_), -window)
        if sinks:
            band_TS = band_TS | (jnp.arange(T) < sinks)[None, :]
        mask_TS = mask_TS & band_TS
    return mask_TS


def soft_cap(x: jax.Array, cap: float) -> jax.Array:
    """cap * tanh(x / cap) (Gemma 2's logit soft-capping); x itself for cap 0."""
    return cap * jnp.tanh(x / cap) if cap else x


def attend_causal(
    q_BTKGH: jax.Array,
    k_BSKH: jax.Array,
    v_BSKH: jax.Array,
    window: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
    cached=None,
    sinks: int = 0,
    sink_logits_KG=None,
    chunked: bool = False,
) -> jax.Array:
    """Causal attention of T queries over the same T positions (forward and prefill), banded to
    the last `window` positions for a sliding layer (and its first `sinks`). Scores scaled by
    `scale` (1/sqrt(H) when None) and soft-capped before the mask; `sink_logits_KG` (gpt-oss)
    join each head's softmax denominator (`softmax_with_sinks`).

    `cached` (the quality of a quantized cache, `kvjax.nn.fake_quant`): (k, v as the cache
    returns them, residual R): query t reads position j's quantized k and v where
    j // R < t // R, the full-precision ones elsewhere."""
    T, H = q_BTKGH.shape[1], q_BTKGH.shape[-1]
    scale = 1.0 / math.sqrt(H) if scale is None else scale
    dtype = q_BTKGH.dtype
    q_BKGTH = jnp.transpose(q_BTKGH, (0, 2, 3, 1, 4))  # outside the kernels: a layout change
    if cached is not None:
        kq_BSKH, vq_BSKH, residual = cached
        quantized_TS = read_quantized(T, residual)

    def scores(k):
        return jnp.einsum("BKGTH,BSKH->BKGTS", q_BKGTH, k, preferred_element_type=jnp.float32)

    with jax.named_scope(kernels.SCORES):
        s_BKGTS = scores(k_BSKH)
        if cached is not None:
            s_BKGTS = jnp.where(quantized_TS, scores(kq_BSKH), s_BKGTS)
    with jax.named_scope(kernels.SOFTMAX):
        s_BKGTS = soft_cap(s_BKGTS * scale, softcap)
        s_BKGTS = jnp.where(causal_mask(T, window, sinks, chunked), s_BKGTS, NEG_INF)
        p_BKGTS = softmax_with_sinks(s_BKGTS, sink_logits_KG).astype(dtype)
    with jax.named_scope(kernels.AV):
        if cached is None:
            o_BKGTH = jnp.einsum("BKGTS,BSKH->BKGTH", p_BKGTS, v_BSKH.astype(dtype))
        else:
            zero = jnp.zeros((), dtype)
            o_BKGTH = jnp.einsum(
                "BKGTS,BSKH->BKGTH", jnp.where(quantized_TS, zero, p_BKGTS), v_BSKH.astype(dtype)
            ) + jnp.einsum(
                "BKGTS,BSKH->BKGTH", jnp.where(quantized_TS, p_BKGTS, zero), vq_BSKH.astype(dtype)
            )
    return jnp.transpose(o_BKGTH, (0, 3, 1, 2, 4))  # to BTKGH, outside the kernels


def softmax_with_sinks(s_BKGTS: jax.Array, sink_logits_KG=None) -> jax.Array:
    """Softmax over the last axis; with gpt-oss's sink logits (one per head, [K, G]) each row's
    denominator also holds exp(sink): the max taken with the sink, exp(sink - max) added to the
    sum, the sink's own probability dropped (Hugging Face's concat-softmax-slice, unconcatenated).
    """
    if sink_logits_KG is None:
        return jax.nn.softmax(s_BKGTS, axis=-1)
    sink = sink_logits_KG.astype(jnp.float32)[None, :, :, None, None]
    m = jnp.maximum(jnp.max(s_BKGTS, axis=-1, keepdims=True), sink)
    e_BKGTS = jnp.exp(s_BKGTS - m)
    return e_BKGTS / (jnp.sum(e_BKGTS, axis=-1, keepdims=True) + jnp.exp(sink - m))


def attend_extend(
    q_BTKGH, k_cache_BKHS, v_cache_BKSH, pos_B, scale: float | None = None, sink_logits_KG=None
):
    """T new queries per sequence over its cache after their rows were written: query t of a
    sequence at `pos_B` (positions held before the step) sees key j <= pos + t. The cache is
    read as stored ((B, K, H, S) keys, (B, K, S, H) values) in the compute dtype."""
    T, H = q_BTKGH.shape[1], q_BTKGH.shape[-1]
    S = v_cache_BKSH.shape[2]
    scale = 1.0 / math.sqrt(H) if scale is None else scale
    dtype = q_BTKGH.dtype
    q_BKGTH = jnp.transpose(q_BTKGH, (0, 2, 3, 1, 4))  # outside the kernels: a layout change
    with jax.named_scope(kernels.SCORES):
        s_BKGTS = jnp.einsum("BKGTH,BKHS->BKGTS", q_BKGTH, k_cache_BKHS.astype(dtype),
                             preferred_element_type=jnp.float32)  # fmt: skip
    with jax.named_scope(kernels.SOFTMAX):
        last_BT = pos_B[:, None] + jnp.arange(T)[None, :]  # the last key each query sees
        valid_BTS = jnp.arange(S)[None, None, :] <= last_BT[:, :, None]
        s_BKGTS = jnp.where(valid_BTS[:, None, None], s_BKGTS * scale, NEG_INF)
        p_BKGTS = softmax_with_sinks(s_BKGTS, sink_logits_KG).astype(dtype)
    with jax.named_scope(kernels.AV):
        o_BKGTH = jnp.einsum("BKGTS,BKSH->BKGTH", p_BKGTS, v_cache_BKSH.astype(dtype))
    return jnp.transpose(o_BKGTH, (0, 3, 1, 2, 4))  # to BTKGH, outside the kernels


def decode_scores(q_BKGH, k_new_BKH, k_cache_BKHS, k_scale_BKS=None):
    """q . K_cache (f32) and the new token's own score q . k_new (K cached (B, K, H, S):
    `kvjax.nn.kv_cache` says why; a 1-byte cache dequantized by its scales first)."""
    dtype = q_BKGH.dtype
    k_cache_BKHS = dequantize(k_cache_BKHS, k_scale_BKS, dtype, axis=2)
    s_BKGS = jnp.einsum("BKGH,BKHS->BKGS", q_BKGH, k_cache_BKHS, preferred_element_type=jnp.float32)
    s_self_BKG = jnp.einsum("BKGH,BKH->BKG", q_BKGH, k_new_BKH, preferred_element_type=jnp.float32)
    return s_BKGS, s_self_BKG


def decode_softmax(
    s_BKGS, s_self_BKG, pos_B, head_dim: int, dtype, window: int = 0, scale=None, softcap=0.0,
    sinks: int = 0, sink_logits_KG=None, chunked: bool = False,
):  # fmt: skip
    """Softmax over the valid cached positions [0, pos) and the new token, written out so the
    new score joins the cached ones without a concat. Scaled by `scale` (1/sqrt(head_dim) when
    None) and soft-capped (Gemma 2) before the mask. `chunked` on a rolling layer (Llama 4):
    token t's chunk is slots [0, t mod window), the ring's slots holding the chunk so far."""
    B, S = s_BKGS.shape[0], s_BKGS.shape[-1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    if chunked and window:
        valid_BS = jnp.arange(S)[None, :] < jnp.remainder(pos_B, window)[:, None]
    else:
        valid_BS = jnp.arange(S)[None, :] < pos_B[:, None]
    if (
        window and not chunked
    ):  # a rolling buffer: the slot about to be overwritten holds a token out of window
        slot_B = rolling_slot(pos_B, window, sinks)
        valid_BS = valid_BS & (jnp.arange(S)[None, :] != slot_B[:, None])
    # any head axes between B and S (K, G here; N for MLA)
    valid = valid_BS.reshape((B,) + (1,) * (s_BKGS.ndim - 2) + (S,))
    s_BKGS = jnp.where(valid, soft_cap(s_BKGS * scale, softcap), NEG_INF)
    s_self_BKG = soft_cap(s_self_BKG * scale, softcap)
    m_BKG = jnp.maximum(jnp.max(s_BKGS, axis=-1), s_self_BKG)
    if sink_logits_KG is not None:  # gpt-oss: the sink joins the max and the denominator
        sink_1KG = sink_logits_KG.astype(jnp.float32)[None]
        m_BKG = jnp.maximum(m_BKG, sink_1KG)
    e_BKGS = jnp.exp(s_BKGS - m_BKG[..., None])
    e_self_BKG = jnp.exp(s_self_BKG - m_BKG)
    total_BKG = jnp.sum(e_BKGS, axis=-1) + e_self_BKG
    if sink_logits_KG is not None:
        total_BKG = total_BKG + jnp.exp(sink_1KG - m_BKG)
    inv_BKG = 1.0 / total_BKG
    return (e_BKGS * inv_BKG[..., None]).astype(dtype), (e_self_BKG * inv_BKG).astype(dtype)


def decode_av(p_BKGS, p_self_BKG, v_new_BKH, v_cache_BKSH, v_scale_BKS=None):
    """P . V_cache + p_self x v_new: two products and one add, no broadcasts."""
    v_cache_BKSH = dequantize(v_cache_BKSH, v_scale_BKS, p_BKGS.dtype, axis=3)
    o_BKGH = jnp.einsum("BKGS,BKSH->BKGH", p_BKGS, v_cache_BKSH)
    return o_BKGH + jnp.einsum("BKG,BKH->BKGH", p_self_BKG, v_new_BKH)


def attend_cache(
    q_BKGH: jax.Array,
    k_new_BKH: jax.Array,
    v_new_BKH: jax.Array,
    k_cache_BKHS: jax.Array,
    v_cache_BKSH: jax.Array,
    pos_B: jax.Array,
    window: int = 0,
    k_scale_BKS: jax.Array | None = None,
    v_scale_BKS: jax.Array | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
    sinks: int = 0,
    sink_logits_KG=None,
    chunked: bool = False,
) -> jax.Array:
    """One new query per sequence over its cached positions [0, pos) and its own new k, v.

    The cache is only read here: the new row is written by `KVCache.append` in a separate,
    donated step (DESIGN.md: on XLA:CPU writing and attending in one jit copied the cache).
    The three kernels are separate functions so `kvjax.measured.kernels` can time each alone.
    """
    with jax.named_scope(kernels.SCORES):
        s_BKGS, s_self_BKG = decode_scores(q_BKGH, k_new_BKH, k_cache_BKHS, k_scale_BKS)
    with jax.named_scope(kernels.SOFTMAX):
        p_BKGS, p_self_BKG = decode_softmax(
            s_BKGS, s_self_BKG, pos_B, q_BKGH.shape[-1], q_BKGH.dtype, window, scale, softcap,
            sinks, sink_logits_KG, chunked,
        )  # fmt: skip
    with jax.named_scope(kernels.AV):
        return decode_av(p_BKGS, p_self_BKG, v_new_BKH, v_cache_BKSH, v_scale_BKS)
