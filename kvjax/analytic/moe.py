"""Mixture-of-experts MLPs in closed form: total and active parameters, the experts a step reads,
and every MoE kernel's FLOPs and bytes. Pure Python; letters: `kvjax.kernels` (E experts, k per
token, F_e = moe_d_ff each).

A decode step's MLP weights are what the batch's M = B*T tokens route to. Under uniform routing
(each token picks k distinct experts of E at random) one expert escapes a token with probability
(1 - k/E), so the expected number of distinct experts touched per MoE layer is

    E * (1 - (1 - k/E)^M),

between k (every token to the same k experts: the best case) and min(E, M*k) (every pick distinct:
the worst). At B = 1 decode it is k: the seed's weights floor becomes the active weights. A
grouped-GEMM kernel reads each touched expert once; kvjax's model gathers each token's k experts
(`kvjax.nn.moe`: M*k expert reads, the worst case whenever two tokens share an expert), so its
trace is compared with the closed form at `Workload.experts_touched = M*k`.
"""

from __future__ import annotations

import dataclasses

from kvjax import kernels
from kvjax.analytic.costs import SCORE_BYTES, KernelCost, Workload
from kvjax.analytic.params import (  # noqa: F401 (re-exported for callers of analytic.moe)
    BIAS_BYTES,
    bias_extra_bytes,
    expert_matrix_bytes,
    expert_params,
    moe_layer_param_counts,
    num_params,
    weight_bytes,
)
from kvjax.analytic.primitives import act_flops
from kvjax.model.config import DTYPE_BYTES, ModelConfig


def expected_experts_touched(num_experts: int, per_token: int, tokens: int) -> float:
    """E * (1 - (1 - k/E)^M): distinct experts M tokens touch under uniform top-k routing."""
    E, k = num_experts, per_token
    return E * (1.0 - (1.0 - k / E) ** tokens)


def experts_touched_bounds(num_experts: int, per_token: int, tokens: int) -> tuple[int, int]:
    """(best, worst): every token to the same k experts; every pick a different expert."""
    return per_token, min(num_experts, per_token * tokens)


def experts_touched(cfg: ModelConfig, wl: Workload) -> float:
    """Experts read per MoE layer by the step: the workload's own count (`experts_touched`, e.g.
    the model's M*k gathers), else the uniform-routing expectation."""
    if wl.experts_touched is not None:
        return wl.experts_touched
    return expected_experts_touched(cfg.num_experts, cfg.experts_per_token, wl.tokens)


def model_workload(cfg: ModelConfig, wl: Workload) -> Workload:
    """The workload as kvjax's own model runs it: an MoE model gathers every token's k experts
    (M*k expert reads, `kvjax.nn.moe`), the count its trace and its clock are compared at."""
    if not cfg.is_moe:
        return wl
    return dataclasses.replace(wl, experts_touched=wl.tokens * cfg.experts_per_token)


def active_params(cfg: ModelConfig) -> int:
    """Parameters one token uses: everything but the routed experts it does not pick (k of E
    per MoE layer). Embedding and LM head included (the convention of the DeepSeek-V3 report's
    "37B activated"); a dense model's active parameters are all of them."""
    total = num_params(cfg)
    if not cfg.is_moe:
        return total
    unused = (cfg.num_experts - cfg.experts_per_token) * expert_params(cfg)
    return total - cfg.num_moe_layers * unused


def moe_kernels(cfg: ModelConfig, wl: Workload) -> list[KernelCost]:
    """The MoE MLP of one layer, after its norm, in execution order (the shared experts are the
    dense MLP kernels, `kvjax.analytic.step`, added by the caller).

    router: f32 logits x @ W_r (E x D): 2*M*D*E. topk: the scores (softmax: max, subtract, exp,
    sum, divide, 4E + 1 exp a token; sigmoid: 3E + E exps... derived per router below) and the
    choice; gate_up / down: the touched experts' weights read once, M*k rows of products;
    combine: the k outputs weighted and summed (2*M*k*D - M*D... as counted below).
    """
    M = wl.tokens
    gate = [_shared_gate(cfg, M)] if cfg.shared_expert_gate else []
    experts = _experts(cfg, M, experts_touched(cfg, wl))
    return [*_routing(cfg, M), *experts, *gate, _combine(cfg, M)]


def _routing(cfg: ModelConfig, M: int) -> list[KernelCost]:
    """The router's f32 logits (gpt-oss's bias added) and the top-k choice with its weights."""
    D, E, k = cfg.d_model, cfg.num_experts, cfg.experts_per_token
    w, a = cfg.weight_bytes_per_element, DTYPE_BYTES[cfg.compute_dtype]
    # the router runs in f32 (as DeepSeek's): a 2-byte model widens x and W_r first (each read
    # in its dtype and written in f32), then the product reads both in f32
    router_w = E * D * w
    widen = (M * D + E * D) if a != 4 else 0
    router = KernelCost(
        kernels.MOE_ROUTER,
        flops=2 * M * D * E + widen,
        bytes=router_w + M * D * a + widen * 4 + (widen * 4 if widen else 0) + M * E * SCORE_BYTES,
        weight_bytes=router_w,
    )
    if cfg.router_bias:  # gpt-oss: + b (E, widened to f32 unless stored so) on the f32 logits.
        # Bytes as lowered: the widening (E w in, 4E out), three E-wide f32 copies of jnp's
        # broadcasting (a reshape, a broadcast, a reshape: 24E), the broadcast to [M, E]
        # (4E + 4ME) and the add (12ME)
        widen_b = E * w + 4 * E if w != 4 else 0
        router = router + KernelCost(
            kernels.MOE_ROUTER,
            flops=M * E + (E if w != 4 else 0),
            bytes=widen_b + 28 * E + 16 * M * E,
            weight_bytes=E * w,
        )
    bias = E * BIAS_BYTES if cfg.router == "sigmoid" else 0  # DeepSeek-V3's correction bias
    scaled_in = cfg.router == "topk_sigmoid"  # Llama 4: sigmoids of the k picks only
    topk = KernelCost(
        kernels.MOE_TOPK,
        flops=route_flops(cfg, M),
        bytes=M * E * SCORE_BYTES + M * k * (SCORE_BYTES + 4) + bias,
        transcendentals=M * k if scaled_in else M * E,
        weight_bytes=bias,
    )
    return [router, topk]


def _experts(cfg: ModelConfig, M: int, touched: float) -> list[KernelCost]:
    """The k picked experts' gate_up, activation and down over the M*k routed rows, the touched
    experts' weights read once (gpt-oss's expert biases added)."""
    D, k, F = cfg.d_model, cfg.experts_per_token, cfg.moe_d_ff
    w, a = cfg.weight_bytes_per_element, DTYPE_BYTES[cfg.compute_dtype]
    scaled_in = cfg.router == "topk_sigmoid"
    gate_up_w = expert_matrix_bytes(cfg, touched * 2 * F * D)
    # Llama 4: each pick's input x times its weight first (M*k*D, the weights narrowed: M*k)
    scale_in = (M * k * D + (M * k if a != 4 else 0)) if scaled_in else 0
    gate_up = KernelCost(
        kernels.MOE_GATE_UP,
        flops=2 * M * k * D * 2 * F + gather_flops(M * k) + scale_in,
        bytes=gate_up_w + M * D * a + M * k * 2 * F * a + (2 * M * k * D * a if scaled_in else 0),
        weight_bytes=gate_up_w,
    )
    act = KernelCost(
        kernels.MOE_ACT,
        flops=act_flops(cfg, M * k * F, a),
        bytes=3 * M * k * F * a,
        transcendentals=M * k * F,
    )
    down_w = expert_matrix_bytes(cfg, touched * F * D)
    down = KernelCost(
        kernels.MOE_DOWN,
        flops=2 * M * k * F * D + gather_flops(M * k),
        bytes=down_w + M * k * F * a + M * k * D * a,
        weight_bytes=down_w,
    )
    if cfg.expert_bias:  # gpt-oss: each pick's bias rows gathered and added (2F, then D)
        gate_up = gate_up + expert_bias_cost(kernels.MOE_GATE_UP, M * k, 2 * F, touched, w, a)
        down = down + expert_bias_cost(kernels.MOE_DOWN, M * k, D, touched, w, a)
    return [gate_up, act, down]


def _shared_gate(cfg: ModelConfig, M: int) -> KernelCost:
    """Qwen2-MoE: g = sigmoid(x @ w_g) (2MD, then 1 / (1 + exp(-y)): 3M and M exps), and the
    shared output times g broadcast over D (MD). Bytes as lowered: the product's w_g, x and g;
    the sigmoid's steps on M values (14 M a); g broadcast to [M, D] and the multiply (4 M D a)."""
    D, w, a = cfg.d_model, cfg.weight_bytes_per_element, DTYPE_BYTES[cfg.compute_dtype]
    gate_w = D * w
    return KernelCost(
        kernels.MOE_SHARED_GATE,
        flops=2 * M * D + 3 * M + M * D,
        bytes=gate_w + 5 * M * D * a + 16 * M * a,
        transcendentals=M,
        weight_bytes=gate_w,
    )


def _combine(cfg: ModelConfig, M: int) -> KernelCost:
    """The k outputs weighted and summed (Llama 4's already weighted: summed, k - 1 adds), the
    shared experts' output added where there are any."""
    D, k, a = cfg.d_model, cfg.experts_per_token, DTYPE_BYTES[cfg.compute_dtype]
    scaled_in = cfg.router == "topk_sigmoid"
    shared = cfg.num_shared_experts > 0  # their output added here
    weigh = (M * (k - 1) * D) if scaled_in else 2 * M * k * D + (M * k if a != 4 else 0)
    return KernelCost(
        kernels.MOE_COMBINE,
        flops=weigh + (M * D if shared else 0),
        # the k outputs (and weights) read, the sum written; one Llama 4 pick is a slice
        bytes=(M * k * D * a if k > 1 else 0) + M * D * a + (2 * M * D * a if shared else 0)
        if scaled_in
        else M * k * D * a + M * k * a + M * D * a + (2 * M * D * a if shared else 0),
    )


def expert_bias_cost(name: str, picks: int, width: int, touched: float, w: int, a: int):
    """The picked experts' bias rows (`width` each) gathered and added to the products: the
    gather's index arithmetic and the add; the touched experts' rows read."""
    bias_w = touched * width * w
    return KernelCost(
        name,
        flops=picks * width + gather_flops(picks),
        bytes=bias_w + 3 * picks * width * a,
        weight_bytes=bias_w,
    )


def gather_flops(picks: int) -> int:
    """Index arithmetic of gathering `picks` experts' matrices, as jnp indexing lowers it: 3 a
    pick (wrapping a negative id and the bounds clamp)."""
    return 3 * picks


def route_flops(cfg: ModelConfig, M: int) -> int:
    """The router's scores and choice for M tokens, as XLA counts the model's operations.

    softmax over E: max (E - 1), subtract, sum (E - 1), divide: 4E - 1 a token (the exp is a
    transcendental); sigmoid: 3E (XLA's logistic) and the bias add (E); top_k: 0; the weights
    of the picks by take_along_axis: 7 a pick; renormalising: the sum (k - 1) and the divide (k),
    DeepSeek-V3's + 1e-20 (1); the routed scaling factor: k. Group-limited choice (G groups of
    E/G, the best g kept): `group_flops`.
    """
    E, k = cfg.num_experts, cfg.experts_per_token
    if cfg.router == "topk_sigmoid":  # Llama 4: top_k of the logits (0), sigmoid of k (3k)
        return M * 3 * k
    sigmoid = cfg.router == "sigmoid"
    per_token = (4 * E if sigmoid else 4 * E - 1) + 7 * k
    if cfg.norm_topk_prob:
        per_token += 2 * k - 1 + (1 if sigmoid else 0)
    if cfg.routed_scaling_factor != 1.0:
        per_token += k
    return M * per_token + (group_flops(cfg, M) if cfg.expert_groups > 1 else 0)


def group_flops(cfg: ModelConfig, M: int) -> int:
    """Group-limited routing, G groups of E/G and the best g kept, per token: the group scores
    (DeepSeek-V2's max within each group, E - G; V3's sum of each group's two best, G), the mask
    of the kept groups (a scatter: 3g + 3) and the masked choice (a select: E). Fitted to XLA's
    counts over E, G, g (tests/test_moe.py re-derives them)."""
    E, G, g = cfg.num_experts, cfg.expert_groups, cfg.topk_groups
    scores = G if cfg.router == "sigmoid" else E - G
    return M * (scores + 3 * g + 3 + E)
