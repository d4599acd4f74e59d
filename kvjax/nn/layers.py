"""Building blocks of the decoder: dtypes, parameter init, RMSNorm, embedding, RoPE.

Arrays carry their shape as a suffix (nanodo): `x_BTD`; the letters are `kvjax.kernels.LETTERS`.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvjax.model.config import ModelConfig
from kvjax.model.rope import inverse_frequencies

JNP_DTYPES = {
    "f32": jnp.float32,
    "bf16": jnp.bfloat16,
    "f16": jnp.float16,
    "fp8": jnp.float8_e4m3fn,
    "int8": jnp.int8,
}


def weight_dtype(cfg: ModelConfig):
    return JNP_DTYPES[cfg.weight_dtype]


def act_dtype(cfg: ModelConfig):
    """Activations run in the closed form's compute dtype (bf16 for 1-byte weights)."""
    return JNP_DTYPES[cfg.compute_dtype]


def kv_dtype(cfg: ModelConfig):
    return JNP_DTYPES[cfg.kv_dtype]


# Weights of up to this many elements are drawn in power-of-two lengths and cut to their shape.
BUCKETED_PARAM_SIZE = 1 << 22

# Set while `kvjax.nn.abstract_model` traces a model for its shapes: see `shapes_only`.
_SHAPES_ONLY = contextvars.ContextVar("shapes_only", default=False)

_normal = jax.jit(partial(jax.random.normal, dtype=jnp.float32), static_argnums=1)


@contextlib.contextmanager
def shapes_only():
    """Within: `param` gives zeros of the weight's shape and draws no key.

    For tracing a model only for its shapes (`nnx.eval_shape`): drawing a key under a trace
    increments `nnx.Rngs`' counter to a tracer, whose `.sharding` nnx reads and jax answers by
    walking the whole trace so far, once per weight: 8.5 s for deepseek-r1's 1,328 weights on
    this CPU, most of a trace's time.
    """
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


def param(rngs: nnx.Rngs, shape: tuple[int, ...], fan_in: int, cfg: ModelConfig) -> nnx.Param:
    """Normal(0, 1/fan_in) weights, stored in the config's weight dtype.

    The same bits as `jax.random.normal(key, shape) / sqrt(fan_in)` run eagerly on XLA:CPU (on
    a GPU, whose eager division may round differently, within an ulp of it), in fewer programs:
    threefry is partitionable (jax's default), so element i of a draw does not depend on the
    draw's length, and a weight of up to `BUCKETED_PARAM_SIZE` elements is the first `size`
    elements of a draw of the next power of two. Scaling, rounding and the cast run in
    numpy on the cut draw: XLA:CPU divides by multiplying with the f32 reciprocal, which numpy
    reproduces bit for bit, while a scale fused into the draw's program rounds differently.
    Drawing per shape compiled a program per shape: 0.3-0.6 s each on this 2-core CPU, 58 s of
    254 in `tests/test_nn.py` and `tests/test_families.py` (225 shapes). Under a trace (a
    jitted constructor) or above the bucket size, the draw is of the shape itself, as before.
    """
    if _SHAPES_ONLY.get():
        return nnx.Param(jnp.zeros(shape, weight_dtype(cfg)))
    size, key = math.prod(shape), rngs.params()
    if isinstance(key, jax.core.Tracer) or size > BUCKETED_PARAM_SIZE:
        w, xp = jax.random.normal(key, shape, jnp.float32) / math.sqrt(fan_in), jnp
    else:
        drawn = np.asarray(_normal(key, (1 << max(size - 1, 0).bit_length(),)))
        w = drawn[:size].reshape(shape) * (np.float32(1) / np.float32(math.sqrt(fan_in)))
        xp = np
    if cfg.weight_dtype == "int8":
        w = xp.clip(xp.round(w * xp.float32(127)), -127, 127)
    return nnx.Param(jnp.asarray(w.astype(weight_dtype(cfg))))


def read(w: nnx.Param, cfg: ModelConfig) -> jax.Array:
    """A weight in the compute dtype (1-byte weights are widened on read)."""
    value = w[...]
    return value if value.dtype == act_dtype(cfg) else value.astype(act_dtype(cfg))


def linear(x_BTI: jax.Array, w_OI: jax.Array, out_dtype=None) -> jax.Array:
    """y[B, T, O] = x[B, T, I] @ w[O, I].T: weights stored 2-D, (out, in), as PyTorch does.

    One dot_general with no reshape of the weight or the input, so the pre-optimization HLO
    counts exactly W + x + y bytes. Measured on the 2-core CPU here (f32, B=1): 2-D (out, in)
    weights streamed 35-54 GB/s; weights with separate head axes, e.g. (D, 2, F) or (N, H, D),
    made XLA copy or transpose them and fell to 3-13 GB/s.

    (out, in) against (in, out), decided by measurement (the two timed interleaved in one
    process, three processes, shapes 1024..11008 wide): at B=1 XLA:CPU runs (out, in) as a
    matrix-vector product at 1.2-1.4x the speed of (in, out) (4096 x 11008: 27.7 against 23.5
    GB/s); at B=2..16 both go to its small-M matrix product (YNNPACK), which reads the weight at
    7-8 GB/s stored (out, in) and 12-16 GB/s stored (in, out). Neither brings B>1 near its bound
    (about the B=1 time): no XLA:CPU flag helps (YNNPACK off: 0.9 GB/s; oneDNN: 4-7 GB/s). The
    B=1 step, the seed's headline case, decides: (out, in).
    """
    return jnp.einsum("BTI,OI->BTO", x_BTI, w_OI, preferred_element_type=out_dtype)


class RMSNorm(nnx.Module):
    """x * rsqrt(mean(x^2) + eps) * w, reduced in f32 (as Hugging Face's LlamaRMSNorm); with
    `cfg.norm_plus_one` Gemma's x * rsqrt(...) * (1 + w), all in f32 (w stored from 0). `dim`:
    the normalised width (d_model, or head_dim for the q/k norms)."""

    def __init__(self, cfg: ModelConfig, dim: int | None = None):
        self.cfg = cfg
        init = jnp.zeros if cfg.norm_plus_one else jnp.ones
        self.scale = nnx.Param(init((dim or cfg.d_model,), weight_dtype(cfg)))

    def __call__(self, x_BTD: jax.Array) -> jax.Array:
        cfg = self.cfg
        return rms_norm(x_BTD, read(self.scale, cfg), cfg.norm_eps, cfg.norm_plus_one)


class LayerNorm(nnx.Module):
    """(x - mean) * rsqrt(var + eps) * w (+ b), reduced in f32 (torch's nn.LayerNorm:
    StarCoder2, StableLM with a bias, Cohere without)."""

    def __init__(self, cfg: ModelConfig, dim: int | None = None):
        self.cfg = cfg
        d = dim or cfg.d_model
        self.scale = nnx.Param(jnp.ones((d,), weight_dtype(cfg)))
        self.bias = nnx.Param(jnp.zeros((d,), weight_dtype(cfg))) if cfg.norm_bias else None

    def __call__(self, x_BTD: jax.Array) -> jax.Array:
        cfg = self.cfg
        bias = None if self.bias is None else read(self.bias, cfg)
        return layer_norm(x_BTD, read(self.scale, cfg), bias, cfg.norm_eps)


def layer_norm(x_BTD: jax.Array, scale_D: jax.Array, bias_D, eps: float) -> jax.Array:
    x = x_BTD.astype(jnp.float32)
    centred = x - jnp.mean(x, axis=-1, keepdims=True)
    inv = jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + eps)
    y = (centred * inv).astype(x_BTD.dtype) * scale_D
    return y if bias_D is None else y + bias_D


def block_norm(cfg: ModelConfig):
    """A block's (and the final) norm: RMSNorm, or LayerNorm (`cfg.norm_kind`)."""
    return LayerNorm(cfg) if cfg.norm_kind == "layer" else RMSNorm(cfg)


def rms_norm(x_BTD: jax.Array, scale_D: jax.Array, eps: float, plus_one: bool = False):
    """Llama casts the normalised x back before the scale; Gemma scales by 1 + w in f32 and casts
    last (Hugging Face GemmaRMSNorm)."""
    x = x_BTD.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    if plus_one:
        return (x * inv * (1.0 + scale_D.astype(jnp.float32))).astype(x_BTD.dtype)
    return (x * inv).astype(x_BTD.dtype) * scale_D


def rope_tables(
    positions_BT: jax.Array,
    head_dim: int,
    theta: float,
    factor: float = 1.0,
    inv_freq=None,
    attention_factor: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """cos and sin of shape [B, T, H/2] for integer positions; `factor` > 1 is Hugging Face's
    "linear" scaling (inverse frequencies divided by it). `inv_freq` (H/2 numbers: a long-context
    scaling's, `kvjax.model.rope`) replaces the computed frequencies as a constant; YaRN's
    `attention_factor` multiplies cos and sin."""
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
        if factor != 1.0:
            inv_freq = inv_freq / factor
    else:
        inv_freq = jnp.asarray(np.asarray(inv_freq, np.float32))
    angles_BTh = positions_BT.astype(jnp.float32)[..., None] * inv_freq
    cos_BTh, sin_BTh = jnp.cos(angles_BTh), jnp.sin(angles_BTh)
    if attention_factor != 1.0:
        cos_BTh, sin_BTh = cos_BTh * attention_factor, sin_BTh * attention_factor
    return cos_BTh, sin_BTh


def layer_rope_tables(cfg: ModelConfig, layer_rope: tuple, sliding: bool, width: int):
    """`rope_tables`' keyword arguments for a layer: (base, linear factor) from
    `cfg.layer_rope`, and the long-context scaling's frequencies where the layer has them."""
    theta, factor = layer_rope
    if not cfg.rope_table(sliding):
        return {"theta": theta, "factor": factor}
    inv_freq = tuple(float(x) for x in inverse_frequencies(cfg, width, theta))
    return {"theta": theta, "inv_freq": inv_freq, "attention_factor": cfg.rope_attention_factor}


def apply_rope(x_BT_H: jax.Array, cos_BTh: jax.Array, sin_BTh: jax.Array) -> jax.Array:
    """Rotate-half RoPE (Hugging Face Llama layout) on x [B, T, ..., H]; heads broadcast."""
    extra = x_BT_H.ndim - 3  # head axes between T and H
    shape = cos_BTh.shape[:2] + (1,) * extra + cos_BTh.shape[2:]
    cos = cos_BTh.reshape(shape).astype(x_BT_H.dtype)
    sin = sin_BTh.reshape(shape).astype(x_BT_H.dtype)
    x1, x2 = jnp.split(x_BT_H, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
