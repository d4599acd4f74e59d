"""Hugging Face `config.json` import: a local file (or folder) to a `ModelConfig`. No network.

In order: the family's data (the text model of a multimodal config, its config class's defaults
for the keys a file omits), the shape every family has, then each family's own fields
(`kvjax.model.hf_families`, `hf_fields`, `hf_hybrid`), the dtype and RoPE; `ModelConfig`
validates the result, its errors naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvjax.dtypes import canonical_dtype
from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig
from kvjax.model.hf_families import bias_fields, family_fields, gemma_qwen_fields, layout_fields
from kvjax.model.hf_fields import (
    _FAMILY_DEFAULTS,
    _NOT_YET,
    GPT_OSS_ROPE,
    _Fields,
    _rope_fields,
    llama4_data,
)
from kvjax.model.hf_hybrid import HYBRID_TYPES, hybrid_data, hybrid_fields

_HF_REQUIRED = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "d_model",
    "num_attention_heads": "num_heads",
    "intermediate_size": "d_ff",
    "vocab_size": "vocab_size",
}
_HF_MODEL_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gemma3",
    "deepseek_v2",
    "deepseek_v3",
    "seed_oss",
    "granite",
    "smollm3",
    "phi3",
    "starcoder2",
    "stablelm",
    "olmo2",
    "qwen2_moe",
    "olmoe",
    "glm4",
    "ernie4_5",
    "exaone4",
    "cohere2",
    "internlm3",
    "apertus",
    "gpt_oss",
    "llama4_text",
    "llama4",
    *HYBRID_TYPES,
)
# Families whose o_proj takes `attention_bias` too (Hugging Face's modeling files); Qwen2's and
# Mistral's never have one, Seed-OSS's has its own `attention_out_bias`.
# Gemma3TextConfig's defaults (transformers 5), which the Hub's gemma-3 configs rely on: their
# text_config omits what equals these.
_GEMMA3_DEFAULTS = {
    "vocab_size": 262208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "tie_word_embeddings": True,
}


def read_hf_json(path: Path) -> dict[str, Any]:
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise KvjaxError(f"model config {str(path)!r} is not text (UTF-8 JSON expected)") from None
    except OSError as exc:
        raise KvjaxError(f"cannot read model config {str(path)!r}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KvjaxError(
            f"model config {str(path)!r} is not valid JSON (line {exc.lineno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise KvjaxError(f"model config {str(path)!r} is nested too deeply") from None
    if not isinstance(data, dict):
        raise KvjaxError(f"model config {str(path)!r} must hold a JSON object")
    return data


def from_hf_config(path: str | Path, **overrides: Any) -> ModelConfig:
    """A `ModelConfig` from a local config.json; `overrides` (the CLI's --kv-heads, ...) replace
    the file's values before validation, so a documented override of a bad value works."""
    path = Path(path)
    where = f"config {str(path)!r}"
    data, model_type = _family_data(read_hf_json(path), where)
    f = _Fields(data, where)
    fields = _shape_fields(f, data, overrides, where)
    layout_fields(f, data, fields, model_type, where)
    bias_fields(f, fields, model_type)
    family_fields(f, data, fields, model_type, where)
    _dtype_and_rope_fields(f, data, fields, model_type, where, overrides)
    folder = path if path.is_dir() else path.parent
    name = data.get("_name_or_path")
    fields["name"] = name if isinstance(name, str) and name else (folder.name or "hf-config")
    fields.update(overrides)
    try:
        return ModelConfig(**fields)
    except KvjaxError as exc:
        raise KvjaxError(f"{where}: {exc}") from None


def _family_data(data: dict, where: str) -> tuple[dict, str]:
    """The file's model type, refused by name when kvjax does not read it, and its data: a
    multimodal config's text model, the keys it omits filled from its config class's defaults."""
    model_type = _Fields(data, where).text("model_type") or "llama"
    if model_type in _NOT_YET:
        raise KvjaxError(
            f"{where}: model_type={model_type!r} is not supported yet: it needs "
            f"{_NOT_YET[model_type]}; allowed: {', '.join(_HF_MODEL_TYPES)}"
        )
    if model_type not in _HF_MODEL_TYPES:
        raise KvjaxError(
            f"{where}: model_type={model_type!r} is not supported; "
            f"allowed: {', '.join(_HF_MODEL_TYPES)}"
        )
    if model_type in ("gemma3", "gemma3_text"):  # the multimodal config's text model
        text = data.get("text_config", data) if model_type == "gemma3" else data
        if not isinstance(text, dict):
            raise KvjaxError(f"{where}: text_config must be an object")
        data = {
            **_GEMMA3_DEFAULTS,
            **{k: v for k, v in text.items() if v is not None},
            "_name_or_path": data.get("_name_or_path"),
            "torch_dtype": text.get("torch_dtype") or data.get("torch_dtype"),
        }
    if model_type in ("llama4", "llama4_text"):  # the text model over its class defaults
        data = llama4_data(data, where)
        model_type = "llama4_text"
    if model_type in _FAMILY_DEFAULTS:
        # A key the file omits takes its config class's default (a top-level rope_theta default
        # yields to one inside rope_parameters: `_rope_fields`).
        present = {k: v for k, v in data.items() if v is not None}
        data = {**_FAMILY_DEFAULTS[model_type], **present}
    if model_type in HYBRID_TYPES:  # kvjax.model.hf_hybrid: its class defaults and older keys
        data = hybrid_data(data, model_type)
    return data, model_type


def _shape_fields(f: _Fields, data: dict, overrides: dict, where: str) -> dict[str, Any]:
    """The sizes every family has: layers, widths, heads, head_dim, vocabulary."""
    missing = [
        key for key in _HF_REQUIRED if data.get(key) is None and _HF_REQUIRED[key] not in overrides
    ]
    if missing:
        needed = ", ".join(f"{k!r} (for {_HF_REQUIRED[k]})" for k in missing)
        raise KvjaxError(f"{where} is incomplete: missing {needed}")
    fields: dict[str, Any] = {}
    for old, new in _HF_REQUIRED.items():
        fields[new] = overrides[new] if new in overrides else f.integer(old)
    # Hugging Face's defaults when absent: as many KV heads as heads (MHA) and d_model / heads
    # (Llama-2 and Mistral configs omit head_dim). A value present must be valid: 0 is refused.
    fields["num_kv_heads"] = f.integer("num_key_value_heads", default=fields["num_heads"])
    fields["head_dim"] = f.integer("head_dim", default=fields["d_model"] // fields["num_heads"])
    return fields


def _dtype_and_rope_fields(
    f: _Fields, data: dict, fields: dict, model_type: str, where: str, overrides: dict
) -> None:
    """The weights' dtype, the norm epsilon, RoPE and its scaling, Gemma's and Qwen3's details
    and the hybrids' state layers, in place."""
    key = "torch_dtype" if f.text("torch_dtype") else "dtype"  # newer transformers: dtype
    if (dtype := f.text(key)) and not {"weight_dtype", "kv_dtype"} <= set(overrides):
        # canonical ('bfloat16' -> 'bf16'), refused naming the file's key
        fields["weight_dtype"] = fields["kv_dtype"] = canonical_dtype(dtype, f"{where}: {key}")
    if (value := f.number("rms_norm_eps")) is not None:
        fields["norm_eps"] = value
    if model_type == "gpt_oss" and data.get("rope_scaling") is None:
        if not isinstance(data.get("rope_parameters"), dict):  # its config class's default
            data = {**data, "rope_scaling": GPT_OSS_ROPE}
    rope = _rope_fields(f, data, model_type, where)
    if (partial := rope.pop("partial_rotary_factor", None)) is not None:
        rope["rotary_dim"] = int(fields["head_dim"] * partial)  # as the modeling files round it
    fields.update(rope)
    fields.update(gemma_qwen_fields(f, model_type))
    if model_type in HYBRID_TYPES:
        fields.update(hybrid_fields(f, data, fields, model_type, where))
