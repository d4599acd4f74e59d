"""Gated DeltaNet, the linear-attention mixer of Qwen3-Next's D layers, as transformers 5.24's
Qwen3NextGatedDeltaNet runs it: in_proj_qkvz and in_proj_ba (rows grouped by q/k head, kept in
Hugging Face's order), a causal depthwise conv of width w over q, k, v and silu, beta = sigmoid(b),
g = -exp(A_log) softplus(a + dt_bias), q and k L2-normalised (q also by d_k^-0.5), the gated delta
rule (`kvjax.nn.delta_rule`), RMSNorm of each head's output times silu(z) in f32, out_proj.

Letters (`kvjax.kernels.LETTERS`, read for DeltaNet as in `kvjax.nn.delta_rule`): B batch, T
tokens, D d_model, K the q/k heads (state_groups), G value heads per q/k head, J = K G value heads
(state_heads), H = d_k, W = d_v, X the conv's channels (2 K H + J W), C the conv cache's w - 1
cached rows, E a projection's output width. Each piece runs in the named scope of its kernel, in
the order of `kvjax.analytic.hybrid.mixer_kernels(cfg, wl, "D")`, which counts it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kvjax import kernels
from kvjax.model.config import ModelConfig
from kvjax.nn import delta_rule
from kvjax.nn.layers import linear, param, read, weight_dtype
from kvjax.nn.sharding import DATA, MODEL, constrain

L2_EPS = 1e-6  # Hugging Face's l2norm (the FLA library's)
SOFTPLUS_THRESHOLD = 20.0  # torch's F.softplus: x itself above it


class GatedDeltaNet(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        D, J, K = cfg.d_model, cfg.state_heads, cfg.state_groups
        H, W, w = cfg.state_key_dim, cfg.state_value_dim, cfg.conv_kernel
        self.heads = (K, J // K, H, W)
        # per q/k head: [q (H); k (H); v (G W); z (G W)] and [b (G); a (G)], as HF stores them
        self.in_proj_qkvz = param(rngs, (2 * K * H + 2 * J * W, D), D, cfg)
        self.in_proj_ba = param(rngs, (2 * J, D), D, cfg)
        self.linear_conv = param(rngs, (2 * K * H + J * W, w), w, cfg)  # HF's [X, 1, w] squeezed
        self.dt_bias = nnx.Param(jnp.ones((J,), weight_dtype(cfg)))
        self.A_log = nnx.Param(jnp.zeros((J,), weight_dtype(cfg)))  # A = 1 until loaded
        self.linear_norm = nnx.Param(jnp.ones((W,), weight_dtype(cfg)))
        self.linear_out_proj = param(rngs, (D, J * W), J * W, cfg)
        # > 1 once sharded over tp (kvjax.nn.sharding): the conv's channels in tp blocks
        # [q_d; k_d; v_d], each device's q/k heads and their value heads, not HF's [q; k; v]
        self.conv_blocks = 1

    def __call__(self, x_BTD, valid_BT=None, conv_BCX=None, state_BJHW=None):
        """Prefill from a zero state, or an extend step from a cached `conv_BCX` and
        `state_BJHW`: (y_BTD, conv_BCX, the f32 state [B, J, H, W]). Padded tokens (valid_BT
        False) get beta = g = 0, which leaves the state unchanged, and the conv cache is read at
        each sequence's length."""
        B, T, _ = x_BTD.shape
        w = self.cfg.conv_kernel
        K, G, H, W = self.heads
        with jax.named_scope(kernels.LINEAR_IN_PROJ):
            qkvz_BTE, ba_BTE = self._project(x_BTD)
        with jax.named_scope(kernels.LINEAR_CONV):
            qkv_BTX = self._qkv(qkvz_BTE)
            # zeros before the start: the w - 1 rows a causal conv of the first token reads
            if conv_BCX is None:
                zero = jnp.zeros((), qkv_BTX.dtype)
                pad_BSX = jax.lax.pad(qkv_BTX, zero, ((0, 0, 0), (w - 1, 0, 0), (0, 0, 0)))
            else:  # extend: the cached inputs before the start
                pad_BSX = jnp.concatenate([conv_BCX.astype(qkv_BTX.dtype), qkv_BTX], axis=1)
            qkv_BTX = self._conv(pad_BSX, T)
            if valid_BT is None:
                conv_BCX = pad_BSX[:, T:]
            else:  # the w - 1 inputs before each sequence's end (its length in the padded rows)
                length_B = jnp.sum(valid_BT, axis=1)
                conv_BCX = jax.vmap(
                    lambda p_SX, n: jax.lax.dynamic_slice_in_dim(p_SX, n, w - 1, axis=0)
                )(pad_BSX, length_B)
        with jax.named_scope(kernels.LINEAR_GATES):
            beta_BTJ, g_BTJ = self._gates(ba_BTE)
            if valid_BT is not None:
                beta_BTJ = jnp.where(valid_BT[..., None], beta_BTJ, 0.0)
                g_BTJ = jnp.where(valid_BT[..., None], g_BTJ, 0.0)
        with jax.named_scope(kernels.LINEAR_QK_NORM):
            q_BTKH, k_BTKH, v_BTKGW = self._split_normed(qkv_BTX)
        with jax.named_scope(kernels.LINEAR_SCAN):
            o_BTKGW, state_BKGHW = delta_rule.chunked(
                q_BTKH,
                k_BTKH,
                v_BTKGW.astype(jnp.float32),
                beta_BTJ.reshape(B, T, K, G),
                g_BTJ.reshape(B, T, K, G),
                None if state_BJHW is None else state_BJHW.reshape(B, K, G, H, W),
            )
            o_BTJW = o_BTKGW.reshape(B, T, K * G, W).astype(x_BTD.dtype)
        y_BTD = self._output(o_BTJW, qkvz_BTE)
        return y_BTD, conv_BCX, state_BKGHW.reshape(B, K * G, H, W)

    def step(self, x_B1D, conv_BCX, state_BJHW):
        """One token per sequence from the conv cache and the state: (y_B1D, conv, state)."""
        B = x_B1D.shape[0]
        K, G, H, W = self.heads
        with jax.named_scope(kernels.LINEAR_IN_PROJ):
            qkvz_B1E, ba_B1E = self._project(x_B1D)
        with jax.named_scope(kernels.LINEAR_CONV):
            qkv_B1X = self._qkv(qkvz_B1E).astype(conv_BCX.dtype)
            window_BSX = jnp.concatenate([conv_BCX, qkv_B1X], axis=1)
            qkv_B1X = self._conv(window_BSX, 1)
            conv_BCX = window_BSX[:, 1:]
        with jax.named_scope(kernels.LINEAR_GATES):
            beta_B1J, g_B1J = self._gates(ba_B1E)
        with jax.named_scope(kernels.LINEAR_QK_NORM):
            q_B1KH, k_B1KH, v_B1KGW = self._split_normed(qkv_B1X)
        with jax.named_scope(kernels.LINEAR_SCAN):
            o_BKGW, state_BKGHW = delta_rule.step(
                q_B1KH[:, 0],
                k_B1KH[:, 0],
                v_B1KGW[:, 0].astype(jnp.float32),
                beta_B1J.reshape(B, K, G),
                g_B1J.reshape(B, K, G),
                state_BJHW.reshape(B, K, G, H, W),
            )
            o_B1JW = o_BKGW.reshape(B, 1, K * G, W).astype(x_B1D.dtype)
        y_B1D = self._output(o_B1JW, qkvz_B1E)
        return y_B1D, conv_BCX, state_BKGHW.reshape(B, K * G, H, W)

    def _project(self, x_BTD):
        """The two products, as HF runs them (each reads x): qkvz and ba, rows by q/k head."""
        cfg = self.cfg
        qkvz_BTE = linear(x_BTD, read(self.in_proj_qkvz, cfg))
        return qkvz_BTE, linear(x_BTD, read(self.in_proj_ba, cfg))

    def _qkv(self, qkvz_BTE):
        """HF's fix_query_key_value_ordering, its q, k, v: the conv's X channels, all q heads,
        all k heads, all v heads (HF's conv1d and conv cache order)."""
        B, T, _ = qkvz_BTE.shape
        K, G, H, W = self.heads
        qkvz_BTKE = qkvz_BTE.reshape(B, T, K, -1)
        q, k, v = (
            qkvz_BTKE[..., :H],
            qkvz_BTKE[..., H : 2 * H],
            qkvz_BTKE[..., 2 * H : 2 * H + G * W],
        )
        n = self.conv_blocks
        if n > 1:  # each device's block [q_d; k_d; v_d] of its K / n q/k heads
            parts = [t.reshape(B, T, n, -1) for t in (q, k, v)]
            return constrain(jnp.concatenate(parts, axis=-1), DATA, None, MODEL, None).reshape(
                B, T, -1
            )
        return jnp.concatenate([t.reshape(B, T, -1) for t in (q, k, v)], axis=-1)

    def _conv(self, p_BSX, T):
        """silu of the causal depthwise conv: out[t] = sum_i p[t + i] w[:, i] over the w rows
        from t (p holds the w - 1 inputs before the first output's token, then T more)."""
        weight_Xw = read(self.linear_conv, self.cfg)
        acc_BTX = p_BSX[:, 0:T] * weight_Xw[:, 0]
        for i in range(1, self.cfg.conv_kernel):
            acc_BTX = acc_BTX + p_BSX[:, i : i + T] * weight_Xw[:, i]
        return jax.nn.silu(acc_BTX)

    def _gates(self, ba_BTE):
        """beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias) with torch's threshold, in
        f32 (HF computes g in f32; beta reaches its delta rule in f32 too)."""
        B, T, _ = ba_BTE.shape
        K, G, _, _ = self.heads
        ba_BTKE = ba_BTE.reshape(B, T, K, 2 * G)
        b_BTJ, a_BTJ = (t.reshape(B, T, K * G) for t in (ba_BTKE[..., :G], ba_BTKE[..., G:]))
        f32 = jnp.float32
        beta_BTJ = jax.nn.sigmoid(b_BTJ.astype(f32))
        a_BTJ = a_BTJ.astype(f32) + self.dt_bias[...].astype(f32)
        softplus_BTJ = jnp.where(a_BTJ > SOFTPLUS_THRESHOLD, a_BTJ, jnp.log1p(jnp.exp(a_BTJ)))
        return beta_BTJ, -jnp.exp(self.A_log[...].astype(f32)) * softplus_BTJ

    def _split_normed(self, qkv_BTX):
        """q, k on their K heads, L2-normalised in f32 (q also times H^-0.5, folded into its
        inverse norm: one product a row), and v [B, T, K, G, W] as the conv gave it."""
        B, T, _ = qkv_BTX.shape
        K, G, H, W = self.heads
        n = self.conv_blocks
        if n > 1:  # blocks [q_d; k_d; v_d]: back to q, k, v over all heads (device-major)
            x = qkv_BTX.reshape(B, T, n, -1)
            kd = K // n
            qk_BT2KH = jnp.stack(
                [
                    x[..., : kd * H].reshape(B, T, K, H),
                    x[..., kd * H : 2 * kd * H].reshape(B, T, K, H),
                ],
                axis=2,
            ).astype(jnp.float32)
            v_BTKGW = x[..., 2 * kd * H :].reshape(B, T, K, G, W)
            return self._normed(qk_BT2KH, H) + (v_BTKGW,)
        qk_BT2KH = qkv_BTX[..., : 2 * K * H].reshape(B, T, 2, K, H).astype(jnp.float32)
        return self._normed(qk_BT2KH, H) + (qkv_BTX[..., 2 * K * H :].reshape(B, T, K, G, W),)

    @staticmethod
    def _normed(qk_BT2KH, H):
        inv_BT2K1 = jax.lax.rsqrt(jnp.sum(qk_BT2KH * qk_BT2KH, axis=-1, keepdims=True) + L2_EPS)
        q_BTKH = qk_BT2KH[:, :, 0] * (inv_BT2K1[:, :, 0] * H**-0.5)
        k_BTKH = qk_BT2KH[:, :, 1] * inv_BT2K1[:, :, 1]
        return q_BTKH, k_BTKH

    def _output(self, o_BTJW, qkvz_BTE):
        """Qwen3NextRMSNormGated per head (f32, eps norm_eps) gated by z, then out_proj."""
        cfg = self.cfg
        B, T, J, W = o_BTJW.shape
        K, G, H, _ = self.heads
        with jax.named_scope(kernels.LINEAR_NORM):
            z_BTJW = qkvz_BTE.reshape(B, T, K, -1)[..., 2 * H + G * W :].reshape(B, T, J, W)
            o = o_BTJW.astype(jnp.float32)
            var = jnp.mean(o * o, axis=-1, keepdims=True)
            o = (o * jax.lax.rsqrt(var + cfg.norm_eps)).astype(o_BTJW.dtype)
            o = read(self.linear_norm, cfg) * o
            o = (o * jax.nn.silu(z_BTJW.astype(jnp.float32))).astype(o_BTJW.dtype)
            o_BTE = o.reshape(B, T, J * W)
        with jax.named_scope(kernels.LINEAR_OUT_PROJ):
            return linear(o_BTE, read(self.linear_out_proj, cfg))
