"""Fused attention in the model (`ModelConfig.attention_kernel == "flash"`).

Prefill: `jax.nn.dot_product_attention` (causal, GQA without repeating K/V, sliding windows),
XLA's implementation on CPU and cuDNN's fused kernel on a GPU, or kvjax's own Pallas
FlashAttention-2 kernel (`kvjax.nn.flash_prefill`: what a GPU target compiled on a host without a
CUDA driver runs, since cuDNN's lowering needs one).

Decode: kvjax's own flash-decoding kernel in Pallas: a grid over (sequence, KV head, split of the
cache); each program reads its split of K and V once for all G query heads of its KV head, keeps
an online softmax, and writes a partial output with its max and sum; the combine folds in the new
token's own score and normalises. MLA's absorbed decode is the same work over the latent
(`kvjax.nn.flash_mla`). Letters: `kvjax.kernels`; closed form: `kvjax.analytic.flash`.

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
_PREFILL = contextvars.ContextVar("kvjax_flash_prefill", default=None)
MIN_ROWS = 16  # Triton's dot needs 16 rows: the G query heads of a KV head are padded to it
PREFILL_IMPLS = ("xla", "cudnn", "pallas")


@contextlib.contextmanager
def lowering_for(
    platform: str,
    splits: int = 1,
    prefill: str | None = None,
    block_q: int = 128,
    block_k: int = 128,
):
    """Lower the fused kernels for `platform` ("gpu", "tpu", "cpu") whatever the host runs, the
    decode cache in `splits` chunks (`kvjax.analytic.flash.plan` sizes them for a chip) and the
    prefill by `prefill` (PREFILL_IMPLS; default cuDNN on a GPU, XLA's elsewhere; "pallas":
    kvjax's own kernel in `block_q` x `block_k` tiles, `kvjax.nn.flash_prefill`)."""
    if prefill is not None and prefill not in PREFILL_IMPLS:
        allowed = ", ".join(PREFILL_IMPLS)
        raise KvjaxError(f"prefill={prefill!r} is not supported; allowed: {allowed}")
    tokens = (
        _PLATFORM.set(platform),
        _SPLITS.set(splits),
        _PREFILL.set(None if prefill is None else (prefill, block_q, block_k)),
    )
    try:
        yield
    finally:
        _PLATFORM.reset(tokens[0])
        _SPLITS.reset(tokens[1])
        _PREFILL.reset(tokens[2])


def prefill_impl() -> tuple[str, int, int]:
    """(implementation, block_q, block_k) the prefill's fused attention lowers to."""
    return _PREFILL.get() or ("cudnn" if platform() == "gpu" else "xla", 128, 128)


def check_supported(cfg) -> None:
    """The model's fused kernels cover MHA/GQA/MQA over a bf16/f16/f32 cache, windows included;
    the rest is refused by name (the closed form covers them: `kvjax calc`)."""
    if cfg.kv_scale_kind != "none" or cfg.kv_dtype != cfg.compute_dtype:
        raise KvjaxError(
            f"attention_kernel='flash' reads the cache in the compute dtype; kv_dtype="
            f"{cfg.kv_dtype!r} (compute {cfg.compute_dtype}) is not supported by the model's "
            "kernel (allowed: kv_dtype equal to the compute dtype; the closed form has both)"
        )
    if cfg.chunked_attention:
        raise KvjaxError(
            "attention_kernel='flash' with chunked_attention is not supported by the model's "
            "fused kernels (they band to a sliding window); use attention_kernel='xla'"
        )
    if cfg.sink_tokens:
        raise KvjaxError(
            f"attention_kernel='flash' with sink_tokens={cfg.sink_tokens} is not supported (the "
            "fused kernels band to the window only); use attention_kernel='xla'"
        )
    if cfg.sink_logits:
        raise KvjaxError(
            "attention_kernel='flash' with sink_logits=True (gpt-oss) is not supported by the "
            "model's fused kernels (the closed form counts it: kvjax calc); use attention_kernel="
            "'xla'"
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
    """Causal (banded to `window`) attention of T queries over the same T positions, fused:
    `jax.nn.dot_product_attention` (cuDNN or XLA's) or kvjax's Pallas kernel (`prefill_impl`)."""
    B, T, K, G, H = q_BTKGH.shape
    impl, block_q, block_k = prefill_impl()
    with jax.named_scope(kernels.ATTENTION):
        if impl == "pallas":
            from kvjax.nn.flash_prefill import flash_prefill

            target = platform()
            return flash_prefill(
                q_BTKGH,
                k_BSKH,
                v_BSKH,
                window=window,
                scale=scale,
                block_q=block_q,
                block_k=block_k,
                interpret=target == "cpu",
                compiler_params=compiler_params(target, warps=4 if H <= 64 else 8),
                name=functools.partial(supplied_name, "kvjax_flash_prefill"),
            )
        o_BTNH = jax.nn.dot_product_attention(
            q_BTKGH.reshape(B, T, K * G, H),
            k_BSKH,
            v_BSKH.astype(q_BTKGH.dtype),
            scale=scale,
            is_causal=True,
            local_window_size=(window - 1, 0) if window else None,
            implementation=impl,
        )
    return o_BTNH.reshape(B, T, K, G, H)


def _decode_kernel(
    pos_ref,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    m_ref,
    l_ref,
    *,
    block: int,
    chunk: int,
    window: int,
    scale: float,
    softcap: float,
):
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


def compiler_params(target: str, warps: int = 4):
    """Triton on a GPU (its blocks stay in global memory and the loop streams them; Mosaic GPU
    would stage a whole split in shared memory); Mosaic's defaults on a TPU."""
    if target == "gpu":
        from jax.experimental.pallas import triton as pltriton

        return pltriton.CompilerParams(num_warps=warps, num_stages=2)
    return None


def decode_blocks(S: int, splits: int | None = None) -> tuple[int, int, int]:
    """(splits, chunk, block): `splits` chunks of S (None: the count `lowering_for` set; fewer
    when S does not divide), each walked in blocks of up to 128 positions dividing the chunk."""
    splits = _SPLITS.get() if splits is None else splits
    splits = max(1, min(splits, S))
    while S % splits:
        splits -= 1
    chunk = S // splits
    block = math.gcd(chunk, 128)
    return splits, chunk, block


def flash_decode(
    q_BKGH,
    k_new_BKH,
    v_new_BKH,
    k_cache_BKHS,
    v_cache_BKSH,
    pos_B,
    window: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
    splits: int | None = None,
):
    """One new query per sequence over its cached positions [0, pos) and its own new k, v, by
    flash-decoding: the cache read once, in `splits` chunks whose partials the combine sums."""
    B, K, G, H = q_BKGH.shape
    S = v_cache_BKSH.shape[2]
    scale = 1.0 / math.sqrt(H) if scale is None else scale
    splits, chunk, block = decode_blocks(S, splits)
    target = platform()
    rows = G if target == "cpu" else max(G, MIN_ROWS)
    q_pad = jnp.pad(q_BKGH, ((0, 0), (0, 0), (0, rows - G), (0, 0))) if rows > G else q_BKGH
    kernel = functools.partial(
        _decode_kernel, block=block, chunk=chunk, window=window, scale=scale, softcap=softcap
    )
    # The kernel's cost as the closed form counts it (kvjax.analytic.flash): the cache read
    # once, q read, the partials written; the two products over the S positions.
    flops = 4 * B * K * G * S * H
    moved = (
        2 * B * K * S * H * k_cache_BKHS.dtype.itemsize
        + B * K * G * H * q_BKGH.dtype.itemsize
        + B * K * splits * G * (H + 2) * 4
    )
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
            compiler_params=compiler_params(target),
            cost_estimate=cost,
            name=supplied_name("kvjax_flash_decode", flops, moved),
        )(pos_B.astype(jnp.int32), q_pad, k_cache_BKHS, v_cache_BKSH)
    with jax.named_scope(kernels.ATTN_COMBINE):
        s_self_BKG = (
            jnp.einsum("BKGH,BKH->BKG", q_BKGH, k_new_BKH, preferred_element_type=jnp.float32)
            * scale
        )
        if softcap:
            s_self_BKG = softcap * jnp.tanh(s_self_BKG / softcap)
        o_BKGH = combine(acc, m, sums, s_self_BKG, v_new_BKH[:, :, None])
        return o_BKGH.astype(q_BKGH.dtype)


def combine(acc_XsGH, m_XsG, sums_XsG, s_self_XG, v_new_XGH):
    """Flash-decoding's second kernel: the splits' partial outputs (axis -3 of `acc`, G rows
    padded as the kernel ran them) rescaled to the common max, with the new token's own score
    and value folded in, summed and normalised (f32)."""
    G = s_self_XG.shape[-1]
    acc_XsGH, m_XsG, sums_XsG = acc_XsGH[..., :G, :], m_XsG[..., :G], sums_XsG[..., :G]
    m_XG = jnp.maximum(jnp.max(m_XsG, axis=-2), s_self_XG)
    w_XsG = jnp.exp(m_XsG - m_XG[..., None, :])
    w_self_XG = jnp.exp(s_self_XG - m_XG)
    total_XG = jnp.sum(w_XsG * sums_XsG, axis=-2) + w_self_XG
    v_XGH = v_new_XGH.astype(jnp.float32)
    o_XGH = jnp.sum(w_XsG[..., None] * acc_XsGH, axis=-3) + w_self_XG[..., None] * v_XGH
    return o_XGH / total_XG[..., None]
