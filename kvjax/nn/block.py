"""One decoder layer: norm, the token mixer, residual, norm, MLP (or MoE), residual.

The mixer is set by the layer's `layer_kinds` letter (`kvjax.model.hybrid.LAYER_KINDS`): A
attention (GQA `Attention` or MLA `LatentAttention`), D Gated DeltaNet (`kvjax.nn.deltanet`), C
LFM2's short convolution (`kvjax.nn.shortconv`), H Mamba-2 beside the attention, both reading the
same normed x and summed (Falcon-H1; `kvjax.nn.mamba2`). The caller passes how each runs:
`attend(attn, projection) -> o` and `mix(mixer, h_BTD) -> y_BTD` are the only differences between
the uncached forward, prefill and decode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kvjax import kernels
from kvjax.model.config import ModelConfig
from kvjax.nn.attention import Attention
from kvjax.nn.deltanet import GatedDeltaNet
from kvjax.nn.layers import block_norm
from kvjax.nn.mamba2 import Mamba2
from kvjax.nn.mla import LatentAttention
from kvjax.nn.mlp import MLP
from kvjax.nn.moe import MoE
from kvjax.nn.sharding import DATA, constrain
from kvjax.nn.shortconv import ShortConv


def make_mixer(cfg: ModelConfig, kind: str, rngs: nnx.Rngs):
    """The state mixer of a D, H or C layer (None for A)."""
    mixer = {"D": GatedDeltaNet, "H": Mamba2, "C": ShortConv}.get(kind)
    return None if mixer is None else mixer(cfg, rngs=rngs)


def output_gate(o_BTKGH: jax.Array, gate_BTE: jax.Array) -> jax.Array:
    """Qwen3-Next's gated attention: o * sigmoid(gate), written out (negate, exp, add, divide,
    multiply: the closed form's 4 FLOPs and one exp an element)."""
    with jax.named_scope(kernels.ATTN_GATE):
        g = gate_BTE.reshape(o_BTKGH.shape)
        return o_BTKGH * (1.0 / (1.0 + jnp.exp(-g)))


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.kind = cfg.layer_kind(layer)
        self.attn_norm = block_norm(cfg) if cfg.pre_norms else None  # OLMo 2: outputs only
        self.mixer = make_mixer(cfg, self.kind, rngs)
        if self.kind not in "AH":
            self.attn = None
        elif cfg.is_mla:
            self.attn = LatentAttention(cfg, rngs=rngs)
        else:
            self.attn = Attention(cfg, layer, rngs=rngs)
        self.mlp_norm = block_norm(cfg) if cfg.pre_norms and not cfg.parallel_block else None
        self.mlp = MoE(cfg, rngs=rngs) if cfg.layer_is_moe(layer) else MLP(cfg, rngs=rngs)
        # Gemma 2/3: the attention and MLP outputs are normed too, before their residual adds
        self.post_attn_norm = block_norm(cfg) if cfg.sandwich_norms else None
        self.post_mlp_norm = block_norm(cfg) if cfg.sandwich_norms else None

    def _mix(self, h_BTD, positions_BT, attend, mix):
        """The token mixer's output [B, T, D] (in the closed form's kernel order)."""
        y_BTD = mix(self.mixer, h_BTD) if self.mixer is not None else None
        if self.attn is None:
            return y_BTD
        proj = self.attn.project(h_BTD, positions_BT)
        o = attend(self.attn, proj)
        if self.cfg.attn_output_gate:
            o = output_gate(o, proj[3])
        a_BTD = self.attn.output(o)
        if y_BTD is None:
            return a_BTD
        with jax.named_scope(kernels.SSM_COMBINE):  # Falcon-H1: Mamba-2 + attention
            return y_BTD + a_BTD

    def __call__(self, x_BTD, positions_BT, attend, mix=None):
        h_BTD = x_BTD
        if self.attn_norm is not None:
            with jax.named_scope(kernels.NORM_ATTN):
                h_BTD = self.attn_norm(x_BTD)
        a_BTD = self._mix(h_BTD, positions_BT, attend, mix)
        if self.cfg.parallel_block:  # Cohere: the MLP reads the same normed x
            m_BTD = self.mlp(h_BTD)
            with jax.named_scope(kernels.RESIDUAL_ATTN):
                x_BTD = constrain(x_BTD + self._branch(a_BTD), DATA, None, None)
            with jax.named_scope(kernels.RESIDUAL_MLP):
                return constrain(x_BTD + self._branch(m_BTD), DATA, None, None)
        if self.post_attn_norm is not None:
            with jax.named_scope(kernels.NORM_POST_ATTN):
                a_BTD = self.post_attn_norm(a_BTD)
        with jax.named_scope(kernels.RESIDUAL_ATTN):
            x_BTD = constrain(x_BTD + self._branch(a_BTD), DATA, None, None)
        h_BTD = x_BTD
        if self.mlp_norm is not None:
            with jax.named_scope(kernels.NORM_MLP):
                h_BTD = self.mlp_norm(x_BTD)
        m_BTD = self.mlp(h_BTD)
        if self.post_mlp_norm is not None:
            with jax.named_scope(kernels.NORM_POST_MLP):
                m_BTD = self.post_mlp_norm(m_BTD)
        with jax.named_scope(kernels.RESIDUAL_MLP):
            return constrain(x_BTD + self._branch(m_BTD), DATA, None, None)

    def _branch(self, y_BTD):
        """A residual branch as it joins the stream (Granite: times residual_multiplier)."""
        r = self.cfg.residual_multiplier
        return y_BTD if r == 1.0 else y_BTD * jnp.asarray(r, y_BTD.dtype)
