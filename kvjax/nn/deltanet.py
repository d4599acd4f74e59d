"""Gated DeltaNet, the linear-attention mixer of Qwen3-Next's D layers, as transformers 5.24's
Qwen3NextGatedDeltaNet runs it: in_proj_qkvz and in_proj_ba (rows grouped by q/k head, kept in
Hugging Face's order), a causal depthwise conv of width w over q, k, v and silu, beta = sigmoid(b),
g = -exp(A_log) softplus(a + dt_bias), q and k L2-normalised (q also by d_k^-0.5), the gated delta
rule (`kvjax.nn.delta_rule`), RMSNorm of each head's output times silu(z) in f32, out_proj.

Letters: B batch, T tokens, D d_model, Y q/k heads (state_groups), G value heads per q/k head
(J = Y G = state_heads), K = d_k, V = d_v, X the conv's channels (2 Y K + J V), W the conv cache's
w - 1 rows. Each piece runs in the named scope of its kernel, in the order of
`kvjax.analytic.hybrid.mixer_kernels(cfg, wl, "D")`, which counts it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kvjax import kernels
from kvjax.config import ModelConfig
from kvjax.nn import delta_rule
from kvjax.nn.layers import linear, param, read, weight_dtype

L2_EPS = 1e-6  # Hugging Face's l2norm (the FLA library's)
SOFTPLUS_THRESHOLD = 20.0  # torch's F.softplus: x itself above it


class GatedDeltaNet(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        D, J, Y = cfg.d_model, cfg.state_heads, cfg.state_groups
        K, V, w = cfg.state_key_dim, cfg.state_value_dim, cfg.conv_kernel
        X = 2 * Y * K + J * V
        # per q/k head: [q (K); k (K); v (G V); z (G V)] and [b (G); a (G)], as HF stores them
        self.in_proj_qkvz = param(rngs, (2 * Y * K + 2 * J * V, D), D, cfg)
        self.in_proj_ba = param(rngs, (2 * J, D), D, cfg)
        self.linear_conv = param(rngs, (X, w), w, cfg)  # HF's conv1d weight [X, 1, w] squeezed
        self.dt_bias = nnx.Param(jnp.ones((J,), weight_dtype(cfg)))
        self.A_log = nnx.Param(jnp.zeros((J,), weight_dtype(cfg)))  # A = 1 until loaded
        self.linear_norm = nnx.Param(jnp.ones((V,), weight_dtype(cfg)))
        self.linear_out_proj = param(rngs, (D, J * V), J * V, cfg)

    def __call__(self, x_BTD, valid_BT=None):
        """Prefill from a zero state: (y_BTD, conv_BWX, the f32 state [B, J, K, V]). Padded
        tokens (valid_BT False) get beta = g = 0, which leaves the state unchanged, and the conv
        cache is read at each sequence's length."""
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        w = cfg.conv_kernel
        with jax.named_scope(kernels.LINEAR_IN_PROJ):
            qkv_BTX, z_BTJV, b_BTJ, a_BTJ = self._project(x_BTD)
        with jax.named_scope(kernels.LINEAR_CONV):
            # zeros before the start: the w - 1 rows a causal conv of the first token reads
            zero = jnp.zeros((), qkv_BTX.dtype)
            pad_BTX = jax.lax.pad(qkv_BTX, zero, ((0, 0, 0), (w - 1, 0, 0), (0, 0, 0)))
            weight_XW = read(self.linear_conv, cfg)
            acc = pad_BTX[:, 0:T] * weight_XW[:, 0]
            for i in range(1, w):
                acc = acc + pad_BTX[:, i : i + T] * weight_XW[:, i]
            qkv_BTX = jax.nn.silu(acc)
            if valid_BT is None:
                conv_BWX = pad_BTX[:, T:]
            else:  # the w - 1 inputs before each sequence's end (its length in the padded rows)
                length_B = jnp.sum(valid_BT, axis=1)
                conv_BWX = jax.vmap(
                    lambda p_TX, n: jax.lax.dynamic_slice_in_dim(p_TX, n, w - 1, axis=0)
                )(pad_BTX, length_B)
        with jax.named_scope(kernels.LINEAR_GATES):
            beta_BTJ, g_BTJ = self._gates(b_BTJ, a_BTJ)
            if valid_BT is not None:
                beta_BTJ = jnp.where(valid_BT[..., None], beta_BTJ, 0.0)
                g_BTJ = jnp.where(valid_BT[..., None], g_BTJ, 0.0)
        with jax.named_scope(kernels.LINEAR_QK_NORM):
            q_BTYK, k_BTYK, v_BTYGV = self._split_normed(qkv_BTX)
        Y, G = cfg.state_groups, cfg.state_heads // cfg.state_groups
        with jax.named_scope(kernels.LINEAR_SCAN):
            o_BTYGV, state = delta_rule.chunked(
                q_BTYK,
                k_BTYK,
                v_BTYGV.astype(jnp.float32),
                beta_BTJ.reshape(B, T, Y, G),
                g_BTJ.reshape(B, T, Y, G),
            )
            o_BTJV = o_BTYGV.reshape(B, T, -1, cfg.state_value_dim).astype(x_BTD.dtype)
        state_BJKV = state.reshape(B, -1, cfg.state_key_dim, cfg.state_value_dim)
        return self._output(o_BTJV, z_BTJV), conv_BWX, state_BJKV

    def step(self, x_B1D, conv_BWX, state):
        """One token per sequence from the conv cache and the state: (y_B1D, conv, state)."""
        cfg = self.cfg
        B = x_B1D.shape[0]
        Y, G = cfg.state_groups, cfg.state_heads // cfg.state_groups
        K, V = cfg.state_key_dim, cfg.state_value_dim
        with jax.named_scope(kernels.LINEAR_IN_PROJ):
            qkv_B1X, z_B1JV, b_B1J, a_B1J = self._project(x_B1D)
        with jax.named_scope(kernels.LINEAR_CONV):
            window_BwX = jnp.concatenate([conv_BWX, qkv_B1X.astype(conv_BWX.dtype)], axis=1)
            weight_XW = read(self.linear_conv, cfg)
            acc = window_BwX[:, 0] * weight_XW[:, 0]
            for i in range(1, cfg.conv_kernel):
                acc = acc + window_BwX[:, i] * weight_XW[:, i]
            qkv_B1X = jax.nn.silu(acc)[:, None]
            conv_BWX = window_BwX[:, 1:]
        with jax.named_scope(kernels.LINEAR_GATES):
            beta_B1J, g_B1J = self._gates(b_B1J, a_B1J)
        with jax.named_scope(kernels.LINEAR_QK_NORM):
            q_B1YK, k_B1YK, v_B1YGV = self._split_normed(qkv_B1X)
        with jax.named_scope(kernels.LINEAR_SCAN):
            o_BYGV, state_BYGKV = delta_rule.step(
                q_B1YK[:, 0],
                k_B1YK[:, 0],
                v_B1YGV[:, 0].astype(jnp.float32),
                beta_B1J.reshape(B, Y, G),
                g_B1J.reshape(B, Y, G),
                state.reshape(B, Y, G, K, V),
            )
            o_B1JV = o_BYGV.reshape(B, 1, Y * G, V).astype(x_B1D.dtype)
        y_B1D = self._output(o_B1JV, z_B1JV)
        return y_B1D, conv_BWX, state_BYGKV.reshape(B, Y * G, K, V)

    def _project(self, x_BTD):
        """HF's fix_query_key_value_ordering: (q k v as the conv's X channels, z, b, a)."""
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        Y, J = cfg.state_groups, cfg.state_heads
        K, V, G = cfg.state_key_dim, cfg.state_value_dim, J // Y
        qkvz_BTYE = linear(x_BTD, read(self.in_proj_qkvz, cfg)).reshape(B, T, Y, -1)
        ba_BTYE = linear(x_BTD, read(self.in_proj_ba, cfg)).reshape(B, T, Y, 2 * G)
        q, k = qkvz_BTYE[..., :K], qkvz_BTYE[..., K : 2 * K]
        v, z = qkvz_BTYE[..., 2 * K : 2 * K + G * V], qkvz_BTYE[..., 2 * K + G * V :]
        qkv_BTX = jnp.concatenate([t.reshape(B, T, -1) for t in (q, k, v)], axis=-1)
        b_BTJ, a_BTJ = ba_BTYE[..., :G].reshape(B, T, J), ba_BTYE[..., G:].reshape(B, T, J)
        return qkv_BTX, z.reshape(B, T, J, V), b_BTJ, a_BTJ

    def _gates(self, b_BTJ, a_BTJ):
        """beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias) with torch's threshold, in
        f32 (HF computes g in f32; beta reaches its delta rule in f32 too)."""
        f32 = jnp.float32
        beta_BTJ = jax.nn.sigmoid(b_BTJ.astype(f32))
        a_BTJ = a_BTJ.astype(f32) + self.dt_bias[...].astype(f32)
        softplus_BTJ = jnp.where(a_BTJ > SOFTPLUS_THRESHOLD, a_BTJ, jnp.log1p(jnp.exp(a_BTJ)))
        return beta_BTJ, -jnp.exp(self.A_log[...].astype(f32)) * softplus_BTJ

    def _split_normed(self, qkv_BTX):
        """q, k on their Y heads, L2-normalised in f32 (q also times K^-0.5, folded into its
        inverse norm: one product a row), and v [B, T, Y, G, V] as the conv gave it."""
        cfg = self.cfg
        B, T, _ = qkv_BTX.shape
        Y, J = cfg.state_groups, cfg.state_heads
        K, V = cfg.state_key_dim, cfg.state_value_dim
        qk_BT2YK = qkv_BTX[..., : 2 * Y * K].reshape(B, T, 2, Y, K).astype(jnp.float32)
        inv_BT2Y1 = jax.lax.rsqrt(jnp.sum(qk_BT2YK * qk_BT2YK, axis=-1, keepdims=True) + L2_EPS)
        q_BTYK = qk_BT2YK[:, :, 0] * (inv_BT2Y1[:, :, 0] * K**-0.5)
        k_BTYK = qk_BT2YK[:, :, 1] * inv_BT2Y1[:, :, 1]
        v_BTYGV = qkv_BTX[..., 2 * Y * K :].reshape(B, T, Y, J // Y, V)
        return q_BTYK, k_BTYK, v_BTYGV

    def _output(self, o_BTJV, z_BTJV):
        """Qwen3NextRMSNormGated per head (f32, eps norm_eps), then out_proj."""
        cfg = self.cfg
        B, T = o_BTJV.shape[:2]
        with jax.named_scope(kernels.LINEAR_NORM):
            o = o_BTJV.astype(jnp.float32)
            var = jnp.mean(o * o, axis=-1, keepdims=True)
            o = (o * jax.lax.rsqrt(var + cfg.norm_eps)).astype(o_BTJV.dtype)
            o = read(self.linear_norm, cfg) * o
            o = (o * jax.nn.silu(z_BTJV.astype(jnp.float32))).astype(o_BTJV.dtype)
        with jax.named_scope(kernels.LINEAR_OUT_PROJ):
            return linear(o.reshape(B, T, -1), read(self.linear_out_proj, cfg))
