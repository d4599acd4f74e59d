"""The gated delta rule of Gated DeltaNet (Qwen3-Next's linear attention) on an f32 state of
d_k x d_v per value head: one token (`step`, Hugging Face's `torch_recurrent_gated_delta_rule`)
and a prompt in chunks of 64 (`chunked`, its `torch_chunk_gated_delta_rule`).

Per value head, token t: S = exp(g_t) S; S = S + k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T q_t.
q and k stay on their Y heads, each serving G = J / Y value heads through an explicit group axis
(never repeated to J heads); q arrives L2-normalised and scaled by d_k^-0.5, k L2-normalised.

Letters: B batch, T tokens, Y q/k heads, G value heads per q/k head, K = d_k, V = d_v, C chunks,
Z and U positions inside a chunk, R the right-hand sides of the triangular solve (V + K).
Every FLOP is counted by `kvjax.analytic.hybrid.deltanet_scan`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

CHUNK = 64  # torch_chunk_gated_delta_rule's chunk_size, which Qwen3NextGatedDeltaNet keeps
_LOWER = np.tril(np.ones((CHUNK, CHUNK), bool))  # u <= z: what a position of a chunk sees


def step(q_BYK, k_BYK, v_BYGV, beta_BYG, g_BYG, state_BYGKV):
    """One token per sequence: (o_BYGV, the new state), all f32."""
    s = state_BYGKV * jnp.exp(g_BYG)[..., None, None]
    kv_BYGV = jnp.einsum("BYK,BYGKV->BYGV", k_BYK, s)
    delta_BYGV = (v_BYGV - kv_BYGV) * beta_BYG[..., None]
    s = s + k_BYK[:, :, None, :, None] * delta_BYGV[:, :, :, None, :]
    return jnp.einsum("BYK,BYGKV->BYGV", q_BYK, s), s


def chunked(q_BTYK, k_BTYK, v_BTYGV, beta_BTYG, g_BTYG):
    """A prompt from a zero state: (o_BTYGV, the state after the last token), all f32.

    Within a chunk everything is products over all its chunks at once (the UT transform of the
    DeltaNet paper, as Hugging Face computes it); from chunk to chunk the state is carried by one
    `lax.scan` of ceil(T / 64) steps. Tokens with beta = 0 and g = 0 (the padding to whole chunks,
    and right-padded prompts) leave the state as it was.
    """
    B, T, Y, K = q_BTYK.shape
    G, V = v_BTYGV.shape[-2:]
    Z = CHUNK
    C = -(-T // Z)
    pad = C * Z - T

    def chunks(x):  # [B, T, ...] -> [B, C, Z, ...], zero-padded to whole chunks
        if pad:  # lax.pad with a constant zero: no scalar conversion to count
            x = jax.lax.pad(
                x, jnp.zeros((), x.dtype), [(0, 0, 0), (0, pad, 0)] + [(0, 0, 0)] * (x.ndim - 2)
            )
        return x.reshape(B, C, Z, *x.shape[2:])

    q_BCZYK, k_BCZYK, v_BCZYGV = chunks(q_BTYK), chunks(k_BTYK), chunks(v_BTYGV)
    beta_BCYGZ = chunks(beta_BTYG).transpose(0, 1, 3, 4, 2)
    cum_BCYGZ = jnp.cumsum(chunks(g_BTYG), axis=2).transpose(0, 1, 3, 4, 2)  # log decay so far
    e_BCYGZ = jnp.exp(cum_BCYGZ)
    # exp(cum_z - cum_u): the decay from u to z (masked before the exp: it would overflow above)
    diff_BCYGZU = cum_BCYGZ[..., :, None] - cum_BCYGZ[..., None, :]
    decay_BCYGZU = jnp.exp(jnp.where(_LOWER, diff_BCYGZU, -jnp.inf))
    # k k^T and q k^T once per q/k head; beta and the decays per value head
    kk_BCYZU = jnp.einsum("BCZYK,BCUYK->BCYZU", k_BCZYK, k_BCZYK)
    qk_BCYZU = jnp.einsum("BCZYK,BCUYK->BCYZU", q_BCZYK, k_BCZYK)
    # minus the UT system's lower part: -beta_z (k_z . k_u) exp(cum_z - cum_u)
    lower_BCYGZU = kk_BCYZU[:, :, :, None] * (-beta_BCYGZ[..., None] * decay_BCYGZU)
    attn_BCYGZU = qk_BCYZU[:, :, :, None] * decay_BCYGZU
    # (I + strictly_lower) [u, w] = [v beta, k beta exp(cum)]: the new values u and the decayed
    # keys w that read the state at the chunk's start (HF solves it; kvjax inverts, as FLA does)
    v_BCYGZV = v_BCZYGV.transpose(0, 1, 3, 4, 2, 5)
    kb_BCYGZ = beta_BCYGZ * e_BCYGZ
    rhs_BCYGZR = jnp.concatenate(
        [
            v_BCYGZV * beta_BCYGZ[..., None],
            k_BCZYK.transpose(0, 1, 3, 2, 4)[:, :, :, None] * kb_BCYGZ[..., None],
        ],
        axis=-1,
    )
    inv_BCYGZU = unit_lower_inverse(lower_BCYGZU)
    uw_BCYGZR = jnp.einsum("BCYGZU,BCYGUR->BCYGZR", inv_BCYGZU, rhs_BCYGZR)
    # the state read by q at z decays by exp(cum_z); k_z's write by exp(cum_last - cum_z)
    qe_BCYGZK = q_BCZYK.transpose(0, 1, 3, 2, 4)[:, :, :, None] * e_BCYGZ[..., None]
    tail_BCYGZ = jnp.exp(cum_BCYGZ[..., -1:] - cum_BCYGZ)
    kd_BCYGZK = k_BCZYK.transpose(0, 1, 3, 2, 4)[:, :, :, None] * tail_BCYGZ[..., None]
    xs = (uw_BCYGZR, qe_BCYGZK, attn_BCYGZU, kd_BCYGZK, e_BCYGZ[..., -1])

    def chunk_step(s_BYGKV, x):
        uw_BYGZR, qe_BYGZK, attn_BYGZU, kd_BYGZK, last_BYG = x
        u_BYGZV, w_BYGZK = uw_BYGZR[..., :V], uw_BYGZR[..., V:]
        v_new = u_BYGZV - jnp.einsum("BYGZK,BYGKV->BYGZV", w_BYGZK, s_BYGKV)
        o_BYGZV = jnp.einsum("BYGZK,BYGKV->BYGZV", qe_BYGZK, s_BYGKV) + jnp.einsum(
            "BYGZU,BYGUV->BYGZV", attn_BYGZU, v_new
        )
        s_BYGKV = s_BYGKV * last_BYG[..., None, None] + jnp.einsum(
            "BYGZK,BYGZV->BYGKV", kd_BYGZK, v_new
        )
        return s_BYGKV, o_BYGZV

    state = jnp.zeros((B, Y, G, K, V), jnp.float32)
    state, o_CBYGZV = jax.lax.scan(chunk_step, state, jax.tree.map(_chunk_major, xs))
    o_BTYGV = o_CBYGZV.transpose(1, 0, 4, 2, 3, 5).reshape(B, C * Z, Y, G, V)
    return o_BTYGV[:, :T], state


def _chunk_major(x):
    return jnp.moveaxis(x, 1, 0)


def unit_lower_inverse(n_NZU):
    """(I - strictly_lower(n))^-1 by doubling, as FLA's solve_tril builds it: with the inverses
    A, B of two neighbouring diagonal s-blocks of I - N and the block C of N below A, the
    2s-block's inverse is [[A, 0], [B C A, B]]; all blocks of one size at once, log2(Z) levels of
    two batched products (2Z s^2 FLOPs a level). Z a power of 2. Made of products, where XLA's
    triangular-solve is a LAPACK call on CPU (uncounted) and a Python forward substitution would
    unroll Z dependent steps (slow to compile)."""
    Z = n_NZU.shape[-1]
    lead = n_NZU.shape[:-2]
    inv = jnp.ones((*lead, Z, 1, 1), n_NZU.dtype)  # the unit diagonal's 1 x 1 blocks
    s = 1
    while s < Z:
        n = Z // (2 * s)
        c = _diagonal_blocks(n_NZU, 2 * s)[..., s:, :s]  # [..., n, s, s]
        pairs = inv.reshape(*lead, n, 2, s, s)
        a, b = pairs[..., 0, :, :], pairs[..., 1, :, :]
        x = jnp.einsum("...ij,...jk->...ik", b, jnp.einsum("...ij,...jk->...ik", c, a))
        zero = jnp.zeros_like(a)
        inv = jnp.concatenate(
            [jnp.concatenate([a, zero], axis=-1), jnp.concatenate([x, b], axis=-1)], axis=-2
        )
        s *= 2
    return inv[..., 0, :, :]


def _diagonal_blocks(m_NZU, size):
    """The diagonal size x size blocks of m [..., Z, Z] as [..., Z / size, size, size]: by
    reshapes and a strided slice (every (n+1)-th of the n^2 blocks), no arithmetic."""
    Z = m_NZU.shape[-1]
    n = Z // size
    lead = m_NZU.shape[:-2]
    blocks = m_NZU.reshape(*lead, n, size, n, size).swapaxes(-3, -2)
    return blocks.reshape(*lead, n * n, size, size)[..., :: n + 1, :, :]
