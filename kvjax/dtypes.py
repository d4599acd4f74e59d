"""Dtypes: bytes per element of weights, caches and states, the names kvjax accepts, and the
packed / block formats sized in closed form only. Re-exported by `kvjax.model.config`."""

from __future__ import annotations

from kvjax.errors import KvjaxError

# Bytes per element. int8 and fp8 are both one byte (the seed's "bytes" factor); the KV cache of an
# fp8 or int8 model is sized the same way.
DTYPE_BYTES: dict[str, int] = {"f32": 4, "bf16": 2, "f16": 2, "fp8": 1, "int8": 1}
_DTYPE_ALIASES = {
    "float32": "f32", "fp32": "f32", "bfloat16": "bf16", "float16": "f16", "fp16": "f16",
    "half": "f16", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "e4m3": "fp8",
}  # fmt: skip
# Packed sub-byte KV caches (KIVI-style, Liu et al. 2024): closed form only (no model array), in
# bytes per element.
PACKED_KV_BYTES: dict[str, float] = {"int4": 0.5, "int2": 0.25}
# Expert weights stored apart from the rest (gpt-oss's MXFP4 checkpoints): 4-bit e2m1 elements
# and one e8m0 exponent per block of 32, 17 bytes a block = 4.25 bits an element. Closed form
# only: kvjax's model holds the experts dequantized (kvjax.nn.mxfp4).
MXFP4_BLOCK, MXFP4_BLOCK_BYTES = 32, 17
# Scales of a quantized KV cache: one f32 per tensor (per layer, K and V), per token per KV head,
# or (packed 4/2-bit) per group of `kv_group_size` elements an f16 scale and an f16 zero point.
SCALE_BYTES = 4  # scales are f32
GROUP_SCALE_BYTES = 4  # a group's f16 scale and f16 zero point


def canonical_dtype(dtype: str, field: str = "dtype", packed: bool = False) -> str:
    """Normalise a dtype name ('bfloat16' -> 'bf16'), or raise naming the field and the allowed;
    `packed`: the 4/2-bit KV dtypes are allowed too."""
    allowed = [*DTYPE_BYTES, *(PACKED_KV_BYTES if packed else ())]
    if not isinstance(dtype, str):
        raise KvjaxError(f"{field}={dtype!r} is not a dtype name; allowed: {', '.join(allowed)}")
    key = dtype.strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in allowed:
        hint = " (int4/int2 are KV-cache dtypes only)" if key in PACKED_KV_BYTES else ""
        raise KvjaxError(f"{field}={dtype!r} is not supported{hint}; allowed: {', '.join(allowed)}")
    return key
