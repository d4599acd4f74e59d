"""The dense MLP: gated (SwiGLU / GeGLU: gate_up, activation, down) or plain (up, activation,
down), as the transformer's layers and the MoE layer's shared experts both run it. Apertus's
xIELU is Hugging Face's XIELUActivation (its Python path): per layer two learned scalars stored
before their softplus, alpha_p and alpha_n (parameters), and the fixed beta 0.5 and eps -1e-6
(buffers there; its ApertusMLP never sets them otherwise: `kvjax.nn.hf` checks a checkpoint's)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from kvjax import kernels
from kvjax.model.config import ModelConfig
from kvjax.nn.layers import linear, param, read, weight_dtype
from kvjax.nn.sharding import DATA, MODEL, constrain


class MLP(nnx.Module):
    """The dense MLP, `width` wide (d_ff; an MoE layer's shared experts: their total width)."""

    def __init__(self, cfg: ModelConfig, width: int | None = None, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.width = width or cfg.d_ff
        D, F = cfg.d_model, self.width
        # Weights stored 2-D, (out, in): gate_up (2F, D) = [gate; up], up (F, D), down (D, F).
        if cfg.gated_mlp:
            self.gate_up = param(rngs, (2 * F, D), D, cfg)
            # > 1 once sharded: rows reordered in blocks [gate_0; up_0; gate_1; up_1; ...]
            self.gate_up_blocks = 1
        else:
            self.up = param(rngs, (F, D), D, cfg)
        self.down = param(rngs, (D, F), F, cfg)
        if cfg.mlp_activation == "xielu":  # softplus^-1 of Hugging Face's initial 0.8, 0.8 - beta
            self.alpha_p = nnx.Param(jnp.full((1,), XIELU_ALPHA_P, weight_dtype(cfg)))
            self.alpha_n = nnx.Param(jnp.full((1,), XIELU_ALPHA_N, weight_dtype(cfg)))
        if cfg.mlp_bias:  # gate_up (2F) or up (F), and down (D)
            up = (2 if cfg.gated_mlp else 1) * F
            self.up_bias = nnx.Param(jnp.zeros((up,), weight_dtype(cfg)))
            self.down_bias = nnx.Param(jnp.zeros((D,), weight_dtype(cfg)))

    def __call__(self, x_BTD: jax.Array) -> jax.Array:
        cfg = self.cfg
        F = self.width
        act = jax.nn.silu if cfg.mlp_activation == "silu" else _gelu_tanh
        if cfg.mlp_activation == "xielu":

            def act(u):  # the alphas read in the kernel's scope: their softplus counts there
                return xielu(u, read(self.alpha_p, cfg), read(self.alpha_n, cfg))

        if cfg.gated_mlp:
            with jax.named_scope(kernels.GATE_UP):
                gu_BTE = linear(x_BTD, read(self.gate_up, cfg))
                if cfg.mlp_bias:
                    gu_BTE = gu_BTE + read(self.up_bias, cfg)
            with jax.named_scope(kernels.ACT):
                n = self.gate_up_blocks
                if n == 1:
                    h_BTF = gated_product(cfg, gu_BTE[..., :F], gu_BTE[..., F:], act)
                else:  # one [gate_d; up_d] block per device (kvjax.nn.sharding)
                    B, T = gu_BTE.shape[:2]
                    gu_BTn2f = constrain(
                        gu_BTE.reshape(B, T, n, 2, F // n), DATA, None, MODEL, None, None
                    )
                    h_BTF = gated_product(cfg, gu_BTn2f[..., 0, :], gu_BTn2f[..., 1, :], act)
                    h_BTF = h_BTF.reshape(B, T, F)
        else:
            with jax.named_scope(kernels.UP):
                u_BTF = linear(x_BTD, read(self.up, cfg))
                if cfg.mlp_bias:
                    u_BTF = u_BTF + read(self.up_bias, cfg)
            with jax.named_scope(kernels.ACT):
                h_BTF = act(u_BTF)
        h_BTF = constrain(h_BTF, DATA, None, MODEL)
        with jax.named_scope(kernels.DOWN):
            out_BTD = linear(h_BTF, read(self.down, cfg))
            return out_BTD + read(self.down_bias, cfg) if cfg.mlp_bias else out_BTD


def _gelu_tanh(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=True)


def gated_product(cfg: ModelConfig, gate: jax.Array, up: jax.Array, act=None) -> jax.Array:
    """A gated MLP's hidden values: act(gate) * up (SwiGLU, GeGLU), or gpt-oss's clamped SwiGLU,
    (clip(up, -l, l) + 1) * g * sigmoid(alpha * g) with g = min(gate, l) (its experts'
    `_apply_gate`: l = swiglu_limit, alpha = swiglu_alpha)."""
    if cfg.mlp_activation == "clamped_swiglu":
        limit = cfg.swiglu_limit
        g = jnp.minimum(gate, limit)
        u = jnp.clip(up, -limit, limit)
        return (u + 1) * (g * jax.nn.sigmoid(g * cfg.swiglu_alpha))
    act = act or (jax.nn.silu if cfg.mlp_activation == "silu" else _gelu_tanh)
    return act(gate) * up


XIELU_BETA, XIELU_EPS = 0.5, -1e-6
XIELU_ALPHA_P = math.log(math.expm1(0.8))
XIELU_ALPHA_N = math.log(math.expm1(0.8 - XIELU_BETA))


def xielu(x: jax.Array, alpha_p_raw: jax.Array, alpha_n_raw: jax.Array) -> jax.Array:
    """xIELU (Huang et al. 2024) as Hugging Face's `_xielu_python` computes it: alpha_p x^2 +
    beta x for x > 0, else (expm1(min(x, eps)) - x) alpha_n + beta x, with alpha_p =
    softplus(alpha_p_raw) and alpha_n = beta + softplus(alpha_n_raw)."""
    alpha_p = jax.nn.softplus(alpha_p_raw)
    alpha_n = XIELU_BETA + jax.nn.softplus(alpha_n_raw)
    beta_x = XIELU_BETA * x
    negative = (jnp.expm1(jnp.minimum(x, XIELU_EPS)) - x) * alpha_n + beta_x
    return jnp.where(x > 0, alpha_p * x * x + beta_x, negative)
