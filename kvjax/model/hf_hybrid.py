"""config.json import of the hybrid families: Qwen3-Next (Gated DeltaNet layers and gated full
attention, MoE), Falcon-H1 (Mamba-2 heads beside attention in every layer) and LFM2 (short gated
convolutions and a few GQA layers). Their config classes' defaults (transformers 5.24) fill what
a file omits. The checkpoint loader: `kvjax.nn.hf_hybrid_load`."""

from __future__ import annotations

from typing import Any

from kvjax.errors import KvjaxError
from kvjax.model.hf_fields import _Fields, _period, shared_expert_fields

HYBRID_TYPES = ("qwen3_next", "falcon_h1", "lfm2")

HYBRID_DEFAULTS = {
    "qwen3_next": {  # Qwen3NextConfig (Qwen3-Next-80B-A3B's shapes)
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "rms_norm_eps": 1e-6,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts_per_tok": 10,
        "num_experts": 512,
        "norm_topk_prob": True,
        "partial_rotary_factor": 0.25,
        "full_attention_interval": 4,
    },
    "falcon_h1": {  # FalconH1Config
        "vocab_size": 128000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "mamba_d_ssm": 1024,
        "mamba_n_heads": 128,
        "mamba_n_groups": 1,
        "mamba_d_state": 256,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 256,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "mamba_rms_norm": False,
        "mamba_norm_before_gate": True,
        "time_step_limit": [0.0, float("inf")],
        "projectors_bias": False,
    },
    "lfm2": {  # Lfm2Config (its rope default_theta 1e6)
        "vocab_size": 65536,
        "hidden_size": 2560,
        "intermediate_size": 12288,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_multiple_of": 256,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": True,
        "rope_theta": 1_000_000.0,
    },
}
_KINDS = {"linear_attention": "D", "full_attention": "A", "conv": "C"}


def hybrid_data(data: dict, model_type: str) -> dict:
    """The file over its class's defaults; LFM2's older keys (block_ff_dim, tie_embedding)."""
    present = {k: v for k, v in data.items() if v is not None}
    out = {**HYBRID_DEFAULTS[model_type], **present}
    if model_type == "lfm2":
        if "block_ff_dim" in present:
            out["intermediate_size"] = present["block_ff_dim"]
        if "tie_embedding" in present:
            out["tie_word_embeddings"] = present["tie_embedding"]
    return out


def _kinds(f: _Fields, data: dict, layers: int, default: list[str], where: str, mixer: str) -> str:
    """`layer_types` (one per layer: `mixer` or full_attention) as layer_kinds letters: its
    period where that divides the layers ('DDDA'), else one letter a layer (LFM2's 16). Absent,
    `default` (what the family's other fields say)."""
    types = data.get("layer_types") or default
    allowed = [mixer, "full_attention"]
    if not isinstance(types, list) or len(types) != layers or set(types) - set(allowed):
        raise KvjaxError(
            f"{where}: layer_types must list {layers} entries of {', '.join(allowed)}, "
            f"got {str(types)[:80]}"
        )
    kinds = "".join(_KINDS[t] for t in types)
    period = _period(kinds)
    return period if layers % len(period) == 0 else kinds


def _qwen3_next(f: _Fields, data: dict, fields: dict, where: str) -> dict:
    layers = fields["num_layers"]
    every = f.integer("full_attention_interval", 4)
    default = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
    out: dict[str, Any] = {
        "layer_kinds": _kinds(f, data, layers, default, where, "linear_attention"),
        "state_heads": f.integer("linear_num_value_heads"),
        "state_groups": f.integer("linear_num_key_heads"),
        "state_key_dim": f.integer("linear_key_head_dim"),
        "state_value_dim": f.integer("linear_value_head_dim"),
        "conv_kernel": f.integer("linear_conv_kernel_dim"),
        "scan_chunk": 64,  # torch_chunk_gated_delta_rule's chunk_size (not in the config)
        "attn_output_gate": True,
        "qk_norm": True,
        "norm_plus_one": True,
        "o_bias": fields["qkv_bias"],
    }
    experts = data.get("num_experts") or 0
    if experts:
        if data.get("mlp_only_layers"):
            raise KvjaxError(
                f"{where}: mlp_only_layers={data['mlp_only_layers']!r}: only [] (MoE every "
                "decoder_sparse_step-th layer) is modelled"
            )
        width = f.integer("moe_intermediate_size")
        shared = data.get("shared_expert_intermediate_size") or 0
        out.update(
            num_experts=f.integer("num_experts"),
            moe_d_ff=width,
            experts_per_token=f.integer("num_experts_per_tok"),
            moe_layer_step=f.integer("decoder_sparse_step", 1),
            norm_topk_prob=f.boolean("norm_topk_prob", True),
            **shared_expert_fields(shared, width),
        )
    return out


def _falcon_h1(f: _Fields, data: dict, fields: dict, where: str) -> dict:
    for key in ("mamba_proj_bias", "projectors_bias"):
        if f.boolean(key, False):
            raise KvjaxError(f"{where}: {key}=true (Falcon-H1) is not modelled by kvjax")
    limit = data.get("time_step_limit")
    # transformers writes inf as {"__float__": "Infinity"}
    bounds = [float(x["__float__"]) if isinstance(x, dict) else x for x in limit or []]
    if bounds != [0.0, float("inf")]:
        raise KvjaxError(
            f"{where}: time_step_limit={limit!r}: only (0.0, inf) (FalconH1Config's default: dt "
            "unclamped above) is modelled by kvjax"
        )
    heads = f.integer("mamba_n_heads")
    inner = f.integer("mamba_d_ssm") or f.integer("mamba_expand") * fields["d_model"]
    head = data.get("mamba_d_head", "auto")
    head = inner // heads if head == "auto" else f.integer("mamba_d_head")
    if head * heads != inner:
        raise KvjaxError(
            f"{where}: mamba_d_head={head} x mamba_n_heads={heads} must equal mamba_d_ssm={inner}"
        )
    out: dict[str, Any] = {
        "layer_kinds": "H",
        "state_heads": heads,
        "state_groups": f.integer("mamba_n_groups"),
        "state_key_dim": f.integer("mamba_d_state"),
        "state_value_dim": head,
        "conv_kernel": f.integer("mamba_d_conv"),
        "conv_bias": f.boolean("mamba_conv_bias", True),
        "state_norm": f.boolean("mamba_rms_norm", False),
        "state_norm_before_gate": f.boolean("mamba_rms_norm", False)
        and f.boolean("mamba_norm_before_gate", True),
        "scan_chunk": f.integer("mamba_chunk_size"),
        "o_bias": fields["qkv_bias"],
        "mlp_bias": f.boolean("mlp_bias", False),
    }
    # muP: embeddings x e, logits x m (kvjax's logits_scaling divides); its other multipliers
    # (key, attention and SSM in/out, the in_proj's mup_vector, the MLP's) are elementwise
    if (e := f.number("embedding_multiplier")) is not None:
        out["embedding_multiplier"] = e
    if (m := f.number("lm_head_multiplier")) is not None:
        out["logits_scaling"] = 1.0 / m
    return out


def _lfm2(f: _Fields, data: dict, fields: dict, where: str) -> dict:
    layers = fields["num_layers"]
    attention = data.get("full_attn_idxs")
    if attention is None:  # transformers 5 writes layer_types (and full_attn_idxs: null)
        types = data.get("layer_types")
        attention = (
            [i for i, t in enumerate(types) if t == "full_attention"]
            if isinstance(types, list)
            else list(range(layers))  # Lfm2Config without either: every layer attention
        )
    if not isinstance(attention, list) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers for i in attention
    ):
        raise KvjaxError(f"{where}: full_attn_idxs must list layer indices below {layers}")
    default = ["full_attention" if i in attention else "conv" for i in range(layers)]
    width = fields["d_ff"]
    if f.boolean("block_auto_adjust_ff_dim", True):  # Lfm2MLP's rule
        width = int(2 * width / 3)
        multiplier = data.get("block_ffn_dim_multiplier")
        if multiplier is not None:
            width = int(f.number("block_ffn_dim_multiplier") * width)
            step = f.integer("block_multiple_of")
            width = step * ((width + step - 1) // step)
    out: dict[str, Any] = {
        "layer_kinds": _kinds(f, data, layers, default, where, "conv"),
        "conv_kernel": f.integer("conv_L_cache"),
        "conv_bias": f.boolean("conv_bias", False),
        "d_ff": width,
        "qk_norm": True,
        "head_dim": fields["d_model"] // fields["num_heads"],  # Lfm2Attention's rule
    }
    if (eps := f.number("norm_eps")) is not None:
        out["norm_eps"] = eps
    if "C" not in out["layer_kinds"]:
        out.pop("conv_kernel"), out.pop("conv_bias")
    return out


def hybrid_fields(f: _Fields, data: dict, fields: dict, model_type: str, where: str) -> dict:
    """The family's own fields over what the Llama-like reading gave (`kvjax.model.hf`)."""
    read = {"qwen3_next": _qwen3_next, "falcon_h1": _falcon_h1, "lfm2": _lfm2}[model_type]
    return read(f, data, fields, where)
