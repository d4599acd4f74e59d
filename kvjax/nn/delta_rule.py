"""The gated delta rule of Gated DeltaNet (Qwen3-Next's linear attention) on an f32 state of
d_k x d_v per value head: one token (`step`, Hugging Face's `torch_recurrent_gated_delta_rule`)
and a prompt in chunks of 64 (`chunked`, its `torch_chunk_gated_delta_rule`).

Per value head, token t: S = exp(g_t) S; S = S + k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T q_t.
q and k stay on their q/k heads, each serving G value heads through an explicit group axis (never
repeated to the J value heads); q arrives L2-normalised and scaled by d_k^-0.5, k L2-normalised.

Letters (`kvjax.kernels.LETTERS`, read for DeltaNet as GQA reads them): B batch, T tokens, K the
q/k heads (state_groups: the keys' heads, as GQA's kv heads; the closed form's Y), G value heads
per q/k head, H = d_k, W = d_v; in chunked arrays n the chunk, T and S a query's and a key's
position inside it, E the right-hand sides of the chunk's triangular system (W + H). Every FLOP
is counted by `kvjax.analytic.hybrid.deltanet_scan`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

CHUNK = 64  # torch_chunk_gated_delta_rule's chunk_size, which Qwen3NextGatedDeltaNet keeps
_LOWER = np.tril(np.ones((CHUNK, CHUNK), bool))  # s <= t: what a position of a chunk sees


def step(q_BKH, k_BKH, v_BKGW, beta_BKG, g_BKG, state_BKGHW):
    """One token per sequence: (o_BKGW, the new state), all f32."""
    s = state_BKGHW * jnp.exp(g_BKG)[..., None, None]
    kv_BKGW = jnp.einsum("BKH,BKGHW->BKGW", k_BKH, s)
    delta_BKGW = (v_BKGW - kv_BKGW) * beta_BKG[..., None]
    s = s + k_BKH[:, :, None, :, None] * delta_BKGW[:, :, :, None, :]
    return jnp.einsum("BKH,BKGHW->BKGW", q_BKH, s), s


def chunked(q_BTKH, k_BTKH, v_BTKGW, beta_BTKG, g_BTKG, state_BKGHW=None):
    """A prompt from a zero state, or from `state_BKGHW` (an extend step on a cached state):
    (o_BTKGW, the state after the last token), all f32.

    Within a chunk everything is products over all its chunks at once (the UT transform of the
    DeltaNet paper, as Hugging Face computes it); from chunk to chunk the state is carried by one
    `lax.scan` of ceil(T / 64) steps. Tokens with beta = 0 and g = 0 (the padding to whole chunks,
    and right-padded prompts) leave the state as it was.
    """
    B, T, K, H = q_BTKH.shape
    G, W = v_BTKGW.shape[-2:]
    Z = CHUNK
    n = -(-T // Z)
    pad = n * Z - T

    def chunks(x):  # [B, T, ...] -> [B, n, 64, ...], zero-padded to whole chunks
        if pad:  # lax.pad with a constant zero: no scalar conversion to count
            x = jax.lax.pad(
                x, jnp.zeros((), x.dtype), [(0, 0, 0), (0, pad, 0)] + [(0, 0, 0)] * (x.ndim - 2)
            )
        return x.reshape(B, n, Z, *x.shape[2:])

    q_BnKTH, k_BnKTH = (chunks(x).transpose(0, 1, 3, 2, 4) for x in (q_BTKH, k_BTKH))
    v_BnKGTW = chunks(v_BTKGW).transpose(0, 1, 3, 4, 2, 5)
    beta_BnKGT = chunks(beta_BTKG).transpose(0, 1, 3, 4, 2)
    cum_BnKGT = jnp.cumsum(chunks(g_BTKG), axis=2).transpose(0, 1, 3, 4, 2)  # log decay so far
    e_BnKGT = jnp.exp(cum_BnKGT)
    # exp(cum_t - cum_s): the decay from s to t (masked before the exp: it would overflow above)
    diff_BnKGTS = cum_BnKGT[..., :, None] - cum_BnKGT[..., None, :]
    decay_BnKGTS = jnp.exp(jnp.where(_LOWER, diff_BnKGTS, -jnp.inf))
    # k k^T and q k^T once per q/k head; beta and the decays per value head
    kk_BnKTS = jnp.einsum("...KTH,...KSH->...KTS", k_BnKTH, k_BnKTH)
    qk_BnKTS = jnp.einsum("...KTH,...KSH->...KTS", q_BnKTH, k_BnKTH)
    # minus the UT system's lower part: -beta_t (k_t . k_s) exp(cum_t - cum_s)
    lower_BnKGTS = kk_BnKTS[:, :, :, None] * (-beta_BnKGT[..., None] * decay_BnKGTS)
    attn_BnKGTS = qk_BnKTS[:, :, :, None] * decay_BnKGTS
    # (I + strictly_lower) [u, w] = [v beta, k beta exp(cum)]: the new values u and the decayed
    # keys w that read the state at the chunk's start (HF solves it; kvjax inverts, as FLA does)
    kb_BnKGT = beta_BnKGT * e_BnKGT
    rhs_BnKGTE = jnp.concatenate(
        [v_BnKGTW * beta_BnKGT[..., None], k_BnKTH[:, :, :, None] * kb_BnKGT[..., None]], axis=-1
    )
    uw_BnKGTE = unit_lower_inverse(lower_BnKGTS) @ rhs_BnKGTE
    # the state read by q at t decays by exp(cum_t); k_t's write by exp(cum_last - cum_t)
    qe_BnKGTH = q_BnKTH[:, :, :, None] * e_BnKGT[..., None]
    tail_BnKGT = jnp.exp(cum_BnKGT[..., -1:] - cum_BnKGT)
    kd_BnKGTH = k_BnKTH[:, :, :, None] * tail_BnKGT[..., None]
    xs = (uw_BnKGTE, qe_BnKGTH, attn_BnKGTS, kd_BnKGTH, e_BnKGT[..., -1])

    def chunk_step(s_BKGHW, x):
        uw_BKGTE, qe_BKGTH, attn_BKGTS, kd_BKGTH, last_BKG = x
        u_BKGTW, w_BKGTH = uw_BKGTE[..., :W], uw_BKGTE[..., W:]
        new_BKGTW = u_BKGTW - jnp.einsum("BKGTH,BKGHW->BKGTW", w_BKGTH, s_BKGHW)
        o_BKGTW = jnp.einsum("BKGTH,BKGHW->BKGTW", qe_BKGTH, s_BKGHW) + jnp.einsum(
            "BKGTS,BKGSW->BKGTW", attn_BKGTS, new_BKGTW
        )
        s_BKGHW = s_BKGHW * last_BKG[..., None, None] + jnp.einsum(
            "BKGTH,BKGTW->BKGHW", kd_BKGTH, new_BKGTW
        )
        return s_BKGHW, o_BKGTW

    state = jnp.zeros((B, K, G, H, W), jnp.float32) if state_BKGHW is None else state_BKGHW
    state, o_nBKGTW = jax.lax.scan(chunk_step, state, jax.tree.map(_chunk_major, xs))
    o_BTKGW = o_nBKGTW.transpose(1, 0, 4, 2, 3, 5).reshape(B, n * Z, K, G, W)
    return o_BTKGW[:, :T], state


def _chunk_major(x):
    return jnp.moveaxis(x, 1, 0)


def unit_lower_inverse(neg_TS):
    """(I - strictly_lower(n))^-1 by doubling, as FLA's solve_tril builds it: with the inverses
    A, B of two neighbouring diagonal s-blocks of I - N and the block C of N below A, the
    2s-block's inverse is [[A, 0], [B C A, B]]; all blocks of one size at once, log2(Z) levels of
    two batched products (2Z s^2 FLOPs a level). Z a power of 2. Made of products, where XLA's
    triangular-solve is a LAPACK call on CPU (uncounted) and a Python forward substitution would
    unroll Z dependent steps (slow to compile)."""
    Z = neg_TS.shape[-1]
    lead = neg_TS.shape[:-2]
    inv = jnp.ones((*lead, Z, 1, 1), neg_TS.dtype)  # the unit diagonal's 1 x 1 blocks
    s = 1
    while s < Z:
        n = Z // (2 * s)
        c = _diagonal_blocks(neg_TS, 2 * s)[..., s:, :s]  # [..., n, s, s]
        pairs = inv.reshape(*lead, n, 2, s, s)
        a, b = pairs[..., 0, :, :], pairs[..., 1, :, :]
        x = b @ (c @ a)
        zero = jnp.zeros_like(a)
        inv = jnp.concatenate(
            [jnp.concatenate([a, zero], axis=-1), jnp.concatenate([x, b], axis=-1)], axis=-2
        )
        s *= 2
    return inv[..., 0, :, :]


def _diagonal_blocks(m_TS, size):
    """The diagonal size x size blocks of m [..., Z, Z] as [..., Z / size, size, size]: by
    reshapes and a strided slice (every (n+1)-th of the n^2 blocks), no arithmetic."""
    Z = m_TS.shape[-1]
    n = Z // size
    lead = m_TS.shape[:-2]
    blocks = m_TS.reshape(*lead, n, size, n, size).swapaxes(-3, -2)
    return blocks.reshape(*lead, n * n, size, size)[..., :: n + 1, :, :]
