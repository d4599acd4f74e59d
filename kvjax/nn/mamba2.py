"""Falcon-H1's Mamba-2 mixer (layer kind "H"): in_proj to the gate z, the conv channels (x, B, C)
and dt; a short causal depthwise conv with bias and silu; dt = softplus(dt + dt_bias) clamped to
Hugging Face's default time_step_limit (0, inf); A = -exp(A_log); the SSD scan with the D skip;
y * silu(z), or with `cfg.state_norm` Falcon-H1's gated RMSNorm over the B/C groups; out_proj.
As transformers 5.24's FalconH1Mixer runs it (`torch_forward`): prefill is `mamba2_chunk_scan`
(chunks of `cfg.scan_chunk`, vectorised over the chunks, the inter-chunk recurrence a product
over all chunk pairs), decode `mamba2_selective_state_update`. Falcon-H1's muP multipliers are
not here: the loader folds them into ssm_in_proj / ssm_out_proj.

Where the JAX differs from that code's arithmetic (same values; the closed form,
`kvjax.analytic.hybrid.mamba_scan`, counts this one):
- B and C keep their group axis (K groups of G = J / K heads, as GQA's kv heads) instead of being
  repeated to the J heads, so C B^T is one product per group.
- dt and exp(dt * A) are per head (HF's decode expands dt and A to [J, P, N] first).
- Within a chunk the decays are exp(cs_l - cs_s) of the cumulative sums cs (HF sums masked
  copies, `segment_sum`); likewise across chunks. dt is computed in f32.
- The gated norm's order is `cfg.state_norm_before_gate`: False (RMSNorm(y * silu(z)), what
  Falcon-H1's config.json files set and what HF's fused training path always runs), True
  (RMSNorm(y) * silu(z): FalconH1Config's default, what a config omitting the key gets).
- Right padding: dt is clamped to 0 at padded tokens (exp(0) = 1 decay, no input), so they leave
  the state as it was; the conv cache is gathered at each sequence's length.

Letters (local to this module; einsums use `kvjax.kernels.LETTERS`' set): B batch, T tokens, D
d_model, J heads, K groups (state_groups, B and C shared as GQA shares kv heads), G = J / K heads
a group, P head dim (state_value_dim), N state size (state_key_dim), E = J * P, X = E + 2 K N
conv channels, w = conv_kernel, W = w - 1 cached conv rows, Q chunks, L and S positions in a
chunk (Z = scan_chunk), R and C the chunk boundaries receiving and contributing a state (Q + 1:
the zero initial state first).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvjax import kernels
from kvjax.model.config import ModelConfig
from kvjax.nn.layers import act_dtype, linear, param, read, weight_dtype

SOFTPLUS_THRESHOLD = 20.0  # torch's F.softplus: x itself above it
F32 = jnp.float32


class Mamba2(nnx.Module):
    """The Mamba-2 half of a Falcon-H1 layer; parameters named as `kvjax.nn` maps them to kernels,
    rows in Hugging Face's order (in_proj: z, x, B, C, dt)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.norm_before_gate = cfg.state_norm_before_gate  # HF's mamba_norm_before_gate
        D, J, K = cfg.d_model, cfg.state_heads, cfg.state_groups
        N, P, w = cfg.state_key_dim, cfg.state_value_dim, cfg.conv_kernel
        E = J * P
        X = E + 2 * K * N
        wd = weight_dtype(cfg)
        self.ssm_in_proj = param(rngs, (E + X + J, D), D, cfg)
        self.ssm_conv = param(rngs, (X, w), w, cfg)  # HF's conv1d.weight [X, 1, w] squeezed
        self.ssm_conv_bias = nnx.Param(jnp.zeros((X,), wd)) if cfg.conv_bias else None
        self.ssm_dt_bias = nnx.Param(jnp.ones((J,), wd))
        self.ssm_A_log = nnx.Param(jnp.log(jnp.arange(1, J + 1, dtype=F32)).astype(wd))
        self.ssm_D = nnx.Param(jnp.ones((J,), wd))
        self.ssm_norm = nnx.Param(jnp.ones((E,), wd)) if cfg.state_norm else None
        self.ssm_out_proj = param(rngs, (D, E), E, cfg)

    # ---- the pieces, each in its kernel's scope ------------------------------------------------
    def _in_proj(self, x_BTD):
        cfg = self.cfg
        E, J = cfg.state_heads * cfg.state_value_dim, cfg.state_heads
        with jax.named_scope(kernels.SSM_IN_PROJ):
            zxbcdt = linear(x_BTD, read(self.ssm_in_proj, cfg))
        X = zxbcdt.shape[-1] - E - J
        return zxbcdt[..., :E], zxbcdt[..., E : E + X], zxbcdt[..., E + X :]

    def _conv_out(self, y_BTX):
        """+ bias, silu (the conv's tail)."""
        if self.ssm_conv_bias is not None:
            y_BTX = y_BTX + read(self.ssm_conv_bias, self.cfg)
        return jax.nn.silu(y_BTX)

    def _dt(self, dt_BTJ, upper):
        """softplus(dt + dt_bias) clamped to [0, upper] (HF's time_step_limit (0, inf); `upper`
        0 at padded tokens), in f32; and A = -exp(A_log)."""
        cfg = self.cfg
        with jax.named_scope(kernels.SSM_DT):
            A_J = -jnp.exp(read(self.ssm_A_log, cfg).astype(F32))
            dt = dt_BTJ.astype(F32) + read(self.ssm_dt_bias, cfg).astype(F32)
            dt = jnp.where(dt > SOFTPLUS_THRESHOLD, dt, jnp.log1p(jnp.exp(dt)))
            if not isinstance(upper, float):
                upper = jnp.broadcast_to(upper[..., None], dt.shape)
            dt = jax.lax.clamp(0.0, dt, upper)
        return dt, A_J

    def _gate(self, y_BTE, z_BTE):
        """y * silu(z); with state_norm an RMSNorm over K groups after it, or before it
        (state_norm_before_gate); in f32, as FalconH1RMSNormGated."""
        cfg = self.cfg
        with jax.named_scope(kernels.SSM_NORM):
            gate = jax.nn.silu(z_BTE.astype(F32))
            if self.ssm_norm is None:
                return (y_BTE * gate).astype(act_dtype(cfg))
            if not self.norm_before_gate:
                y_BTE = y_BTE * gate
            *lead, E = y_BTE.shape
            K = cfg.state_groups
            y = y_BTE.reshape(*lead, K, E // K)
            inv = jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + cfg.norm_eps)
            w = read(self.ssm_norm, cfg).astype(F32).reshape(K, E // K)
            y_BTE = (y * inv * w).reshape(*lead, E)
            if self.norm_before_gate:
                y_BTE = y_BTE * gate
            return y_BTE.astype(act_dtype(cfg))

    def _out_proj(self, y_BTE):
        with jax.named_scope(kernels.SSM_OUT_PROJ):
            return linear(y_BTE, read(self.ssm_out_proj, self.cfg))

    def _split(self, xbc, lead):
        """The conv's channels as x [..., K, G, P], B and C [..., K, N], in f32."""
        cfg = self.cfg
        J, K, N, P = cfg.state_heads, cfg.state_groups, cfg.state_key_dim, cfg.state_value_dim
        E = J * P
        xbc = xbc.astype(F32)
        x = xbc[..., :E].reshape(*lead, K, J // K, P)
        b = xbc[..., E : E + K * N].reshape(*lead, K, N)
        c = xbc[..., E + K * N :].reshape(*lead, K, N)
        return x, b, c

    # ---- the interface ---------------------------------------------------------------------------
    def __call__(
        self, x_BTD: jax.Array, valid_BT: jax.Array | None = None, conv_BWX=None, state_BJPN=None
    ):
        """Prefill from a zero state, or an extend step from a cached `conv_BWX` and
        `state_BJPN`: (y_BTD, conv_BWX, state_BJPN); see kvjax/nn's mixers."""
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        J, P, N, W = cfg.state_heads, cfg.state_value_dim, cfg.state_key_dim, cfg.conv_kernel - 1
        upper, rows_BW = float("inf"), None
        if valid_BT is not None:  # bookkeeping of the padding, outside every kernel
            upper = jnp.where(valid_BT, jnp.inf, 0.0).astype(F32)
            length_B = jnp.sum(valid_BT.astype(jnp.int32), axis=1)
            rows_BW = length_B[:, None] + jnp.arange(W)[None, :]
        z_BTE, xbc_BTX, dt_BTJ = self._in_proj(x_BTD)
        with jax.named_scope(kernels.SSM_CONV):
            w_XW1 = read(self.ssm_conv, cfg)
            if conv_BWX is None:
                pad_BTX = _pad(xbc_BTX, 1, W, 0)  # W zero rows before the start
            else:  # extend: the cached inputs before the start
                pad_BTX = jnp.concatenate([conv_BWX.astype(xbc_BTX.dtype), xbc_BTX], axis=1)
            acc = pad_BTX[:, 0:T] * w_XW1[:, 0]
            for k in range(1, W + 1):  # w products, w - 1 sums an output
                acc = acc + pad_BTX[:, k : k + T] * w_XW1[:, k]
            conv_BTX = self._conv_out(acc)
            if rows_BW is None:
                conv_BWX = pad_BTX[:, T:]
            else:
                rows = rows_BW[:, :, None]  # in bounds: length + W - 1 < T + W
                conv_BWX = jnp.take_along_axis(pad_BTX, rows, 1, mode="promise_in_bounds")
        dt_BTJ, A_J = self._dt(dt_BTJ, upper)
        with jax.named_scope(kernels.SSM_SCAN):
            x, b, c = self._split(conv_BTX, (B, T))
            K = cfg.state_groups
            start = None if state_BJPN is None else state_BJPN.reshape(B, K, J // K, P, N)
            y_BTKGP, state = chunk_scan(
                x, dt_BTJ, A_J, b, c, read(self.ssm_D, cfg), cfg.scan_chunk, start
            )
        y_BTD = self._out_proj(self._gate(y_BTKGP.reshape(B, T, J * P), z_BTE))
        return y_BTD, conv_BWX, state.reshape(B, J, P, N)

    def step(self, x_B1D: jax.Array, conv_BWX: jax.Array, state):
        """Decode one token per sequence: (y_B1D, conv_BWX, state_BJPN)."""
        cfg = self.cfg
        B, W = x_B1D.shape[0], cfg.conv_kernel - 1
        J, K, N, P = cfg.state_heads, cfg.state_groups, cfg.state_key_dim, cfg.state_value_dim
        z_B1E, xbc_B1X, dt_B1J = self._in_proj(x_B1D)
        with jax.named_scope(kernels.SSM_CONV):
            win_BwX = jnp.concatenate([conv_BWX.astype(xbc_B1X.dtype), xbc_B1X], axis=1)
            w_XW1 = read(self.ssm_conv, cfg)
            acc = win_BwX[:, 0:1] * w_XW1[:, 0]
            for k in range(1, W + 1):  # as in prefill (jnp.sum would widen bf16 to f32)
                acc = acc + win_BwX[:, k : k + 1] * w_XW1[:, k]
            conv_B1X = self._conv_out(acc)
            conv_BWX = win_BwX[:, 1:]
        dt_B1J, A_J = self._dt(dt_B1J, float("inf"))
        state_BKGPN = state.reshape(B, K, J // K, P, N)
        with jax.named_scope(kernels.SSM_SCAN):
            x, b, c = self._split(conv_B1X[:, 0], (B,))
            dt_BKG = dt_B1J.reshape(B, K, J // K)
            dA_BKG = jnp.exp(dt_BKG * A_J.reshape(K, J // K))
            dtx_BKGP = x * dt_BKG[..., None]
            state_BKGPN = state_BKGPN * dA_BKG[..., None, None] + (
                dtx_BKGP[..., None] * b[:, :, None, None, :]
            )
            y_BKGP = jnp.einsum("BKGPN,BKN->BKGP", state_BKGPN, c)
            y_BKGP = y_BKGP + x * read(self.ssm_D, cfg).astype(F32).reshape(K, J // K, 1)
        y_B1D = self._out_proj(self._gate(y_BKGP.reshape(B, 1, J * P), z_B1E))
        return y_B1D, conv_BWX, state_BKGPN.reshape(B, J, P, N)


def _pad(a, axis: int, before: int, after: int):
    """Zeros along `axis` (lax.pad: jnp.pad adds a scalar op to the count)."""
    config = [(0, 0, 0)] * a.ndim
    config[axis] = (before, after, 0)
    return jax.lax.pad(a, jnp.zeros((), a.dtype), config)


def _segment_decay(cs_Z, mask_ZZ):
    """exp(cs_l - cs_s) for s <= l, 0 above the diagonal: [..., Z, Z] from [..., Z]."""
    diff = cs_Z[..., :, None] - cs_Z[..., None, :]
    return jnp.exp(jnp.where(mask_ZZ, diff, -jnp.inf))


def chunk_scan(x_BTKGP, dt_BTJ, A_J, b_BTKN, c_BTKN, D_J, Z: int, state_BKGPN=None):
    """The SSD of `mamba2_chunk_scan` from a zero state, or from `state_BKGPN` (an extend step on
    a cached state), f32: y [B, T, K, G, P] with the D skip, and the final state [B, K, G, P, N].
    Padded tokens (dt = 0) and the chunks' padding change nothing."""
    B, T, K, G, P = x_BTKGP.shape
    Q = -(-T // Z)
    pad = Q * Z - T
    dt_BTKG = dt_BTJ.reshape(B, T, K, G)
    dtA_BTKG = dt_BTKG * A_J.reshape(K, G)
    xdt_BTKGP = x_BTKGP * dt_BTKG[..., None]

    def chunks(a):  # [B, T, ...] -> [B, Q, Z, ...], zeros after T
        return _pad(a, 1, 0, pad).reshape(B, Q, Z, *a.shape[2:])

    xdt, b, c = chunks(xdt_BTKGP), chunks(b_BTKN), chunks(c_BTKN)
    cs_BKGQL = jnp.cumsum(chunks(dtA_BTKG).transpose(0, 3, 4, 1, 2), axis=-1)
    # 1. within each chunk: (C B^T * decay) x, C B^T once per group
    L_BKGQLS = _segment_decay(cs_BKGQL, np.tril(np.ones((Z, Z), bool)))
    g_BKQLS = jnp.einsum("BQLKN,BQSKN->BKQLS", c, b)
    m_BKGQLS = g_BKQLS[:, :, None] * L_BKGQLS
    y_BQLKGP = jnp.einsum("BKGQLS,BQSKGP->BQLKGP", m_BKGQLS, xdt)
    # 2. each chunk's own final state
    decay_BKGQL = jnp.exp(cs_BKGQL[..., -1:] - cs_BKGQL)
    b_decay = b[:, :, :, :, None, :] * decay_BKGQL.transpose(0, 3, 4, 1, 2)[..., None]
    states_BQKGPN = jnp.einsum("BQLKGN,BQLKGP->BQKGPN", b_decay, xdt)
    # 3. the states entering each chunk: all chunk pairs, after a zero initial state
    total_BKGC = _pad(cs_BKGQL[..., -1], 3, 1, 0)
    mask_RC = np.tril(np.ones((Q + 1, Q + 1), bool))
    decay_BKGRC = _segment_decay(jnp.cumsum(total_BKGC, axis=-1), mask_RC)
    if state_BKGPN is None:
        states = _pad(states_BQKGPN, 1, 1, 0)
    else:  # the cached state enters the first chunk as chunk 0's own state would
        states = jnp.concatenate([state_BKGPN[:, None].astype(F32), states_BQKGPN], axis=1)
    new_BRKGPN = jnp.einsum("BKGRC,BCKGPN->BRKGPN", decay_BKGRC, states)
    # 4. the entering states' contribution: C S * exp(cs)
    out_decay_BQLKG = jnp.exp(cs_BKGQL).transpose(0, 3, 4, 1, 2)
    y_off = jnp.einsum("BQLKN,BQKGPN->BQLKGP", c, new_BRKGPN[:, :-1])
    y_BQLKGP = y_BQLKGP + y_off * out_decay_BQLKG[..., None]
    y_BTKGP = y_BQLKGP.reshape(B, Q * Z, K, G, P)[:, :T]
    y_BTKGP = y_BTKGP + x_BTKGP * D_J.astype(F32).reshape(K, G, 1)
    return y_BTKGP, new_BRKGPN[:, -1]
