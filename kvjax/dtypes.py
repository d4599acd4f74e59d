"""Dtypes: bytes per element of weights, caches and states, the names kvjax accepts, and the
packed / block formats sized in closed form only. Re-exported by `kvjax.model.config`."""

from __future__ import annotations

from kvjax.errors import KvjaxError

# Bytes per element. int8 and fp8 are both one byte (the seed's "bytes" factor); the KV cache of an
# fp8 or int8 model is sized the same way.
DTYPE_BYTES: dict[str, int] = {"f32": 4, "bf16": 2, "f16": 2, "fp8": 1, "int8": 1}
# Every other spelling kvjax reads (CLI flags, experiment configs, the corpus CSVs, a config.json's
# torch_dtype): the one table of them. Both fp8 formats are one byte, sized alike.
_DTYPE_ALIASES = {
    "float32": "f32",
    "fp32": "f32",
    "bfloat16": "bf16",
    "float16": "f16",
    "fp16": "f16",
    "half": "f16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e4m3": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2": "fp8",
    "float8_e5m2fnuz": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "nvfp4": "fp4",
    "float4_e2m1": "fp4",
    "float4_e2m1fn": "fp4",
    "e2m1": "fp4",
}
# Matmul input dtypes with no array of their own here: a chip's FP4 tensor-core rate (NVFP4 on
# Blackwell), named by `--compute-dtype` and a chip's peaks, never a weight or cache dtype.
COMPUTE_ONLY_DTYPES = ("fp4",)
# Module prefixes a name may carry: `torch.bfloat16`, `jnp.float32`, `np.float16`.
_DTYPE_PREFIXES = ("torch.", "jax.numpy.", "jnp.", "numpy.", "np.")
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


def dtype_key(dtype: str) -> str:
    """The canonical spelling of `dtype` if it is an alias ('torch.bfloat16' -> 'bf16'), else
    `dtype` lowered: check it against the names allowed."""
    key = dtype.strip().lower()
    for prefix in _DTYPE_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix) :]
            break
    return _DTYPE_ALIASES.get(key, key)


def allowed_dtypes(packed: bool = False, compute: bool = False) -> list[str]:
    """The canonical names; `packed`: the 4/2-bit KV dtypes too; `compute`: fp4 (a matmul's)."""
    return [
        *DTYPE_BYTES,
        *(PACKED_KV_BYTES if packed else ()),
        *(COMPUTE_ONLY_DTYPES if compute else ()),
    ]


def dtype_choices(allowed) -> str:
    """'f32, bf16 (aliases: float32/fp32 -> f32, bfloat16 -> bf16; ...)': what a refusal lists
    (the aliases of the names allowed only)."""
    groups = {name: [a for a, c in _DTYPE_ALIASES.items() if c == name] for name in allowed}
    aliases = ", ".join(f"{'/'.join(a)} -> {name}" for name, a in groups.items() if a)
    prefixes = "/".join(_DTYPE_PREFIXES)
    return f"{', '.join(allowed)} (aliases: {aliases}; a {prefixes} prefix is dropped)"


def dtype_refusal(dtype, allowed) -> str:
    """The tail of a refused name's message: a hint where it is a KV-only dtype, and the
    allowed names with their aliases."""
    key = dtype_key(dtype) if isinstance(dtype, str) else None
    hint = ""
    if key in PACKED_KV_BYTES:  # int4 alone may be allowed (the corpus's weight-only rows)
        kv_only = f"{key} is a KV-cache dtype"
        if set(allowed).isdisjoint(PACKED_KV_BYTES):
            kv_only = "int4/int2 are KV-cache dtypes"
        hint = f" ({kv_only} only)"
    return f"{hint}; allowed: {dtype_choices(allowed)}"


def canonical_dtype(
    dtype: str, field: str = "dtype", packed: bool = False, compute: bool = False
) -> str:
    """Normalise a dtype name ('bfloat16' -> 'bf16'), or raise naming the field, the allowed and
    the aliases; `packed`: the 4/2-bit KV dtypes are allowed too; `compute`: fp4 too."""
    allowed = allowed_dtypes(packed, compute)
    if not isinstance(dtype, str):
        raise KvjaxError(f"{field}={dtype!r} is not a dtype name{dtype_refusal(dtype, allowed)}")
    key = dtype_key(dtype)
    if key not in allowed:
        raise KvjaxError(f"{field}={dtype!r} is not supported{dtype_refusal(dtype, allowed)}")
    return key
