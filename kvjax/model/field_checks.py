"""The first checks of every `ModelConfig`, field by field: the shape's sizes positive integers and
num_heads divisible by num_kv_heads, the switches booleans, the scalars positive (or, where 0
means off, non-negative) and finite, and a known attention kernel. Each error is one line naming
the field and what is allowed. What the fields mean together is checked by `kvjax.model.checks`."""

from __future__ import annotations

from kvjax.errors import KvjaxError
from kvjax.model.checks import Fields

_INT_FIELDS = (
    "num_layers",
    "d_model",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "d_ff",
    "vocab_size",
)
_BOOL_FIELDS = (
    "gated_mlp",
    "tied_embeddings",
    "qkv_bias",
    "o_bias",
    "mlp_bias",
    "norm_bias",
    "norm_plus_one",
    "scale_embeddings",
    "sandwich_norms",
    "qk_norm",
    "qk_norm_full",
    "pre_norms",
    "parallel_block",
    "norm_topk_prob",
    "shared_expert_gate",
    "rope_truncate",
    "sink_logits",
    "router_bias",
    "expert_bias",
    "chunked_attention",
    "qk_l2_norm",
)
_POSITIVE_NUMBERS = (
    "rope_theta",
    "norm_eps",
    "rope_linear_factor",
    "embedding_multiplier",
    "residual_multiplier",
    "logits_scaling",
    "swiglu_alpha",
    "swiglu_limit",
)
_OPTIONAL_NUMBERS = ("query_pre_attn_scalar", "rope_local_theta", "attn_softcap", "final_softcap")


def check_shape(cfg: Fields) -> None:
    """The sizes are positive integers, the heads group evenly, the switches are booleans."""
    for field in _INT_FIELDS:
        value = getattr(cfg, field)
        if isinstance(value, bool) or not isinstance(value, int):
            raise KvjaxError(f"{field}={value!r} must be a positive integer")
        if value <= 0:
            raise KvjaxError(f"{field}={value} must be a positive integer (> 0)")
    if cfg.num_heads % cfg.num_kv_heads:
        divisors = [k for k in range(1, cfg.num_heads + 1) if cfg.num_heads % k == 0]
        raise KvjaxError(
            f"num_heads={cfg.num_heads} is not divisible by num_kv_heads={cfg.num_kv_heads}; "
            f"allowed num_kv_heads: {', '.join(map(str, divisors))}"
        )
    for field in _BOOL_FIELDS:
        if not isinstance(getattr(cfg, field), bool):
            raise KvjaxError(f"{field}={getattr(cfg, field)!r} must be true or false")


def check_numbers(cfg: Fields) -> None:
    """The scalars are finite, positive or (where 0 is off) non-negative; the kernel is known."""
    for field in _POSITIVE_NUMBERS:
        value = getattr(cfg, field)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise KvjaxError(f"{field}={value!r} must be a positive number")
        if value == float("inf"):
            raise KvjaxError(f"{field}={value!r} must be finite")
    for field in _OPTIONAL_NUMBERS:
        value = getattr(cfg, field)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise KvjaxError(f"{field}={value!r} must be a number >= 0 (0: off)")
        if value == float("inf"):
            raise KvjaxError(f"{field}={value!r} must be finite (0: off)")
    if cfg.attention_kernel not in ("xla", "flash"):
        raise KvjaxError(
            f"attention_kernel={cfg.attention_kernel!r} is not supported; allowed: xla, flash"
        )
