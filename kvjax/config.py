"""Model configuration: `ModelConfig` (frozen, validated) and the published presets.

Hugging Face `config.json` import is `kvjax.hf_config`. Letters: `kvjax.kernels`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvjax.errors import KvjaxError, unknown_name_error

# Bytes per element. int8 and fp8 are both one byte (the seed's "bytes" factor); the KV cache of an
# fp8 or int8 model is sized the same way.
DTYPE_BYTES: dict[str, int] = {"f32": 4, "bf16": 2, "f16": 2, "fp8": 1, "int8": 1}
_DTYPE_ALIASES = {
    "float32": "f32",
    "fp32": "f32",
    "bfloat16": "bf16",
    "float16": "f16",
    "fp16": "f16",
    "half": "f16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "e4m3": "fp8",
}
ACTIVATIONS = ("silu", "gelu")


def canonical_dtype(dtype: str, field: str = "dtype") -> str:
    """Normalise a dtype name ('bfloat16' -> 'bf16'), or raise naming the field and the allowed."""
    if not isinstance(dtype, str):
        raise KvjaxError(
            f"{field}={dtype!r} is not a dtype name; allowed: {', '.join(DTYPE_BYTES)}"
        )
    key = dtype.strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise KvjaxError(f"{field}={dtype!r} is not supported; allowed: {', '.join(DTYPE_BYTES)}")
    return key


_INT_FIELDS = (
    "num_layers",
    "d_model",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "d_ff",
    "vocab_size",
)


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer (Llama family), validated on construction.

    `head_dim` is its own field: Gemma-7B has 16 heads of 256 with d_model 3072, so it can never be
    derived as d_model // num_heads. A variant is `dataclasses.replace(cfg, num_kv_heads=8)`, which
    runs the same validation.
    """

    num_layers: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    gated_mlp: bool = True  # SwiGLU/GeGLU: gate, up and down matrices; else up and down
    mlp_activation: str = "silu"
    tied_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 has biases on the q, k and v projections
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    name: str = "custom"

    def __post_init__(self) -> None:
        for field in _INT_FIELDS:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise KvjaxError(f"{field}={value!r} must be a positive integer")
            if value <= 0:
                raise KvjaxError(f"{field}={value} must be a positive integer (> 0)")
        if self.num_heads % self.num_kv_heads:
            divisors = [k for k in range(1, self.num_heads + 1) if self.num_heads % k == 0]
            raise KvjaxError(
                f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}; "
                f"allowed num_kv_heads: {', '.join(map(str, divisors))}"
            )
        for field in ("gated_mlp", "tied_embeddings", "qkv_bias"):
            if not isinstance(getattr(self, field), bool):
                raise KvjaxError(f"{field}={getattr(self, field)!r} must be true or false")
        if self.mlp_activation not in ACTIVATIONS:
            raise KvjaxError(
                f"mlp_activation={self.mlp_activation!r} is not supported; "
                f"allowed: {', '.join(ACTIVATIONS)}"
            )
        object.__setattr__(self, "weight_dtype", canonical_dtype(self.weight_dtype, "weight_dtype"))
        object.__setattr__(self, "kv_dtype", canonical_dtype(self.kv_dtype, "kv_dtype"))
        for field in ("rope_theta", "norm_eps"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise KvjaxError(f"{field}={value!r} must be a positive number")

    # Derived sizes (levanter style: properties, never stored).
    @property
    def group_size(self) -> int:
        """G = N / K query heads per kv head."""
        return self.num_heads // self.num_kv_heads

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def weight_bytes_per_element(self) -> int:
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def kv_bytes_per_element(self) -> int:
        return DTYPE_BYTES[self.kv_dtype]

    @property
    def compute_dtype(self) -> str:
        """Activations and matmuls run in the weight dtype; int8/fp8 weights compute in bf16."""
        return self.weight_dtype if DTYPE_BYTES[self.weight_dtype] >= 2 else "bf16"

    @property
    def attention_variant(self) -> str:
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        if self.num_kv_heads == 1:
            return "MQA"
        return "GQA"

    def kv_head_choices(self) -> list[int]:
        """Every valid num_kv_heads for this model: the divisors of num_heads."""
        return [k for k in range(1, self.num_heads + 1) if self.num_heads % k == 0]

    def replace(self, **changes: Any) -> ModelConfig:
        """`dataclasses.replace` with a clear error for an unknown field."""
        names = {f.name for f in dataclasses.fields(self)}
        for key in changes:
            if key not in names:
                raise unknown_name_error("ModelConfig field", key, names)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_hf_config(cls, path: str | Path, **overrides: Any) -> ModelConfig:
        """Read a local Hugging Face `config.json` (Llama, Mistral, Qwen2, Gemma). No network."""
        from kvjax.hf_config import from_hf_config

        return from_hf_config(path, **overrides)


# --------------------------------------------------------------------------------------------
# Presets. Each cites the published config it comes from; parameter counts are checked in tests
# against the published totals.
# --------------------------------------------------------------------------------------------
PRESETS: dict[str, ModelConfig] = {}


def _preset(cfg: ModelConfig) -> ModelConfig:
    PRESETS[cfg.name] = cfg
    return cfg


# The seed's model ("a 70B-parameter, 80-layer model with d_h=128 in BF16", 64 query heads).
# The seed gives no other dimensions; the rest are Llama-3-70B's (Meta, 2024,
# meta-llama/Meta-Llama-3-70B config.json), which makes N = 70.55e9 at num_kv_heads=8, the seed's
# "70B". num_kv_heads is the seed's variable: 64 (MHA), 8 (GQA, default), 1 (MQA). The weights
# then depend on it (K/V projections are 2*D*K*H per layer): MHA is 79.9e9 parameters, MQA 69.2e9.
_preset(
    ModelConfig(
        name="seed-70b",
        num_layers=80,
        d_model=8192,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        d_ff=28672,
        vocab_size=128256,
        rope_theta=500000.0,
    )
)
# meta-llama/Llama-2-7b-hf config.json (Touvron et al., 2023): 6.74e9 parameters.
_preset(
    ModelConfig(
        name="llama-2-7b",
        num_layers=32,
        d_model=4096,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        d_ff=11008,
        vocab_size=32000,
        norm_eps=1e-5,
    )
)
# meta-llama/Llama-2-13b-hf config.json: 13.0e9 parameters.
_preset(
    ModelConfig(
        name="llama-2-13b",
        num_layers=40,
        d_model=5120,
        num_heads=40,
        num_kv_heads=40,
        head_dim=128,
        d_ff=13824,
        vocab_size=32000,
    )
)
# meta-llama/Llama-2-70b-hf config.json: GQA with 8 kv heads, 69.0e9 parameters.
_preset(
    ModelConfig(
        name="llama-2-70b",
        num_layers=80,
        d_model=8192,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        d_ff=28672,
        vocab_size=32000,
    )
)
# meta-llama/Meta-Llama-3-8B config.json: 8.03e9 parameters, rope_theta 500000.
_preset(
    ModelConfig(
        name="llama-3-8b",
        num_layers=32,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        d_ff=14336,
        vocab_size=128256,
        rope_theta=500000.0,
    )
)
# meta-llama/Meta-Llama-3-70B config.json: 70.6e9 parameters.
_preset(
    ModelConfig(
        name="llama-3-70b",
        num_layers=80,
        d_model=8192,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        d_ff=28672,
        vocab_size=128256,
        rope_theta=500000.0,
    )
)
# mistralai/Mistral-7B-v0.1 config.json (Jiang et al., 2023): 7.24e9 parameters.
_preset(
    ModelConfig(
        name="mistral-7b",
        num_layers=32,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        d_ff=14336,
        vocab_size=32000,
    )
)
# Qwen/Qwen2.5-7B config.json (Qwen team, 2024): 7.61e9 parameters; biases on q, k, v.
_preset(
    ModelConfig(
        name="qwen2.5-7b",
        num_layers=28,
        d_model=3584,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        d_ff=18944,
        vocab_size=152064,
        qkv_bias=True,
        rope_theta=1000000.0,
        norm_eps=1e-6,
    )
)
# google/gemma-7b config.json (Gemma team, 2024): 8.54e9 parameters; head_dim 256 while
# d_model / num_heads = 192; GeGLU MLP; tied embeddings.
_preset(
    ModelConfig(
        name="gemma-7b",
        num_layers=28,
        d_model=3072,
        num_heads=16,
        num_kv_heads=16,
        head_dim=256,
        d_ff=24576,
        vocab_size=256000,
        mlp_activation="gelu",
        tied_embeddings=True,
        norm_eps=1e-6,
    )
)

# Tiny test configs: every dimension a distinct size (L=2, K in {12, 3, 1}, G in {1, 4, 12},
# H=8, D=40, F=56, V=97, N=12), so a transposed axis cannot hide behind an equal size.
_TINY = dict(
    num_layers=2,
    d_model=40,
    num_heads=12,
    head_dim=8,
    d_ff=56,
    vocab_size=97,
    weight_dtype="f32",
    kv_dtype="f32",
)
_preset(ModelConfig(name="tiny-mha", num_kv_heads=12, **_TINY))
_preset(ModelConfig(name="tiny-gqa", num_kv_heads=3, **_TINY))
_preset(ModelConfig(name="tiny-mqa", num_kv_heads=1, **_TINY))


def get_model_config(name: str, **overrides: Any) -> ModelConfig:
    """A preset by name, optionally with fields replaced (`num_kv_heads=1`)."""
    if name not in PRESETS:
        raise unknown_name_error("model", name, PRESETS)
    cfg = PRESETS[name]
    return cfg.replace(**overrides) if overrides else cfg
