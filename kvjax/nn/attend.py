"""The attention itself over the grouped-query layout: q [B, T, K, G, H] against k, v [.., K, ..]
with the group axis kept explicit, never repeated to N heads (gemma, penzai). MHA is G = 1, MQA is
K = 1. Letters: `kvjax.kernels`.

- `attend_causal`: T queries over the same T positions (forward and prefill), banded to a sliding
  layer's window, and a quantized cache's reads for its quality (`kvjax.nn.fake_quant`);
- `attend_extend`: T new queries over a cache that already holds their rows;
- `attend_cache`: one new query per sequence over its cache and its own k, v (decode), as three
  kernels (`decode_scores`, `decode_softmax`, `decode_av`) that `kvjax.measured.kernels` times
  alone.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from kvjax import kernels
from kvjax.nn.fake_quant import read_quantized
from kvjax.nn.kv_cache import dequantize, rolling_slot

NEG_INF = -1e30  # finite, so a fully masked row never produces NaN


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
        s_BKGTS = jnp.einsum(
            "BKGTH,BKHS->BKGTS",
            q_BKGTH,
            k_cache_BKHS.astype(dtype),
            preferred_element_type=jnp.float32,
        )
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
    s_BKGS,
    s_self_BKG,
    pos_B,
    head_dim: int,
    dtype,
    window: int = 0,
    scale=None,
    softcap=0.0,
    sinks: int = 0,
    sink_logits_KG=None,
    chunked: bool = False,
):
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
    if window and not chunked:
        # a rolling buffer: the slot about to be overwritten holds a token out of the window
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
            s_BKGS,
            s_self_BKG,
            pos_B,
            q_BKGH.shape[-1],
            q_BKGH.dtype,
            window,
            scale,
            softcap,
            sinks,
            sink_logits_KG,
            chunked,
        )
    with jax.named_scope(kernels.AV):
        return decode_av(p_BKGS, p_self_BKG, v_new_BKH, v_cache_BKSH, v_scale_BKS)
