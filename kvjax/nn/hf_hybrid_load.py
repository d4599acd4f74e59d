"""Load a local Hugging Face Qwen3-Next, Falcon-H1 or LFM2 checkpoint: the attention, MLP and MoE
tensors as the other families (`kvjax.nn.hf_parts`), and each state mixer's own.

Falcon-H1's muP multipliers are folded into the weights they scale, which leaves the function
unchanged: the attention's input multiplier into q/k/v, key_multiplier into k, the output
multipliers into o_proj and the Mamba-2 out_proj, the MLP's gate and down multipliers into their
rows, and the Mamba-2 in_proj's per-channel `mup_vector` (ssm_multipliers over z, x, B, C, dt,
times ssm_in_multiplier) into its rows. The embedding and LM-head multipliers are config fields
(`embedding_multiplier`, `logits_scaling`). The closed form counts none of them (elementwise).
"""

from __future__ import annotations

import numpy as np
from flax import nnx

from kvjax.model.config import ModelConfig
from kvjax.model.hybrid import conv_channels
from kvjax.nn.hf_parts import (
    check_all_used,
    load_attention,
    load_mlp,
    load_moe,
    tensor_io,
)
from kvjax.nn.transformer import Transformer

_DEFAULTS = {  # FalconH1Config's multipliers when a config.json omits them
    "attention_in_multiplier": 1.0,
    "key_multiplier": 1.0,
    "attention_out_multiplier": 1.0,
    "ssm_in_multiplier": 1.0,
    "ssm_out_multiplier": 1.0,
    "mlp_multipliers": [1.0, 1.0],
    "ssm_multipliers": [1.0] * 5,
}


def _conv(get, name: str, X: int, w: int) -> np.ndarray:
    """A depthwise nn.Conv1d's weight [X, 1, w] as kvjax's [X, w]."""
    return get(name, (X, 1, w))[:, 0, :]


def _deltanet(cfg: ModelConfig, m, get, put, p: str) -> None:
    D, J, dv, w = cfg.d_model, cfg.state_heads, cfg.state_value_dim, cfg.conv_kernel
    X = conv_channels(cfg, "D")
    put(m.in_proj_qkvz, get(p + "in_proj_qkvz.weight", (X + J * dv, D)))
    put(m.in_proj_ba, get(p + "in_proj_ba.weight", (2 * J, D)))
    put(m.linear_conv, _conv(get, p + "conv1d.weight", X, w))
    put(m.dt_bias, get(p + "dt_bias", (J,)))
    put(m.A_log, get(p + "A_log", (J,)))
    put(m.linear_norm, get(p + "norm.weight", (dv,)))
    put(m.linear_out_proj, get(p + "out_proj.weight", (D, J * dv)))


def mup_vector(cfg: ModelConfig, data: dict) -> np.ndarray:
    """Falcon-H1's in_proj output scales (HF's compute_mup_vector) times ssm_in_multiplier."""
    J, P, Y, N = cfg.state_heads, cfg.state_value_dim, cfg.state_groups, cfg.state_key_dim
    inner, gs = J * P, Y * N
    sizes = (inner, inner, gs, gs, J)  # z, x, B, C, dt
    m = data.get("ssm_multipliers") or _DEFAULTS["ssm_multipliers"]
    vec = np.concatenate([np.full(n, float(v)) for n, v in zip(sizes, m, strict=True)])
    return vec * float(_mult(data, "ssm_in_multiplier"))


def _mult(data: dict, key: str):
    value = data.get(key)
    return _DEFAULTS[key] if value is None else value


def _mamba(cfg: ModelConfig, m, get, put, p: str, data: dict) -> None:
    D, J, P, w = cfg.d_model, cfg.state_heads, cfg.state_value_dim, cfg.conv_kernel
    X = conv_channels(cfg, "H")
    in_proj = get(p + "in_proj.weight", (J * P + X + J, D))
    put(m.ssm_in_proj, in_proj * mup_vector(cfg, data)[:, None])
    put(m.ssm_conv, _conv(get, p + "conv1d.weight", X, w))
    if cfg.conv_bias:
        put(m.ssm_conv_bias, get(p + "conv1d.bias", (X,)))
    put(m.ssm_dt_bias, get(p + "dt_bias", (J,)))
    put(m.ssm_A_log, get(p + "A_log", (J,)))
    put(m.ssm_D, get(p + "D", (J,)))
    if cfg.state_norm:
        put(m.ssm_norm, get(p + "norm.weight", (J * P,)))
    out = get(p + "out_proj.weight", (D, J * P)) * float(_mult(data, "ssm_out_multiplier"))
    put(m.ssm_out_proj, out)


def _falcon_attention(cfg: ModelConfig, a, get, put, p: str, data: dict) -> None:
    """Falcon-H1's attention with its multipliers folded: q, k, v read x * attention_in; k is
    times key_multiplier (its bias too); the output times attention_out."""
    scale_in = float(_mult(data, "attention_in_multiplier"))
    key = float(_mult(data, "key_multiplier"))
    out = float(_mult(data, "attention_out_multiplier"))

    def scaled(name, shape):
        x = get(name, shape)
        if name.endswith(("q_proj.weight", "v_proj.weight")):
            return x * scale_in
        if name.endswith("k_proj.weight"):
            return x * (scale_in * key)
        if name.endswith("k_proj.bias"):
            return x * key
        if ".o_proj." in name:
            return x * out
        return x

    load_attention(cfg, a, scaled, put, p)


def _falcon_mlp(cfg: ModelConfig, mlp, get, put, p: str, data: dict) -> None:
    gate_m, down_m = (float(v) for v in _mult(data, "mlp_multipliers"))

    def scaled(name, shape):
        x = get(name, shape)  # a bias scales with its rows
        if "gate_proj." in name:
            return x * gate_m
        return x * down_m if "down_proj." in name else x

    load_mlp(mlp, scaled, put, p, cfg.d_ff, cfg.d_model)


def _short_conv(cfg: ModelConfig, m, get, put, p: str) -> None:
    D, w = cfg.d_model, cfg.conv_kernel
    put(m.conv_in_proj, get(p + "in_proj.weight", (3 * D, D)))
    put(m.short_conv, _conv(get, p + "conv.weight", D, w))
    put(m.conv_out_proj, get(p + "out_proj.weight", (D, D)))
    if cfg.conv_bias:
        put(m.conv_in_bias, get(p + "in_proj.bias", (3 * D,)))
        put(m.short_conv_bias, get(p + "conv.bias", (D,)))
        put(m.conv_out_bias, get(p + "out_proj.bias", (D,)))


def from_hf_hybrid(
    cfg: ModelConfig, tensors: dict[str, np.ndarray], model_type: str, data: dict
) -> Transformer:
    """The model of a qwen3_next, falcon_h1 or lfm2 checkpoint (`data`: its config.json)."""
    D = cfg.d_model
    get, put, used = tensor_io(cfg, tensors)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    put(model.embed, get("model.embed_tokens.weight", (cfg.vocab_size, D)))
    norms = {
        "qwen3_next": ("input_layernorm", "post_attention_layernorm", "model.norm"),
        "falcon_h1": ("input_layernorm", "pre_ff_layernorm", "model.final_layernorm"),
        "lfm2": ("operator_norm", "ffn_norm", "model.embedding_norm"),
    }[model_type]
    for i, layer in enumerate(model.layers):
        p, kind = f"model.layers.{i}.", cfg.layer_kind(i)
        put(layer.attn_norm.scale, get(p + norms[0] + ".weight", (D,)))
        put(layer.mlp_norm.scale, get(p + norms[1] + ".weight", (D,)))
        if model_type == "qwen3_next":
            if kind == "D":
                _deltanet(cfg, layer.mixer, get, put, p + "linear_attn.")
            else:
                load_attention(cfg, layer.attn, get, put, p)
            if cfg.layer_is_moe(i):
                load_moe(
                    cfg, layer.mlp, get, put, p + "mlp.", ("gate_proj", "up_proj", "down_proj")
                )
            else:
                load_mlp(layer.mlp, get, put, p + "mlp.", cfg.d_ff, D)
        elif model_type == "falcon_h1":
            _mamba(cfg, layer.mixer, get, put, p + "mamba.", data)
            _falcon_attention(cfg, layer.attn, get, put, p, data)
            _falcon_mlp(cfg, layer.mlp, get, put, p + "feed_forward.", data)
        else:
            if kind == "C":
                _short_conv(cfg, layer.mixer, get, put, p + "conv.")
            else:
                names = ("q_layernorm", "k_layernorm")
                load_attention(cfg, layer.attn, get, put, p, o_name="out_proj", norm_names=names)
            load_mlp(
                layer.mlp, get, put, p + "feed_forward.", cfg.d_ff, D, names=("w1", "w3", "w2")
            )
    put(model.final_norm.scale, get(norms[2] + ".weight", (D,)))
    if not cfg.tied_embeddings:
        put(model.lm_head, get("lm_head.weight", (cfg.vocab_size, D)))
    check_all_used(tensors, used)
    return model
