"""LFM2's short gated convolution (layer kind "C"), as transformers 5.24's Lfm2ShortConv runs it:
in_proj to B, C and x (3D rows in that order, bias with conv_bias), Bx = B * x, a causal
depthwise conv of Bx over w = conv_kernel positions (bias with conv_bias), y = C * conv(Bx),
out_proj (bias with conv_bias).

The only state is the conv cache: the last w - 1 rows of Bx ([B, w-1, D], vLLM's layout; HF's
cache keeps w), in the activation dtype. The conv is written as w products and w - 1 sums per
output element (a Python loop over the taps), the count `kvjax.analytic.hybrid._conv` gives, and
decode runs the same sums in the same order over [cache; new row], so cached decode equals the
uncached forward. Letters: B batch, T tokens, D d_model, W the cache's w - 1 rows, E = 3D.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kvjax import kernels
from kvjax.model.config import ModelConfig
from kvjax.nn.layers import act_dtype, linear, param, read, weight_dtype


class ShortConv(nnx.Module):
    """The mixer of an LFM2 conv layer; its recurrent state is None."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        D, w = cfg.d_model, cfg.conv_kernel
        self.conv_in_proj = param(rngs, (3 * D, D), D, cfg)  # rows [B; C; x], as HF's in_proj
        self.short_conv = param(rngs, (D, w), w, cfg)  # HF's conv.weight [D, 1, w] squeezed
        self.conv_out_proj = param(rngs, (D, D), D, cfg)
        if cfg.conv_bias:
            self.conv_in_bias = nnx.Param(jnp.zeros((3 * D,), weight_dtype(cfg)))
            self.short_conv_bias = nnx.Param(jnp.zeros((D,), weight_dtype(cfg)))
            self.conv_out_bias = nnx.Param(jnp.zeros((D,), weight_dtype(cfg)))

    def _in_proj(self, x_BTD: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(C, B * x): C for the output gate, Bx for the conv."""
        cfg, D = self.cfg, self.cfg.d_model
        with jax.named_scope(kernels.CONV_IN_PROJ):
            bcx_BTE = linear(x_BTD, read(self.conv_in_proj, cfg))
            if cfg.conv_bias:
                bcx_BTE = bcx_BTE + read(self.conv_in_bias, cfg)
        with jax.named_scope(kernels.CONV_GATE):
            bx_BTD = bcx_BTE[..., :D] * bcx_BTE[..., 2 * D :]
        return bcx_BTE[..., D : 2 * D], bx_BTD

    def _taps(self, window_BUD: jax.Array, T: int) -> jax.Array:
        """The causal conv's T outputs over a window of T + w - 1 rows (the w - 1 before the
        first output, then the T inputs): tap k multiplies rows k .. k + T - 1."""
        cfg = self.cfg
        w_Dw = read(self.short_conv, cfg)
        y_BTD = window_BUD[:, :T] * w_Dw[:, 0]
        for k in range(1, cfg.conv_kernel):
            y_BTD = y_BTD + window_BUD[:, k : k + T] * w_Dw[:, k]
        return y_BTD + read(self.short_conv_bias, cfg) if cfg.conv_bias else y_BTD

    def _out(self, c_BTD: jax.Array, conv_BTD: jax.Array) -> jax.Array:
        cfg = self.cfg
        with jax.named_scope(kernels.CONV_GATE):
            y_BTD = c_BTD * conv_BTD
        with jax.named_scope(kernels.CONV_OUT_PROJ):
            out_BTD = linear(y_BTD, read(self.conv_out_proj, cfg))
            return out_BTD + read(self.conv_out_bias, cfg) if cfg.conv_bias else out_BTD

    def __call__(
        self, x_BTD: jax.Array, valid_BT: jax.Array | None = None, conv_BWD=None, state=None
    ):
        """Prefill from a zero cache, or an extend step from a cached `conv_BWD`: (y_BTD,
        conv_BWD, None). With right-padded `valid_BT`
        the cache holds the w - 1 rows of Bx before each sequence's length (the conv is causal,
        so padded tokens change neither the cache nor the valid tokens' outputs)."""
        cfg = self.cfg
        B, T, D = x_BTD.shape
        W = cfg.conv_kernel - 1
        x_BTD = x_BTD.astype(act_dtype(cfg))
        # The cache's rows in the zero-padded window below: rows length .. length + W - 1 are
        # Bx's rows length - W .. length - 1. Bookkeeping, outside the kernels' scopes.
        rows_BW = None
        if valid_BT is not None:
            length_B = valid_BT.astype(jnp.int32).sum(axis=1)
            rows_BW = length_B[:, None] + jnp.arange(W, dtype=jnp.int32)
        c_BTD, bx_BTD = self._in_proj(x_BTD)
        with jax.named_scope(kernels.CONV_CONV):
            before = jnp.zeros((B, W, D), bx_BTD.dtype) if conv_BWD is None else conv_BWD
            window_BUD = jnp.concatenate([before.astype(bx_BTD.dtype), bx_BTD], axis=1)
            conv_BTD = self._taps(window_BUD, T)
            if rows_BW is None:
                conv_BWD = window_BUD[:, T:]
            else:
                conv_BWD = jnp.take_along_axis(
                    window_BUD, rows_BW[:, :, None], axis=1, mode="promise_in_bounds"
                )
        return self._out(c_BTD, conv_BTD), conv_BWD, None

    def step(self, x_B1D: jax.Array, conv_BWD: jax.Array, state=None):
        """One token per sequence: (y_B1D, the cache shifted by the new row of Bx, None)."""
        cfg = self.cfg
        c_B1D, bx_B1D = self._in_proj(x_B1D.astype(act_dtype(cfg)))
        with jax.named_scope(kernels.CONV_CONV):
            window_BwD = jnp.concatenate([conv_BWD.astype(bx_B1D.dtype), bx_B1D], axis=1)
            conv_B1D = self._taps(window_BwD, 1)
            new_BWD = window_BwD[:, 1:]
        return self._out(c_B1D, conv_B1D), new_BWD, None
