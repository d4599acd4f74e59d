"""Hugging Face `config.json` import: a local file (or folder) to a `ModelConfig`. No network."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvjax.config import ModelConfig
from kvjax.errors import KvjaxError

_HF_REQUIRED = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "d_model",
    "num_attention_heads": "num_heads",
    "intermediate_size": "d_ff",
    "vocab_size": "vocab_size",
}
_HF_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_fast": "gelu",
}
_HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "gemma")


def read_hf_json(path: Path) -> dict[str, Any]:
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text()
    except OSError as exc:
        raise KvjaxError(f"cannot read model config {str(path)!r}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KvjaxError(
            f"model config {str(path)!r} is not valid JSON (line {exc.lineno}: {exc.msg})"
        ) from None
    if not isinstance(data, dict):
        raise KvjaxError(f"model config {str(path)!r} must hold a JSON object")
    return data


def from_hf_config(path: str | Path, **overrides: Any) -> ModelConfig:
    path = Path(path)
    data = read_hf_json(path)
    model_type = data.get("model_type", "llama")
    if model_type not in _HF_MODEL_TYPES:
        raise KvjaxError(
            f"config {str(path)!r}: model_type={model_type!r} is not supported; "
            f"allowed: {', '.join(_HF_MODEL_TYPES)}"
        )
    missing = [key for key in _HF_REQUIRED if key not in data]
    if missing:
        needed = ", ".join(f"{k!r} (for {_HF_REQUIRED[k]})" for k in missing)
        raise KvjaxError(f"config {str(path)!r} is incomplete: missing {needed}")
    fields: dict[str, Any] = {new: data[old] for old, new in _HF_REQUIRED.items()}
    fields["num_kv_heads"] = data.get("num_key_value_heads") or data["num_attention_heads"]
    # Hugging Face's own default when head_dim is absent (Llama-2 and Mistral configs omit it).
    if data.get("head_dim") is not None:
        fields["head_dim"] = data["head_dim"]
    else:
        if not isinstance(data["hidden_size"], int) or not isinstance(
            data["num_attention_heads"], int
        ):
            raise KvjaxError(
                f"config {str(path)!r}: hidden_size and num_attention_heads must be integers"
            )
        fields["head_dim"] = data["hidden_size"] // max(data["num_attention_heads"], 1)
    act = data.get("hidden_activation") or data.get("hidden_act") or "silu"
    if act not in _HF_ACTIVATIONS:
        raise KvjaxError(
            f"config {str(path)!r}: hidden_act={act!r} is not supported; "
            f"allowed: {', '.join(_HF_ACTIVATIONS)}"
        )
    fields["mlp_activation"] = _HF_ACTIVATIONS[act]
    fields["tied_embeddings"] = bool(data.get("tie_word_embeddings", model_type == "gemma"))
    fields["qkv_bias"] = bool(data.get("attention_bias", model_type == "qwen2"))
    if data.get("torch_dtype") or data.get("dtype"):
        fields["weight_dtype"] = data.get("torch_dtype") or data.get("dtype")
        fields["kv_dtype"] = fields["weight_dtype"]
    if "rope_theta" in data:
        fields["rope_theta"] = float(data["rope_theta"])
    if "rms_norm_eps" in data:
        fields["norm_eps"] = float(data["rms_norm_eps"])
    folder = path if path.is_dir() else path.parent
    fields["name"] = data.get("_name_or_path") or folder.name or "hf-config"
    fields.update(overrides)
    try:
        return ModelConfig(**fields)
    except KvjaxError as exc:
        raise KvjaxError(f"config {str(path)!r}: {exc}") from None
