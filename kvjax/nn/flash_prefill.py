"""kvjax's own FlashAttention-2 prefill in Pallas: causal (or banded) attention of T queries over
the same T positions, GQA read in place (a query head's program reads its KV head's K and V, no
repeat), only the blocks the mask reaches computed.

Letters: `kvjax.kernels`. Grid (query block, sequence, query head); each program keeps its
B_r x H query block on chip, walks the key blocks from the first its window reaches to the
diagonal one with an online softmax (Dao 2023, Algorithm 1), and writes its output block once.
The pairs it computes and the key positions it loads are exactly those of
`kvjax.analytic.flash.block_pairs`, which the closed form counts: the kernel's name carries that
cost to the compiled module (`kvjax.nn.flash.supplied_name`), since the Triton lowering drops
`pl.CostEstimate`.

Where it runs: compiled for a GPU target on a host without one (cuDNN's fused attention lowers
only with a CUDA driver present), on a GPU when asked for (`kvjax.nn.flash.lowering_for(...,
prefill="pallas")`), and in interpret mode on a CPU (exact values, tests; not a time).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kvjax.errors import KvjaxError

NEG_INF = -1e30


def _kernel(q_ref, k_ref, v_ref, o_ref, *, block_q: int, block_k: int, window: int, scale: float):
    """One (query block, sequence, query head): key blocks lo .. hi - 1 of its KV head."""
    iq = pl.program_id(0)
    q_QH = q_ref[...].astype(jnp.float32) * scale
    rows_Q = iq * block_q + jnp.arange(block_q)
    hi = ((iq + 1) * block_q - 1) // block_k + 1  # through the diagonal block
    lo = jnp.maximum(iq * block_q - window + 1, 0) // block_k if window else 0
    nt = (((1,), (1,)), ((), ()))  # q . k^T with k as stored, position-major

    def body(j, carry):
        m_Q, l_Q, acc_QH = carry
        k_KH = k_ref[pl.ds(j * block_k, block_k), :].astype(jnp.float32)
        v_KH = v_ref[pl.ds(j * block_k, block_k), :].astype(jnp.float32)
        s_QK = jax.lax.dot_general(q_QH, k_KH, nt)
        cols_K = j * block_k + jnp.arange(block_k)
        valid_QK = cols_K[None, :] <= rows_Q[:, None]
        if window:
            valid_QK = valid_QK & (cols_K[None, :] > rows_Q[:, None] - window)
        s_QK = jnp.where(valid_QK, s_QK, NEG_INF)
        m_new = jnp.maximum(m_Q, jnp.max(s_QK, axis=1))
        p_QK = jnp.where(valid_QK, jnp.exp(s_QK - m_new[:, None]), 0.0)
        alpha = jnp.exp(m_Q - m_new)
        return (
            m_new,
            alpha * l_Q + jnp.sum(p_QK, axis=1),
            alpha[:, None] * acc_QH + jnp.dot(p_QK, v_KH),
        )

    init = (
        jnp.full((block_q,), NEG_INF, jnp.float32),
        jnp.zeros((block_q,), jnp.float32),
        jnp.zeros(q_QH.shape, jnp.float32),
    )
    _, l_Q, acc_QH = jax.lax.fori_loop(lo, hi, body, init)
    o_ref[...] = (acc_QH / l_Q[:, None]).astype(o_ref.dtype)


def kernel_cost(
    B: int,
    N: int,
    K: int,
    T: int,
    H: int,
    itemsize: int,
    block_q: int,
    block_k: int,
    window: int = 0,
) -> tuple[int, int]:
    """(FLOPs, HBM bytes) of the kernel's own loop over a padded length T: each (query block,
    query head) computes block_q x (hi - lo) x block_k pairs and loads those key positions' K
    and V; Q read and O written once. Counted from the loop bounds above, not from the closed
    form (which tests compare it with)."""
    pairs = loaded = 0
    for iq in range(T // block_q):
        hi = ((iq + 1) * block_q - 1) // block_k + 1
        lo = max(iq * block_q - window + 1, 0) // block_k if window else 0
        pairs += block_q * (hi - lo) * block_k
        loaded += (hi - lo) * block_k
    flops = B * N * pairs * 4 * H
    moved = (2 * B * T * N * H + B * N * loaded * 2 * H) * itemsize
    return flops, moved


def flash_prefill(
    q_BTKGH,
    k_BSKH,
    v_BSKH,
    *,
    window: int = 0,
    scale: float | None = None,
    block_q: int = 128,
    block_k: int = 128,
    interpret: bool = False,
    compiler_params=None,
    name=None,
):
    """Causal attention [B, T, K, G, H] fused; T padded up to a multiple of both blocks (the
    padded keys lie after every real query, so the mask drops them; padded rows are cut)."""
    B, T, K, G, H = q_BTKGH.shape
    N = K * G
    if not interpret and H & (H - 1):
        raise KvjaxError(
            f"kvjax's Pallas prefill compiled for Triton needs a power-of-two head width; this "
            f"attention's is {H} (MLA prefills over qk_nope_head_dim + qk_rope_head_dim keys); "
            "its closed form is in `kvjax calc --attention-kernel flash --phase prefill`, and the "
            "decode's latent kernel compiles"
        )
    scale = 1.0 / math.sqrt(H) if scale is None else scale
    step = math.lcm(block_q, block_k)
    Tp = -(-T // step) * step
    q_BTNH = q_BTKGH.reshape(B, T, N, H)
    v_BSKH = v_BSKH.astype(q_BTKGH.dtype)
    if Tp != T:
        pad = ((0, 0), (0, Tp - T), (0, 0), (0, 0))
        q_BTNH, k_BSKH, v_BSKH = (jnp.pad(x, pad) for x in (q_BTNH, k_BSKH, v_BSKH))
    flops, moved = kernel_cost(B, N, K, Tp, H, q_BTNH.dtype.itemsize, block_q, block_k, window)
    kernel = functools.partial(
        _kernel, block_q=block_q, block_k=block_k, window=window, scale=scale
    )
    kv_spec = pl.BlockSpec((None, Tp, None, H), lambda i, b, n: (b, 0, n // G, 0))
    q_spec = pl.BlockSpec((None, block_q, None, H), lambda i, b, n: (b, i, n, 0))
    o_BTNH = pl.pallas_call(
        kernel,
        grid=(Tp // block_q, B, N),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q_BTNH.shape, q_BTNH.dtype),
        interpret=interpret,
        compiler_params=compiler_params,
        cost_estimate=pl.CostEstimate(
            flops=flops, transcendentals=flops // (4 * H), bytes_accessed=moved
        ),
        name=name(flops, moved) if name else None,
    )(q_BTNH, k_BSKH, v_BSKH)
    return o_BTNH[:, :T].reshape(B, T, K, G, H)
