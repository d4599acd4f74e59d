"""Validation of a `ModelConfig`'s mixture of experts (Mixtral, Qwen-MoE, DeepSeek, Llama 4,
gpt-oss): the fields' types, none of them on a dense model, and an MoE model's routing, experts
and DeepSeek's expert groups. Each error one line naming the field and what is allowed."""

from __future__ import annotations

from kvjax.errors import KvjaxError
from kvjax.model.checks import Fields

EXPERT_DTYPES = ("", "mxfp4")
# topk_sigmoid (Llama 4): the top-k logits' sigmoids, each scaling the token's input to its expert
ROUTERS = ("softmax", "sigmoid", "topk_sigmoid")
_MOE_INT_FIELDS = (
    "num_experts",
    "experts_per_token",
    "num_shared_experts",
    "moe_d_ff",
    "first_dense_layers",
    "shared_expert_d_ff",
)


def check_moe(cfg: Fields) -> None:
    """Mixture of experts: its fields' types, none of them set on a dense model, and an MoE
    model's routing, experts and expert groups."""
    _check_moe_types(cfg)
    if not cfg.num_experts:
        _check_dense(cfg)
        return
    _check_routing(cfg)
    _check_experts(cfg)
    _check_expert_groups(cfg)


def _check_moe_types(cfg: Fields) -> None:
    """Counts non-negative, the scaling factor positive, a known router, groups and step >= 1."""
    for field in _MOE_INT_FIELDS:
        value = getattr(cfg, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise KvjaxError(f"{field}={value!r} must be a non-negative integer (0: dense)")
    f = cfg.routed_scaling_factor
    if isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f < float("inf"):
        raise KvjaxError(f"routed_scaling_factor={f!r} must be a positive number")
    if cfg.router not in ROUTERS:
        raise KvjaxError(f"router={cfg.router!r} is not supported; allowed: {', '.join(ROUTERS)}")
    for field in ("expert_groups", "topk_groups", "moe_layer_step"):
        value = getattr(cfg, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KvjaxError(f"{field}={value!r} must be a positive integer (1: no groups)")


def _check_dense(cfg: Fields) -> None:
    """A dense model (num_experts=0) sets no MoE field."""
    if cfg.moe_layer_step != 1:
        raise KvjaxError(
            f"moe_layer_step={cfg.moe_layer_step} is an MoE field, but num_experts=0 (dense); "
            "set num_experts > 0 or moe_layer_step=1"
        )
    for field in (
        "experts_per_token",
        "num_shared_experts",
        "moe_d_ff",
        "first_dense_layers",
        "router_bias",
        "expert_bias",
        "shared_expert_d_ff",
        "expert_weight_dtype",
    ):
        if getattr(cfg, field):
            raise KvjaxError(
                f"{field}={getattr(cfg, field)} is an MoE field, but num_experts=0 "
                f"(dense); set num_experts > 0 or {field}=0"
            )


def _check_routing(cfg: Fields) -> None:
    """k of E experts a token, expert widths, an MoE layer left, and Llama 4's router's terms."""
    E, k = cfg.num_experts, cfg.experts_per_token
    if not 1 <= k <= E:
        raise KvjaxError(f"experts_per_token={k} must be in 1 .. num_experts={E}")
    if cfg.moe_d_ff <= 0:
        raise KvjaxError(f"moe_d_ff={cfg.moe_d_ff} must be a positive integer for MoE")
    if cfg.first_dense_layers + cfg.moe_layer_step > cfg.num_layers:
        raise KvjaxError(
            f"first_dense_layers={cfg.first_dense_layers} leaves no MoE layer of num_layers="
            f"{cfg.num_layers} (moe_layer_step={cfg.moe_layer_step}); allowed: "
            f"first_dense_layers + moe_layer_step <= {cfg.num_layers}"
        )
    if cfg.router == "topk_sigmoid" and (
        cfg.norm_topk_prob or cfg.routed_scaling_factor != 1.0 or cfg.expert_groups != 1
    ):
        raise KvjaxError(
            "router='topk_sigmoid' (Llama 4) scales each expert's input by the sigmoid of its "
            "logit: it takes norm_topk_prob=False, routed_scaling_factor=1 and expert_groups=1"
        )


def _check_experts(cfg: Fields) -> None:
    """Gated experts without MLP biases, in a known dtype, and the shared experts' fields."""
    if not cfg.gated_mlp:
        raise KvjaxError("num_experts > 0 needs gated_mlp=True (every expert is gated)")
    if cfg.mlp_bias:
        raise KvjaxError("mlp_bias=True is not supported with experts (num_experts > 0)")
    if cfg.expert_weight_dtype not in EXPERT_DTYPES:
        raise KvjaxError(
            f"expert_weight_dtype={cfg.expert_weight_dtype!r} is not supported; allowed: "
            f"'' (weight_dtype), {', '.join(d for d in EXPERT_DTYPES if d)}"
        )
    if cfg.expert_weight_dtype == "mxfp4" and (cfg.d_model % 32 or cfg.moe_d_ff % 32):
        raise KvjaxError(
            f"expert_weight_dtype='mxfp4' packs blocks of 32 along each expert matrix's input: "
            f"d_model={cfg.d_model} and moe_d_ff={cfg.moe_d_ff} must be multiples of 32"
        )
    if cfg.shared_expert_d_ff and cfg.num_shared_experts != 1:
        raise KvjaxError(
            f"shared_expert_d_ff={cfg.shared_expert_d_ff} is the width of one shared expert: it "
            f"takes num_shared_experts=1, got {cfg.num_shared_experts}"
        )
    if cfg.shared_expert_gate and not cfg.num_shared_experts:
        raise KvjaxError("shared_expert_gate=True needs shared experts (num_shared_experts > 0)")


def _check_expert_groups(cfg: Fields) -> None:
    """DeepSeek's expert groups divide the experts and leave k of them to choose from."""
    E, k = cfg.num_experts, cfg.experts_per_token
    G, g = cfg.expert_groups, cfg.topk_groups
    if E % G:
        raise KvjaxError(f"expert_groups={G} must divide num_experts={E}")
    if g > G or g * (E // G) < k:
        raise KvjaxError(
            f"topk_groups={g} must be in 1 .. expert_groups={G} and leave at least "
            f"experts_per_token={k} experts ({E // G} per group)"
        )
