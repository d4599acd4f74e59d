"""The dense MLP: gated (SwiGLU / GeGLU: gate_up, activation, down) or plain (up, activation,
down), as the transformer's layers and the MoE layer's shared experts both run it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kvjax import kernels
from kvjax.config import ModelConfig
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
        if cfg.mlp_bias:  # gate_up (2F) or up (F), and down (D)
            up = (2 if cfg.gated_mlp else 1) * F
            self.up_bias = nnx.Param(jnp.zeros((up,), weight_dtype(cfg)))
            self.down_bias = nnx.Param(jnp.zeros((D,), weight_dtype(cfg)))

    def __call__(self, x_BTD: jax.Array) -> jax.Array:
        cfg = self.cfg
        F = self.width
        act = jax.nn.silu if cfg.mlp_activation == "silu" else _gelu_tanh
        if cfg.gated_mlp:
            with jax.named_scope(kernels.GATE_UP):
                gu_BTE = linear(x_BTD, read(self.gate_up, cfg))
                if cfg.mlp_bias:
                    gu_BTE = gu_BTE + read(self.up_bias, cfg)
            with jax.named_scope(kernels.ACT):
                n = self.gate_up_blocks
                if n == 1:
                    h_BTF = act(gu_BTE[..., :F]) * gu_BTE[..., F:]
                else:  # one [gate_d; up_d] block per device (kvjax.nn.sharding)
                    B, T = gu_BTE.shape[:2]
                    gu_BTn2f = constrain(
                        gu_BTE.reshape(B, T, n, 2, F // n), DATA, None, MODEL, None, None
                    )
                    h_BTF = (act(gu_BTn2f[..., 0, :]) * gu_BTn2f[..., 1, :]).reshape(B, T, F)
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
