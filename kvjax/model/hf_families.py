"""The families' own fields in a Hugging Face config.json, beyond the shape every family has: MLA's
latent (DeepSeek-V2/V3), the experts (Mixtral, Qwen-MoE, OLMoE, DeepSeek, gpt-oss), sliding
windows and their per-layer pattern, the MLP's activation and the projections' biases, and what
each family changes in Llama's block (norms, q/k norms, parallel blocks, NoPE layers), each read
from the keys its transformers config class and modeling file use. `kvjax.model.hf` runs them in
order over one file; the typed reads and the later families' own helpers are
`kvjax.model.hf_fields`, the hybrids' `kvjax.model.hf_hybrid`."""

from __future__ import annotations

from typing import Any

from kvjax.errors import KvjaxError
from kvjax.model.hf_fields import (
    _Fields,
    _gpt_oss_fields,
    _granite_fields,
    _period,
    _rope_pattern,
    llama4_fields,
    shared_expert_fields,
)
from kvjax.model.hf_hybrid import HYBRID_TYPES

_HF_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_fast": "gelu",
    "xielu": "xielu",
}
_O_BIAS_IS_ATTENTION_BIAS = (
    "llama",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gemma3",
    "granite",
    "apertus",
    "llama4_text",
)
_GEMMA = ("gemma", "gemma2", "gemma3_text", "gemma3")
_MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")


def _mla_fields(f: _Fields, data: dict, fields: dict, model_type: str, where: str) -> dict:
    """DeepSeek-V2/V3 attention: the latent fields, head_dim = qk_nope + qk_rope (Hugging Face
    writes `head_dim` = qk_rope_head_dim there, which is not the query/key width)."""
    out = {"kv_lora_rank": f.integer("kv_lora_rank"), "q_lora_rank": f.integer("q_lora_rank", 0)}
    nope, rope = f.integer("qk_nope_head_dim"), f.integer("qk_rope_head_dim")
    out["v_head_dim"] = f.integer("v_head_dim")
    given = {
        "kv_lora_rank": out["kv_lora_rank"],
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": out["v_head_dim"],
    }
    missing = [key for key, value in given.items() if not value]
    if missing:
        raise KvjaxError(f"{where} is incomplete for MLA: missing {', '.join(missing)}")
    out["qk_rope_head_dim"], out["head_dim"] = rope, nope + rope
    out["num_kv_heads"] = fields["num_heads"]  # every head expands its own key and value
    return out


def _layer_index(data: dict, key: str, where: str, default: int = 0) -> int:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KvjaxError(f"{where}: {key}={value!r} must be an integer >= 0")
    return value


def _moe_fields(f: _Fields, data: dict, fields: dict, model_type: str, where: str) -> dict:
    """Mixture-of-experts fields: Mixtral (`num_local_experts`, every layer), Qwen3-MoE
    (`num_experts`, `moe_intermediate_size`, `norm_topk_prob`), DeepSeek-V2/V3
    (`n_routed_experts`, `n_shared_experts`, `first_k_dense_replace`, routing by `topk_method` /
    `scoring_func`, `n_group` / `topk_group`, `routed_scaling_factor`). A layout kvjax does not
    model (MoE every other layer, dense layers not first) is refused by name."""
    layers = fields["num_layers"]
    if model_type == "mixtral":
        experts, width = f.integer("num_local_experts", 8), fields["d_ff"]
    elif model_type in ("qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss"):
        # the Hub's configs write num_experts, transformers 5 num_local_experts
        experts = f.integer("num_experts") or f.integer("num_local_experts")
        # OLMoE's and gpt-oss's experts are intermediate_size wide (no dense MLP)
        dense_width = model_type in ("olmoe", "gpt_oss")
        width = fields["d_ff"] if dense_width else f.integer("moe_intermediate_size")
        step = _layer_index(data, "decoder_sparse_step", where, 1)
        if step != 1 or data.get("mlp_only_layers"):
            raise KvjaxError(
                f"{where}: decoder_sparse_step={step}, mlp_only_layers="
                f"{data.get('mlp_only_layers')!r}: only every layer MoE (1, []) is modelled"
            )
    else:
        experts = f.integer("n_routed_experts") or f.integer("num_local_experts", 0)
        width = f.integer("moe_intermediate_size")
    if not experts:
        return {}
    out: dict[str, Any] = {"num_experts": experts, "moe_d_ff": width}
    out["experts_per_token"] = f.integer("num_experts_per_tok", 2)
    if model_type.startswith("deepseek"):
        first = _layer_index(data, "first_k_dense_replace", where)
        freq = _layer_index(data, "moe_layer_freq", where, 1)
        if freq != 1:
            raise KvjaxError(f"{where}: moe_layer_freq={freq}: only 1 (every layer) is modelled")
        if first >= layers:  # every layer dense: not an MoE model
            return {}
        out["first_dense_layers"] = first
        out["num_shared_experts"] = _layer_index(data, "n_shared_experts", where)
        out["routed_scaling_factor"] = f.number("routed_scaling_factor") or 1.0
        v3 = model_type == "deepseek_v3"
        out["router"] = "sigmoid" if v3 else "softmax"
        out["norm_topk_prob"] = f.boolean("norm_topk_prob", True) if v3 else False
        grouped = v3 or f.text("topk_method") == "group_limited_greedy"
        if grouped:
            out["expert_groups"] = f.integer("n_group", 1)
            out["topk_groups"] = f.integer("topk_group", 1)
    elif model_type in ("qwen3_moe", "qwen2_moe", "olmoe"):
        out["norm_topk_prob"] = f.boolean("norm_topk_prob", False)
    if model_type == "qwen2_moe":  # one gated shared expert, of any width
        shared = f.integer("shared_expert_intermediate_size", 0) or 0
        out.update(shared_expert_fields(shared, width))
    return out


_LAYER_TYPES = {"sliding_attention": "L", "full_attention": "G"}


def _window_fields(f: _Fields, data: dict, layers: int, model_type: str, where: str) -> dict:
    """`sliding_window` and the per-layer pattern: an explicit `layer_types` list (newer configs),
    else Gemma 2's alternation (local first), Gemma 3's `sliding_window_pattern` (n-1 local, then
    one global), Qwen's `use_sliding_window` with `max_window_layers` (layers from that index on
    slide), or every layer (Mistral v0.1). A null or absent window is full attention."""
    if data.get("use_sliding_window") is False:  # Qwen2-MoE then writes sliding_window 0
        window = 0 if data.get("sliding_window") in (0, None) else f.integer("sliding_window")
    else:
        window = f.integer("sliding_window", default=0)
    types = data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or set(types) - set(_LAYER_TYPES):
            raise KvjaxError(
                f"{where}: layer_types must list {layers} entries of "
                f"{', '.join(_LAYER_TYPES)}, got {str(types)[:80]}"
            )
        pattern = _period("".join(_LAYER_TYPES[t] for t in types))
        return {"sliding_window": window, "layer_pattern": pattern} if "L" in pattern else {}
    if not window:
        return {}
    if model_type in ("qwen2", "qwen3"):
        if not f.boolean("use_sliding_window", False):
            return {}  # Qwen configs carry a window they do not use
        first = data.get("max_window_layers", 0) or 0
        pattern = "".join("L" if i >= first else "G" for i in range(layers))
    elif model_type in ("gemma2", "gpt_oss"):
        pattern = "LG"  # Gemma2Config, GptOssConfig: layer i slides when i is even
    elif model_type in ("gemma3", "gemma3_text"):
        every = f.integer("sliding_window_pattern", default=6)
        pattern = "L" * (every - 1) + "G"
    elif model_type in ("exaone4", "cohere2"):  # without layer_types: every n-th layer global
        every = data.get("sliding_window_pattern", 4)
        if isinstance(every, str) and every and not set(every) - {"L", "G"}:
            pattern = every
        else:
            every = f.integer("sliding_window_pattern", default=4)
            pattern = "L" * (every - 1) + "G"
    else:
        pattern = "L"
    return {"sliding_window": window, "layer_pattern": pattern} if "L" in pattern else {}


def gemma_qwen_fields(f: _Fields, model_type: str) -> dict:
    """Gemma's (1 + w) norms and sqrt(D) embedding scale; Gemma 2/3's sandwich norms, softmax
    scale and soft-capping; Gemma 3's, Qwen3's and Apertus's per-head q/k norms."""
    out: dict[str, Any] = {}
    if model_type in _GEMMA:
        out.update(norm_plus_one=True, scale_embeddings=True)
    if model_type in ("gemma2", "gemma3", "gemma3_text"):
        out["sandwich_norms"] = True
        if (scalar := f.number("query_pre_attn_scalar")) is not None:
            out["query_pre_attn_scalar"] = scalar
        for old, new in (
            ("attn_logit_softcapping", "attn_softcap"),
            ("final_logit_softcapping", "final_softcap"),
        ):
            if (cap := f.number(old)) is not None:
                out[new] = cap
    if model_type in ("gemma3", "gemma3_text", "qwen3", "qwen3_moe", "apertus"):
        out["qk_norm"] = True
    return out


def layout_fields(f: _Fields, data: dict, fields: dict, model_type: str, where: str) -> None:
    """MLA's latent, the experts and the attention's windows (or Llama 4's chunks), in place."""
    if model_type in _MLA_MODEL_TYPES:
        fields.update(_mla_fields(f, data, fields, model_type, where))
    if model_type in ("mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss", *_MLA_MODEL_TYPES):
        fields.update(_moe_fields(f, data, fields, model_type, where))
    if model_type == "llama4_text":
        fields.update(llama4_fields(f, data, fields, where))
    elif model_type not in HYBRID_TYPES:  # their layer_types name state layers
        fields.update(_window_fields(f, data, fields["num_layers"], model_type, where))


def bias_fields(f: _Fields, fields: dict, model_type: str) -> None:
    """The MLP's activation, tied embeddings and the projections' biases, in place."""
    act = f.text("hidden_activation", _HF_ACTIVATIONS) or f.text("hidden_act", _HF_ACTIVATIONS)
    fields["mlp_activation"] = _HF_ACTIVATIONS[act or "silu"]
    fields["tied_embeddings"] = f.boolean("tie_word_embeddings", model_type in _GEMMA)
    # Seed-OSS's config class defaults attention_bias to True (a Hub file may omit it)
    fields["qkv_bias"] = f.boolean("attention_bias", model_type in ("qwen2", "seed_oss", "glm4"))
    if model_type == "qwen2_moe":  # its own key, true by default
        fields["qkv_bias"] = f.boolean("qkv_bias", True)
    if model_type == "internlm3":
        # Run as Llama: qkv_bias (attention_bias) on q, k, v and o, and bias (mlp_bias) on the
        # MLP; transformers 4's Hub files write qkv_bias and bias.
        fields["qkv_bias"] = f.boolean("qkv_bias", fields["qkv_bias"])
        fields["o_bias"] = fields["qkv_bias"]
        fields["mlp_bias"] = f.boolean("bias", f.boolean("mlp_bias", False))
    if model_type in _O_BIAS_IS_ATTENTION_BIAS:
        fields["o_bias"] = fields["qkv_bias"]
    elif model_type == "seed_oss":
        fields["o_bias"] = f.boolean("attention_out_bias", False)
    if model_type in ("llama", "seed_oss", "granite", "smollm3"):
        fields["mlp_bias"] = f.boolean("mlp_bias", False)


def family_fields(f: _Fields, data: dict, fields: dict, model_type: str, where: str) -> None:
    """What a family changes in Llama's block (norms, biases, q/k norms, NoPE layers), in place."""
    if model_type == "starcoder2":  # LayerNorm with bias; a bias on every projection
        bias = f.boolean("use_bias", True)
        fields.update(
            norm_kind="layer",
            norm_bias=True,
            gated_mlp=False,
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bias,
        )
        if (eps := f.number("norm_epsilon")) is not None:
            fields["norm_eps"] = eps
    if model_type == "stablelm":  # LayerNorm with bias, partial rotary (its default 0.25)
        for flag in ("qk_layernorm", "use_parallel_residual"):
            if f.boolean(flag, False):
                raise KvjaxError(f"{where}: {flag}=true (StableLM) is not supported by kvjax")
        fields.update(norm_kind="layer", norm_bias=True, qkv_bias=f.boolean("use_qkv_bias", False))
        fields["head_dim"] = fields["d_model"] // fields["num_heads"]  # its modeling file's rule
        if (eps := f.number("layer_norm_eps")) is not None:
            fields["norm_eps"] = eps
    if model_type == "olmo2":  # norms after attention and MLP only; q/k normed whole
        fields.update(pre_norms=False, sandwich_norms=True, qk_norm=True, qk_norm_full=True)
        fields["o_bias"] = fields["qkv_bias"]
    if model_type == "ernie4_5":  # use_bias on every projection
        bias = f.boolean("use_bias", False)
        fields.update(qkv_bias=bias, o_bias=bias, mlp_bias=bias)
    if model_type == "apertus":  # up -> xIELU -> down (its hidden_act), no MLP bias
        fields["gated_mlp"] = False
    if model_type == "glm4":  # a norm before and after attention and the MLP
        fields["sandwich_norms"] = True
    if model_type == "exaone4":
        # Norms after attention and MLP only, per-head q/k norms, and with a window RoPE on the
        # sliding layers only (the global ones are NoPE).
        fields.update(pre_norms=False, sandwich_norms=True, qk_norm=True)
        if fields.get("sliding_window"):
            fields["rope_pattern"] = fields["layer_pattern"].replace("L", "R").replace("G", "N")
    if model_type == "cohere2":
        # One LayerNorm (no bias) before a parallel attention and MLP, logits times logit_scale,
        # and with a window RoPE on the sliding layers only.
        fields.update(norm_kind="layer", parallel_block=True)
        if (eps := f.number("layer_norm_eps")) is not None:
            fields["norm_eps"] = eps
        fields["logits_scaling"] = 1.0 / (f.number("logit_scale") or 0.0625)
        if fields.get("sliding_window"):
            fields["rope_pattern"] = fields["layer_pattern"].replace("L", "R").replace("G", "N")
    if model_type == "olmoe":  # Llama's pre-norms; q/k normed whole, as OLMo 2
        if data.get("clip_qkv") is not None:
            raise KvjaxError(f"{where}: clip_qkv={data['clip_qkv']!r} (OLMoE) is not supported")
        fields.update(qk_norm=True, qk_norm_full=True, o_bias=fields["qkv_bias"])
    if model_type == "smollm3":
        fields["o_bias"] = fields["qkv_bias"]
        fields["rope_pattern"] = _rope_pattern(f, data, fields["num_layers"], where)
    if model_type == "granite":
        fields.update(_granite_fields(f))
    if model_type == "gpt_oss":
        fields.update(_gpt_oss_fields(f, data, fields))
