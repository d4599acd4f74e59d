"""What each Hugging Face family's config.json says, read field by field: typed reads (`_Fields`),
the per-layer pattern helper, RoPE scaling, and the own fields and config-class defaults of the
families `kvjax.model.presets_families` lists (Granite, gpt-oss, Llama 4, ...). `kvjax.model.hf`
assembles a `ModelConfig` from them."""

from __future__ import annotations

import math
from typing import Any

from kvjax.errors import KvjaxError
from kvjax.model.rope import yarn_mscale

# Those families' config-class defaults that differ from kvjax's (transformers 5), for the keys a
# Hub config.json may omit because it equals them.
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
    "internlm3": {"vocab_size": 128512, "num_key_value_heads": 2, "head_dim": 128},
    "apertus": {"hidden_act": "xielu", "rope_theta": 12_000_000.0},
    "gpt_oss": {
        "vocab_size": 201088,
        "head_dim": 64,
        "num_key_value_heads": 8,
        "sliding_window": 128,
        "attention_bias": True,
        "rope_theta": 150_000.0,
        "num_local_experts": 128,
        "num_experts_per_tok": 4,
    },
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


# GptOssConfig's RoPE when a file gives none: YaRN x32 over 4096 positions, not truncated
GPT_OSS_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


def _gpt_oss_fields(f: _Fields, data: dict, fields: dict) -> dict:
    """gpt-oss: sink logits, biases on q/k/v/o, the router and the experts, the clamped SwiGLU
    (swiglu_alpha 1.702 and swiglu_limit 7 unless given), top-k of the router's logits softmaxed
    (= softmax, top-k, renormalised), and MXFP4 experts where quantization_config says so."""
    out: dict[str, Any] = {
        "sink_logits": True,
        "router_bias": True,
        "expert_bias": True,
        "mlp_activation": "clamped_swiglu",
        "norm_topk_prob": True,
        "o_bias": fields["qkv_bias"],
    }
    for key in ("swiglu_alpha", "swiglu_limit"):
        if (value := f.number(key)) is not None:
            out[key] = value
    quant = data.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") == "mxfp4":
        out["expert_weight_dtype"] = "mxfp4"
    elif quant is not None:
        raise KvjaxError(
            f"{f.where}: quantization_config={str(quant)[:60]!r} is not supported for gpt_oss; "
            f"allowed: quant_method 'mxfp4' (or none)"
        )
    return out


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


# Families not built yet: a file of one is refused by name, with what it needs, rather than read
# as a Llama and given a silently wrong cache or FLOP count.
_NOT_YET: dict[str, str] = {}
# Llama4TextConfig's defaults (transformers 5: Llama-4-Scout-17B-16E's text model), for the keys a
# file omits; the multimodal `llama4` config's text_config is read the same way
_LLAMA4_DEFAULTS = {
    "vocab_size": 202048,
    "hidden_size": 5120,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "num_experts_per_tok": 1,
    "num_local_experts": 16,
    "interleave_moe_layer_step": 1,
    "use_qk_norm": True,
    "no_rope_layer_interval": 4,
    "attention_chunk_size": 8192,
    "attn_temperature_tuning": True,
    "floor_scale": 8192,
    "attn_scale": 0.1,
    "attention_bias": False,
    "rope_theta": 500_000.0,
}
_LLAMA4_LAYER_TYPES = {"chunked_attention": "L", "full_attention": "G"}


def llama4_data(data: dict, where: str) -> dict:
    """A llama4_text config (or a llama4 config's text_config) over its class defaults; an
    explicit null attention_chunk_size (no chunked layers) is kept."""
    text = data.get("text_config", data) if data.get("model_type") == "llama4" else data
    if not isinstance(text, dict):
        raise KvjaxError(f"{where}: text_config must be an object")
    present = {k: v for k, v in text.items() if v is not None}
    out = {
        **_LLAMA4_DEFAULTS,
        **present,
        "model_type": "llama4_text",
        "_name_or_path": data.get("_name_or_path"),
        "torch_dtype": text.get("torch_dtype") or data.get("torch_dtype"),
    }
    if "attention_chunk_size" in text and text["attention_chunk_size"] is None:
        out["attention_chunk_size"] = None
    return out


def llama4_fields(f: _Fields, data: dict, fields: dict, where: str) -> dict:
    """Llama 4's text model (Llama4TextModel): NoPE layers (`no_rope_layers`, else one every
    `no_rope_layer_interval`), chunked attention on the RoPE layers (`attention_chunk_size`, or
    an explicit `layer_types`) as the L layers with chunked_attention, L2 q/k norms on the RoPE
    layers (`use_qk_norm`), temperature tuning on the NoPE layers, and MoE every
    `interleave_moe_layer_step`-th layer (an explicit `moe_layers` must be that pattern): a
    router whose top-k sigmoids scale the expert input, one shared expert of intermediate_size;
    dense layers of intermediate_size_mlp."""
    layers = fields["num_layers"]
    out: dict[str, Any] = {"rope_pattern": _rope_pattern(f, data, layers, where)}
    rope = out["rope_pattern"]
    types = data.get("layer_types")
    chunk = data.get("attention_chunk_size")
    if types is None:
        types = [
            "chunked_attention"
            if rope[i % len(rope)] == "R" and chunk is not None
            else "full_attention"
            for i in range(layers)
        ]
    if not isinstance(types, list) or len(types) != layers or set(types) - set(_LLAMA4_LAYER_TYPES):
        raise KvjaxError(
            f"{where}: layer_types must list {layers} entries of "
            f"{', '.join(_LLAMA4_LAYER_TYPES)}, got {str(types)[:80]}"
        )
    pattern = _period("".join(_LLAMA4_LAYER_TYPES[t] for t in types))
    if "L" in pattern:
        window = f.integer("attention_chunk_size")
        if window is None:
            raise KvjaxError(f"{where}: chunked_attention layers need attention_chunk_size")
        out.update(sliding_window=window, layer_pattern=pattern, chunked_attention=True)
    out["qk_l2_norm"] = f.boolean("use_qk_norm", True)
    if f.boolean("attn_temperature_tuning", True):
        out["temperature_floor"] = f.integer("floor_scale", 8192)
        out["temperature_scale"] = f.number("attn_scale") or 0.1
    bias = f.boolean("attention_bias", False)
    out.update(qkv_bias=bias, o_bias=bias)
    step = f.integer("interleave_moe_layer_step", 1)
    moe = data.get("moe_layers")
    if moe is not None and moe != list(range(step - 1, layers, step)):
        raise KvjaxError(
            f"{where}: moe_layers={str(moe)[:60]} is not every interleave_moe_layer_step={step}"
            f"-th layer ({step - 1}, {2 * step - 1}, ...): only that pattern is modelled"
        )
    experts = f.integer("num_local_experts", 16)
    if step > layers or (moe is not None and not moe):  # no MoE layer: a dense model
        return {**out, "d_ff": f.integer("intermediate_size_mlp", 16384)}
    out.update(
        num_experts=experts,
        experts_per_token=f.integer("num_experts_per_tok", 1),
        moe_d_ff=fields["d_ff"],
        num_shared_experts=1,
        router="topk_sigmoid",
        norm_topk_prob=False,
        moe_layer_step=step,
        d_ff=f.integer("intermediate_size_mlp", 16384),
    )
    return out


def long_rope_fields(scaling: dict, kind: str, data: dict, model_type: str, where: str) -> dict:
    """Llama 3.1's `llama3` and YaRN's scaling (`kvjax.model.rope`) from a rope_scaling /
    rope_parameters dict, with Hugging Face's defaults (YaRN: factor = max positions / original
    when absent, beta_fast 32, beta_slow 1, truncate true; attention_factor from mscale and
    mscale_all_dim, else 0.1 ln(factor) + 1). DeepSeek's attention also multiplies its softmax
    scale by yarn_mscale(factor, mscale_all_dim)^2: returned as query_pre_attn_scalar."""
    f = _Fields(scaling, f"{where}: rope scaling")
    original = f.integer("original_max_position_embeddings")
    if original is None and kind == "yarn":
        original = _Fields(data, where).integer("max_position_embeddings")
    if original is None:
        raise KvjaxError(f"{where}: rope scaling {kind!r} needs original_max_position_embeddings")
    factor = f.number("factor")
    if factor is None and kind == "yarn":
        factor = _Fields(data, where).integer("max_position_embeddings", 0) / original
    if not factor:
        raise KvjaxError(f"{where}: rope scaling {kind!r} needs a factor")
    out: dict[str, Any] = {
        "rope_scaling": kind,
        "rope_factor": factor,
        "rope_original_context": original,
    }
    if kind == "llama3":
        out["rope_low_freq_factor"] = f.number("low_freq_factor") or 1.0
        out["rope_high_freq_factor"] = f.number("high_freq_factor") or 4.0
        return out
    out["rope_beta_fast"] = f.number("beta_fast") or 32.0
    out["rope_beta_slow"] = f.number("beta_slow") or 1.0
    out["rope_truncate"] = f.boolean("truncate", True)
    mscale, mscale_all = f.number("mscale"), f.number("mscale_all_dim")
    attention = f.number("attention_factor")
    if attention is None:
        attention = (
            yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
            if mscale and mscale_all
            else yarn_mscale(factor)
        )
    out["rope_attention_factor"] = attention
    if model_type in ("deepseek_v2", "deepseek_v3") and mscale_all:
        head_dim = data.get("qk_nope_head_dim", 0) + data.get("qk_rope_head_dim", 0)
        out["query_pre_attn_scalar"] = head_dim / yarn_mscale(factor, mscale_all) ** 4
    return out


def rope_scalings(data: dict) -> list[dict]:
    """Every RoPE scaling dict of a config: `rope_scaling`, and `rope_parameters` flat or per
    layer type (transformers 5)."""
    out = []
    for key in ("rope_scaling", "rope_parameters"):
        value = data.get(key)
        if isinstance(value, dict):
            nested = [v for v in value.values() if isinstance(v, dict)]
            out.extend(nested if nested else [value])
        elif value is not None:
            raise KvjaxError(f"config {key}={value!r} must be an object")
    return out


def _rope_fields(f: _Fields, data: dict, model_type: str, where: str) -> dict:
    """RoPE bases and linear scaling: `rope_theta` / `rope_scaling` (transformers 4), or
    `rope_parameters` (transformers 5: flat, or per layer type for Gemma 3); Gemma 3's local
    base `rope_local_base_freq`; Llama 3.1's and YaRN's long-context scalings. Any
    other (dynamic NTK, longrope) changes no cost and is left out (the checkpoint loader refuses
    it: `kvjax.nn.hf`)."""
    out: dict[str, float] = {}
    params = data.get("rope_parameters")
    if not isinstance(params, dict):
        params = {}
    full = params.get("full_attention", params)
    local = params.get("sliding_attention", {})
    full = full if isinstance(full, dict) else {}
    scaling = data.get("rope_scaling") or (full if "rope_type" in full else {})
    if not isinstance(scaling, dict):
        raise KvjaxError(f"{where}: rope_scaling={scaling!r} must be an object")
    theta = full.get("rope_theta") if isinstance(full, dict) else None
    theta = theta if theta is not None else f.number("rope_theta")
    if theta is not None:
        out["rope_theta"] = theta
    local_theta = local.get("rope_theta") if isinstance(local, dict) else None
    local_theta = local_theta if local_theta is not None else f.number("rope_local_base_freq")
    if local_theta is not None and model_type in ("gemma3", "gemma3_text"):
        out["rope_local_theta"] = local_theta
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        out["rope_linear_factor"] = scaling.get("factor", 1.0)
    elif kind in ("llama3", "yarn"):
        out.update(long_rope_fields(scaling, kind, data, model_type, where))
    # partial rotary (Phi-3, StableLM, GLM): in rope_parameters (transformers 5) or at the top
    partial = full.get("partial_rotary_factor") if isinstance(full, dict) else None
    partial = partial if partial is not None else f.number("partial_rotary_factor")
    if partial is not None and partial != 1.0:
        out["partial_rotary_factor"] = partial  # rotary_dim once head_dim is known
    return out


def shared_expert_fields(shared: int, width: int) -> dict:
    """Qwen2-MoE's gated shared expert of `shared_expert_intermediate_size` beside routed experts
    of `width`: whole routed experts where it is a multiple (num_shared_experts), else one
    shared expert of its own width (shared_expert_d_ff; transformers allows any width)."""
    if not shared:
        return {"num_shared_experts": 0, "shared_expert_gate": False}
    if shared % width == 0:
        return {"num_shared_experts": shared // width, "shared_expert_gate": True}
    return {"num_shared_experts": 1, "shared_expert_d_ff": shared, "shared_expert_gate": True}
