"""MLA's absorbed decode as one fused Pallas kernel (the shape of work of DeepSeek's FlashMLA): a
grid over (sequence, split of the cache), the N query heads as the rows of every program, the
cached latents read once as both keys and values beside the RoPE keys; each program keeps an
online softmax and writes a partial output, and flash-decoding's combine (`kvjax.nn.flash`) folds
in the new token's own score and normalises. The output stays in latent space [B, N, A]; the
value up-projection follows (`kvjax.nn.mla`). Letters: `kvjax.kernels`; lowered for the platform
`kvjax.nn.flash.lowering_for` names, in interpret mode on a CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kvjax import kernels
from kvjax.nn.flash import (
    MIN_ROWS,
    NEG_INF,
    combine,
    compiler_params,
    decode_blocks,
    platform,
    supplied_name,
)


def _latent_kernel(
    pos_ref,
    ql_ref,
    qr_ref,
    c_ref,
    kr_ref,
    o_ref,
    m_ref,
    l_ref,
    *,
    block: int,
    chunk: int,
    scale: float,
):
    """MLA absorbed decode, one (sequence, split): every query head's latent query against the
    split's cached latents (keys and values both) and RoPE keys, read once for all N heads."""
    split = pl.program_id(1)
    pos = pos_ref[0]
    ql_NA = ql_ref[0].astype(jnp.float32) * scale
    qr_NP = qr_ref[0].astype(jnp.float32) * scale
    rows = ql_NA.shape[0]
    nt = (((1,), (1,)), ((), ()))  # q . k^T: the cache rows as stored, position-major

    def body(i, carry):
        m_N, l_N, acc_NA = carry
        start = split * chunk + i * block
        c_SA = c_ref[0, pl.ds(i * block, block), :].astype(jnp.float32)
        kr_SP = kr_ref[0, pl.ds(i * block, block), :].astype(jnp.float32)
        s_NS = jax.lax.dot_general(ql_NA, c_SA, nt) + jax.lax.dot_general(qr_NP, kr_SP, nt)
        valid_S = (start + jnp.arange(block)) < pos
        s_NS = jnp.where(valid_S[None, :], s_NS, NEG_INF)
        m_new = jnp.maximum(m_N, jnp.max(s_NS, axis=1))
        p_NS = jnp.where(valid_S[None, :], jnp.exp(s_NS - m_new[:, None]), 0.0)
        alpha = jnp.exp(m_N - m_new)
        return (
            m_new,
            alpha * l_N + jnp.sum(p_NS, axis=1),
            alpha[:, None] * acc_NA + jnp.dot(p_NS, c_SA),
        )

    init = (
        jnp.full((rows,), NEG_INF, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
        jnp.zeros(ql_NA.shape, jnp.float32),
    )
    m_N, l_N, acc_NA = jax.lax.fori_loop(0, chunk // block, body, init)
    o_ref[0, 0] = acc_NA
    m_ref[0, 0] = m_N
    l_ref[0, 0] = l_N


def flash_decode_latent(
    q_lat_BNA,
    q_rope_BNP,
    c_new_BA,
    kr_new_BP,
    c_cache_BSA,
    kr_cache_BSP,
    pos_B,
    scale: float,
    splits: int | None = None,
):
    """MLA's absorbed decode fused (FlashMLA's shape of work): one latent KV head, the N query
    heads as the rows of every program, the cache split over `splits` programs per sequence and
    read once; returns the attention output in latent space [B, N, A] (f32 -> compute dtype)."""
    B, N, A = q_lat_BNA.shape
    P, S = q_rope_BNP.shape[-1], c_cache_BSA.shape[1]
    splits, chunk, block = decode_blocks(S, splits)
    target = platform()
    rows = N if target == "cpu" else max(N, MIN_ROWS)
    pad = ((0, 0), (0, rows - N), (0, 0))
    q_lat, q_rope = (jnp.pad(q, pad) if rows > N else q for q in (q_lat_BNA, q_rope_BNP))
    kernel = functools.partial(_latent_kernel, block=block, chunk=chunk, scale=scale)
    flops = 2 * B * N * S * (A + P) + 2 * B * N * S * A
    moved = (
        B * S * (A + P) * c_cache_BSA.dtype.itemsize
        + B * N * (A + P) * q_lat.dtype.itemsize
        + B * splits * N * (A + 2) * 4
    )
    cost = pl.CostEstimate(flops=flops, transcendentals=B * N * S, bytes_accessed=moved)
    with jax.named_scope(kernels.ATTENTION):
        acc, m, sums = pl.pallas_call(
            kernel,
            grid=(B, splits),
            in_specs=[
                pl.BlockSpec((1,), lambda b, s: (b,)),
                pl.BlockSpec((1, rows, A), lambda b, s: (b, 0, 0)),
                pl.BlockSpec((1, rows, P), lambda b, s: (b, 0, 0)),
                pl.BlockSpec((1, chunk, A), lambda b, s: (b, s, 0)),
                pl.BlockSpec((1, chunk, P), lambda b, s: (b, s, 0)),
            ],
            out_specs=[
                pl.BlockSpec((1, 1, rows, A), lambda b, s: (b, s, 0, 0)),
                pl.BlockSpec((1, 1, rows), lambda b, s: (b, s, 0)),
                pl.BlockSpec((1, 1, rows), lambda b, s: (b, s, 0)),
            ],
            out_shape=[
                jax.ShapeDtypeStruct((B, splits, rows, A), jnp.float32),
                jax.ShapeDtypeStruct((B, splits, rows), jnp.float32),
                jax.ShapeDtypeStruct((B, splits, rows), jnp.float32),
            ],
            interpret=target == "cpu",
            compiler_params=compiler_params(target),
            cost_estimate=cost,
            name=supplied_name("kvjax_flash_mla_decode", flops, moved),
        )(pos_B.astype(jnp.int32), q_lat, q_rope, c_cache_BSA, kr_cache_BSP)
    with jax.named_scope(kernels.ATTN_COMBINE):
        f32 = jnp.float32
        s_self_BN = (
            jnp.einsum("BNA,BA->BN", q_lat_BNA, c_new_BA, preferred_element_type=f32)
            + jnp.einsum("BNP,BP->BN", q_rope_BNP, kr_new_BP, preferred_element_type=f32)
        ) * scale
        o_BNA = combine(acc, m, sums, s_self_BN, c_new_BA[:, None])
        return o_BNA.astype(q_lat_BNA.dtype)
