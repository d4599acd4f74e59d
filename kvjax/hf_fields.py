"""What each Hugging Face family's config.json says, read field by field: typed reads (`_Fields`),
the per-layer pattern helper, and the later families' own fields and class defaults (issue 29).
`kvjax.hf_config` assembles a `ModelConfig` from them."""

from __future__ import annotations

import math
from typing import Any

from kvjax.errors import KvjaxError

# The later families' config-class defaults that differ from kvjax's (transformers 5), for the
# keys a Hub config.json may omit because it equals them.
_FAMILY_DEFAULTS = {
    "seed_oss": {"attention_bias": True, "rms_norm_eps": 1e-6},
    "granite": {"rms_norm_eps": 1e-6},
    "smollm3": {"rope_theta": 2_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True},
    "phi3": {"vocab_size": 32064},
    "starcoder2": {"tie_word_embeddings": True, "hidden_act": "gelu_pytorch_tanh"},
    "stablelm": {"partial_rotary_factor": 0.25},
    "qwen2_moe": {"rms_norm_eps": 1e-6},
    "glm4": {"partial_rotary_factor": 0.5, "rms_norm_eps": 1.5625e-7, "vocab_size": 151552},
    "ernie4_5": {"rope_theta": 500_000.0, "tie_word_embeddings": True, "head_dim": 128},
    "cohere2": {"tie_word_embeddings": True, "sliding_window": 4096},
    "apertus": {"hidden_act": "xielu", "rope_theta": 12_000_000.0},
}


class _Fields:
    """Typed reads of a config.json's fields: a wrong type or range is one line naming the
    field, never a Python error and never a silent default (a 0 stays 0 and is refused)."""

    def __init__(self, data: dict[str, Any], where: str):
        self.data, self.where = data, where

    def _bad(self, key: str, want: str) -> KvjaxError:
        return KvjaxError(f"{self.where}: {key}={self.data[key]!r} must be {want}")

    def integer(self, key: str, default: Any = None) -> Any:
        if key not in self.data or self.data[key] is None:
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self._bad(key, "a positive integer")
        return value

    def number(self, key: str) -> float | None:
        if key not in self.data or self.data[key] is None:
            return None
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise self._bad(key, "a positive number")
        if not math.isfinite(value):
            raise self._bad(key, "a finite positive number")
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        if key not in self.data or self.data[key] is None:
            return default
        if not isinstance(self.data[key], bool):
            raise self._bad(key, "true or false")
        return self.data[key]

    def text(self, key: str, allowed=None) -> str | None:
        if key not in self.data or self.data[key] is None:
            return None
        value = self.data[key]
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        if allowed is not None and value not in allowed:
            raise KvjaxError(
                f"{self.where}: {key}={value!r} is not supported; allowed: {', '.join(allowed)}"
            )
        return value


def _period(pattern: str) -> str:
    """The shortest prefix that tiles to `pattern` ('LGLGL' -> 'LG'; 62 Gemma 3 layers ->
    'LLLLLG'): the same layers, written as the model card does."""
    for p in range(1, len(pattern) + 1):
        if all(pattern[i] == pattern[i % p] for i in range(len(pattern))):
            return pattern[:p]
    return pattern


def _rope_pattern(f: _Fields, data: dict, layers: int, where: str) -> str:
    """SmolLM3's NoPE layers: `no_rope_layers` (1: RoPE, 0: none, one per layer), else one NoPE
    layer every `no_rope_layer_interval` (SmolLM3Config's default 4: layers 3, 7, ...)."""
    flags = data.get("no_rope_layers")
    if flags is None:
        every = f.integer("no_rope_layer_interval", default=4)
        flags = [int((i + 1) % every != 0) for i in range(layers)]
    if not isinstance(flags, list) or len(flags) != layers or set(flags) - {0, 1}:
        raise KvjaxError(f"{where}: no_rope_layers must list {layers} entries of 0 and 1")
    return _period("".join("R" if flag else "N" for flag in flags))


def _granite_fields(f: _Fields) -> dict:
    """Granite's muP multipliers (GraniteConfig's defaults: 1.0 each); its attention_multiplier
    is the softmax scale itself, kvjax's 1/sqrt(query_pre_attn_scalar)."""
    out: dict[str, float] = {}
    for key in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
        if (value := f.number(key)) is not None:
            out[key] = value
    scale = f.number("attention_multiplier")
    out["query_pre_attn_scalar"] = 1.0 / (1.0 if scale is None else scale) ** 2
    return out


# Issue 29's families not built yet: a file of one is refused by name, with what it needs, rather
# than read as a Llama and given a silently wrong cache or FLOP count.
_NOT_YET = {
    "internlm3": "transformers ships no modeling file for it, so there is no parity reference",
    "gpt_oss": "learned attention sinks, clamped SwiGLU experts with biases, YaRN RoPE and "
    "MXFP4 expert weights",
    "llama4_text": "chunked attention, L2 q/k norms, attention temperature tuning and "
    "interleaved MoE layers",
    "llama4": "chunked attention, L2 q/k norms, attention temperature tuning and "
    "interleaved MoE layers",
}
