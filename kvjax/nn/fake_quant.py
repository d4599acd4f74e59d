"""What a quantized KV cache gives back, simulated in the uncached forward: the quality of a cache
dtype measured on a trained model (`Transformer.__call__(tokens, kv_dtype=...)`) without decoding
token by token.

A decode step reads the cached rows as the cache holds them and its own new k, v fresh, so query
t reads key j (and value j) quantized iff j had been written, and quantized, when t ran:

- a 1-byte cache (int8 / fp8, scales as `kv_cache.quantize` makes them): every j < t;
- a packed 4/2-bit cache (KIVI: Liu et al., 2024): keys quantized per channel over groups of G
  tokens, values per token over groups of G channels, asymmetric (`levels` = 2^bits - 1 steps
  of (max - min) / levels from min, scale and zero point held in f16, as the closed form sizes
  them). A group of tokens is quantized once its G tokens are written and held at full precision
  until then (KIVI's residual, here G tokens long), so j is read quantized iff its group ends
  before t's begins: j // G < t // G.

Both are j // R < t // R, with R = 1 or G: `residual`. The forward thus reproduces decoding from
such a cache to float rounding (tests/test_quantized_kv.py decodes and compares); the packed
cache itself (two 4-bit values a byte) is not built: only its numbers are simulated.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig
from kvjax.nn.kv_cache import dequantize, quantize
from kvjax.nn.layers import kv_dtype

PACKED_LEVELS = {"int4": 15, "int2": 3}  # 2^bits - 1 steps between a group's min and max


def group_roundtrip(x: jax.Array, levels: int, group: int, axis: int) -> jax.Array:
    """`x` quantized asymmetrically in groups of `group` consecutive elements along `axis` and
    dequantized: q = round((x - min) / scale) in [0, levels], scale = (max - min) / levels, with
    scale and min rounded to f16 as the cache stores them. A trailing part shorter than a group
    (tokens of a group not yet full) comes back as it is."""
    axis = axis % x.ndim
    n = x.shape[axis] // group * group
    if n == 0:
        return x
    head = jax.lax.slice_in_dim(x, 0, n, axis=axis).astype(jnp.float32)
    shape = x.shape[:axis] + (n // group, group) + x.shape[axis + 1 :]
    g = head.reshape(shape)
    lo = jnp.min(g, axis=axis + 1, keepdims=True).astype(jnp.float16).astype(jnp.float32)
    hi = jnp.max(g, axis=axis + 1, keepdims=True)
    scale = ((hi - lo) / levels).astype(jnp.float16).astype(jnp.float32)
    safe = jnp.where(scale > 0, scale, 1.0)  # a constant group is its zero point exactly
    q = jnp.clip(jnp.round((g - lo) / safe), 0, levels)
    out = (q * scale + lo).reshape(head.shape).astype(x.dtype)
    return jnp.concatenate([out, jax.lax.slice_in_dim(x, n, None, axis=axis)], axis=axis)


def cache_view(cache_dtype: str, cfg: ModelConfig):
    """`fn(k_BTKH, v_BTKH) -> (k as cached, v as cached, residual)` for a cache of `cache_dtype`
    (its default scales; a packed cache in groups of `cfg.kv_group_size`)."""
    qcfg = cfg.replace(kv_dtype=cache_dtype, kv_scales="auto")  # validates the name and the group
    if qcfg.is_mla or not (qcfg.kv_packed or qcfg.kv_bytes_per_element == 1):
        raise KvjaxError(
            f"kv_dtype={cache_dtype!r}: the forward quantizes a GQA cache of 1 byte (int8, fp8) "
            f"or 4/2 bits (int4, int2); "
            f"{'MLA latents are not' if qcfg.is_mla else 'a wider cache is not'} quantized"
        )
    if qcfg.kv_packed:
        levels, G = PACKED_LEVELS[qcfg.kv_dtype], qcfg.kv_group_size

        def packed(k_BTKH, v_BTKH):  # keys per channel over tokens, values per token
            return group_roundtrip(k_BTKH, levels, G, 1), group_roundtrip(v_BTKH, levels, G, 3), G

        return packed
    kind, dtype = qcfg.kv_scale_kind, kv_dtype(qcfg)

    def one_byte(k_BTKH, v_BTKH):
        def roundtrip(x):
            scale = jnp.ones((), jnp.float32) if kind == "tensor" else None
            q, scale = quantize(x, dtype, kind, scale)
            return dequantize(q, scale, x.dtype, axis=-1)

        return roundtrip(k_BTKH), roundtrip(v_BTKH), 1

    return one_byte


def read_quantized(T: int, residual: int) -> jax.Array:
    """[T, T]: query t reads key j from the quantized cache (j // residual < t // residual)."""
    blocks = jnp.arange(T) // residual
    return blocks[None, :] < blocks[:, None]
