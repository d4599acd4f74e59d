"""Fused attention in the model (`ModelConfig.attention_kernel == "flash"`).

Prefill: `jax.nn.dot_product_attention` (causal, GQA without repeating K/V, sliding windows),
XLA's implementation on CPU and cuDNN's fused kernel when compiled for a GPU target. Decode:
kvjax's own flash-decoding kernel in Pallas: a grid over (sequence, KV head, split of the cache);
each program reads its split of K and V once for all G query heads of its KV head, keeps an
online softmax, and writes a partial output with its max and sum; the combine folds in the new
token's own score and normalises. Letters: `kvjax.kernels`; closed form: `kvjax.analytic.flash`.

On CPU the Pallas kernel runs in interpret mode (exact values; its cost analysis is the
interpreter's, not the kernel's). `lowering_for("gpu")` makes the model lower it for Triton
instead, as a deviceless compile for a GPU target needs.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kvjax import kernels
from kvjax.errors import KvjaxError

NEG_INF = -1e30
_PLATFORM = contextvars.ContextVar("kvjax_flash_platform", default=None)
_SPLITS = contextvars.ContextVar("kvjax_flash_splits", default=1)
MIN_ROWS = 16  # Triton's dot needs 16 rows: the G query heads of a KV head are padded to it


@contextlib.contextmanager
def lowering_for(platform: str, splits: int = 1):
    """Lower the fused kernels for `platform` ("gpu", "tpu", "cpu") whatever the host runs, the
    decode cache in `splits` chunks (`kvjax.analytic.flash.plan` sizes them for a chip)."""
    tokens = _PLATFORM.set(platform), _SPLITS.set(splits)
    try:
        yield
    finally:
        _PLATFORM.reset(tokens[0])
        _SPLITS.reset(tokens[1])


def check_supported(cfg) -> None:
    """The model's fused kernels cover MHA/GQA/MQA over a bf16/f16/f32 cache, windows included;
    the rest is refused by name (the closed form covers them: `kvjax calc`)."""
    if cfg.kv_scale_kind != "none" or cfg.kv_dtype != cfg.compute_dtype:
        raise KvjaxError(
            f"attention_kernel='flash' reads the cache in the compute dtype; kv_dtype="
            f"{cfg.kv_dtype!r} (compute {cfg.compute_dtype}) is not supported by the model's "
            "kernel (allowed: kv_dtype equal to the compute dtype; the closed form has both)"
        )
    if cfg.attn_softcap:
        raise KvjaxError(
            f"attention_kernel='flash' with attn_softcap={cfg.attn_softcap:g} is not supported "
            "in prefill (jax.nn.dot_product_attention has no soft-capping); use attention_kernel="
            "'xla'"
        )


def platform() -> str:
    return _PLATFORM.get() or jax.default_backend()


def flash_causal(q_BTKGH, k_BSKH, v_BSKH, window: int = 0, scale: float | None = None):
    """Causal (banded to `window`) attention of T queries over the same T positions, fused."""
    B, T, K, G, H = q_BTKGH.shape
    impl = "cudnn" if platform() == "gpu" else "xla"
    with jax.named_scope(kernels.ATTENTION):
        o_BTNH = jax.nn.dot_product_attention(
            q_BTKGH.reshape(B, T, K * G, H), k_BSKH, v_BSKH.astype(q_BTKGH.dtype), scale=scale,
            is_causal=True, local_window_size=(window - 1, 0) if window else None,
            implementation=impl,
        )  # fmt: skip
    return o_BTNH.reshape(B, T, K, G, H)


def _decode_kernel(pos_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, *, block: int, chunk: int,
                   window: int, scale: float, softcap: float):  # fmt: skip
    """One (sequence, KV head, split): the split's `chunk` positions in blocks of `block`."""
    split = pl.program_id(2)
    pos = pos_ref[0]
    q_GH = q_ref[0, 0].astype(jnp.float32) * scale
    rows = q_GH.shape[0]

    def body(i, carry):
        m_G, l_G, acc_GH = carry
        start = split * chunk + i * block
        k_HS = k_ref[0, 0, :, pl.ds(i * block, block)].astype(jnp.float32)
        v_SH = v_ref[0, 0, pl.ds(i * block, block), :].astype(jnp.float32)
        s_GS = jnp.dot(q_GH, k_HS)
        if softcap:
            s_GS = softcap * jnp.tanh(s_GS / softcap)
        j_S = start + jnp.arange(block)
        valid_S = j_S < pos
        if window:  # the rolling buffer's slot about to be overwritten
            valid_S = valid_S & (j_S != jax.lax.rem(pos, window))
        s_GS = jnp.where(valid_S[None, :], s_GS, NEG_INF)
        m_new = jnp.maximum(m_G, jnp.max(s_GS, axis=1))
        p_GS = jnp.where(valid_S[None, :], jnp.exp(s_GS - m_new[:, None]), 0.0)
        alpha = jnp.exp(m_G - m_new)
        return (
            m_new,
            alpha * l_G + jnp.sum(p_GS, axis=1),
            alpha[:, None] * acc_GH + jnp.dot(p_GS, v_SH),
        )

    init = (
        jnp.full((rows,), NEG_INF, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
        jnp.zeros(q_GH.shape, jnp.float32),
    )
    m_G, l_G, acc_GH = jax.lax.fori_loop(0, chunk // block, body, init)
    o_ref[0, 0, 0] = acc_GH
    m_ref[0, 0, 0] = m_G
    l_ref[0, 0, 0] = l_G


def supplied_name(kernel: str, flops: int, bytes_: int) -> str:
    """The kernel's name with its cost, `kvjax_flash_decode_f<FLOPs>_b<bytes>`: the op_name that
    `kvjax.traced.target_rules` reads the cost from where XLA cannot count inside the kernel."""
    return f"{kernel}_f{int(flops)}_b{int(bytes_)}"


def _compiler_params(target: str):
    """Triton on a GPU (its blocks stay in global memory and the loop streams them; Mosaic GPU
    would stage a whole split in shared memory); Mosaic's defaults on a TPU."""
    if target == "gpu":
        from jax.experimental.pallas import triton as pltriton

        return pltriton.CompilerParams(num_warps=4, num_stages=2)
    return None


def _blocks(S: int, splits: int) -> tuple[int, int, int]:
    """(splits, chunk, block): `splits` chunks of S (fewer when S does not divide), each walked
    in blocks of up to 128 positions dividing the chunk."""
    splits = max(1, min(splits, S))
    while S % splits:
        splits -= 1
    chunk = S // splits
    block = math.gcd(chunk, 128)
    return splits, chunk, block


def flash_decode(
    q_BKGH, k_new_BKH, v_new_BKH, k_cache_BKHS, v_cache_BKSH, pos_B, window: int = 0,
    scale: float | None = None, softcap: float = 0.0, splits: int | None = None,
):  # fmt: skip
    """One new query per sequence over its cached positions [0, pos) and its own new k, v, by
    flash-decoding: the cache read once, in `splits` chunks whose partials the combine sums."""
    B, K, G, H = q_BKGH.shape
    S = v_cache_BKSH.shape[2]
    scale = 1.0 / math.sqrt(H) if scale is None else scale
    splits, chunk, block = _blocks(S, _SPLITS.get() if splits is None else splits)
    target = platform()
    rows = G if target == "cpu" else max(G, MIN_ROWS)
    q_pad = jnp.pad(q_BKGH, ((0, 0), (0, 0), (0, rows - G), (0, 0))) if rows > G else q_BKGH
    kernel = functools.partial(
        _decode_kernel, block=block, chunk=chunk, window=window, scale=scale, softcap=softcap
    )
    # The kernel's cost as the closed form counts it (kvjax.analytic.flash): the cache read
    # once, q read, the partials written; the two products over the S positions.
    flops = 4 * B * K * G * S * H
    moved = (2 * B * K * S * H * k_cache_BKHS.dtype.itemsize + B * K * G * H * q_BKGH.dtype.itemsize
             + B * K * splits * G * (H + 2) * 4)  # fmt: skip
    cost = pl.CostEstimate(flops=flops, transcendentals=B * K * G * S, bytes_accessed=moved)
    with jax.named_scope(kernels.ATTENTION):
        acc, m, sums = pl.pallas_call(
            kernel,
            grid=(B, K, splits),
            in_specs=[
                pl.BlockSpec((1,), lambda b, k, s: (b,)),
                pl.BlockSpec((1, 1, rows, H), lambda b, k, s: (b, k, 0, 0)),
                pl.BlockSpec((1, 1, H, chunk), lambda b, k, s: (b, k, 0, s)),
                pl.BlockSpec((1, 1, chunk, H), lambda b, k, s: (b, k, s, 0)),
            ],
            out_specs=[
                pl.BlockSpec((1, 1, 1, rows, H), lambda b, k, s: (b, k, s, 0, 0)),
                pl.BlockSpec((1, 1, 1, rows), lambda b, k, s: (b, k, s, 0)),
                pl.BlockSpec((1, 1, 1, rows), lambda b, k, s: (b, k, s, 0)),
            ],
            out_shape=[
                jax.ShapeDtypeStruct((B, K, splits, rows, H), jnp.float32),
                jax.ShapeDtypeStruct((B, K, splits, rows), jnp.float32),
                jax.ShapeDtypeStruct((B, K, splits, rows), jnp.float32),
            ],
            interpret=target == "cpu",
            compiler_params=_compiler_params(target),
            cost_estimate=cost,
            name=supplied_name("kvjax_flash_decode", flops, moved),
        )(pos_B.astype(jnp.int32), q_pad, k_cache_BKHS, v_cache_BKSH)
    with jax.named_scope(kernels.ATTN_COMBINE):
        acc, m, sums = acc[:, :, :, :G], m[:, :, :, :G], sums[:, :, :, :G]
        s_self_BKG = jnp.einsum(
            "BKGH,BKH->BKG", q_BKGH, k_new_BKH, preferred_element_type=jnp.float32
        ) * scale  # fmt: skip
        if softcap:
            s_self_BKG = softcap * jnp.tanh(s_self_BKG / softcap)
        m_BKG = jnp.maximum(jnp.max(m, axis=2), s_self_BKG)
        w_BKsG = jnp.exp(m - m_BKG[:, :, None])
        w_self_BKG = jnp.exp(s_self_BKG - m_BKG)
        total_BKG = jnp.sum(w_BKsG * sums, axis=2) + w_self_BKG
        o_BKGH = jnp.sum(w_BKsG[..., None] * acc, axis=2) + w_self_BKG[..., None] * v_new_BKH[
            :, :, None
        ].astype(jnp.float32)  # fmt: skip
        return (o_BKGH / total_BKG[..., None]).astype(q_BKGH.dtype)
