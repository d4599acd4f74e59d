"""Closed forms of every kernel of a decoder step: FLOPs and bytes, per layer and per step.

Pure Python (no jax). Letters: `kvjax.kernels`. Byte counts are what a straightforward
implementation moves: every kernel reads its inputs and writes its output once; weights are read
once per step whatever B is; the scores (B*N*T*S, f32 for the softmax) and probabilities (compute
dtype) are real traffic. FLOPs are counted as XLA counts the model's operations (derivations next
to each kernel; the trace in `kvjax.traced` is the judge): matrix products 2*M*K*N, elementwise
steps one per element.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

from kvjax import kernels
from kvjax.analytic.costs import EXTEND, INDEX_BYTES, SCORE_BYTES, KernelCost, StepCost, Workload
from kvjax.analytic.gqa import gqa_attention_kernels
from kvjax.analytic.primitives import (  # noqa: F401 (_act_bytes, rope_cost, l2_norm_cost: re-exported)
    _act_bytes,
    _matmul,
    _residual,
    _rmsnorm,
    act_cost,
    decode_softmax,
    extend_softmax,
    l2_norm_cost,
    norm_cost,
    prefill_softmax,
    rope_cost,
    sink_logits_cost,
    softcap_cost,
    temperature_cost,
)
from kvjax.model.checks import check_extend
from kvjax.model.config import ModelConfig


def layer_kernels(
    cfg: ModelConfig,
    wl: Workload,
    sliding: bool = False,
    moe: bool = False,
    chip=None,
    rope: bool = True,
    kind: str = "A",
) -> dict[str, KernelCost]:
    """Every kernel of one decoder layer, in execution order (MLA's attention:
    `kvjax.analytic.mla`); `sliding`: a sliding-window layer of the config; `moe`: an MoE layer
    (`kvjax.analytic.moe`: router, experts, and the shared experts as the mlp/ kernels). With
    `cfg.attention_kernel == "flash"` scores, softmax and av are one fused kernel
    (`kvjax.analytic.flash`), tiled for `chip` (a `ChipSpec`; None: 128 x 128 tiles); `rope`
    False: a NoPE layer (no attn/rope kernel); `kind`: its `layer_kinds` letter (D, C: a state
    mixer instead of attention, H: the Mamba-2 heads beside it; `kvjax.analytic.hybrid`)."""
    if wl.phase == EXTEND:
        check_extend(cfg)  # the closed form covers what the model's extend step runs
    M, D, F = wl.tokens, cfg.d_model, cfg.d_ff
    w, a = cfg.weight_bytes_per_element, _act_bytes(cfg)
    if kind != "A":
        from kvjax.analytic.hybrid import combine_cost, mixer_kernels

        mixer = mixer_kernels(cfg, wl, kind)
    if kind in "DC":
        attention = mixer
    elif cfg.is_mla:
        from kvjax.analytic.mla import mla_attention_kernels

        attention = mla_attention_kernels(cfg, wl)
    else:
        attention = gqa_attention_kernels(
            cfg, wl, cfg.sliding_window if sliding else 0, sliding, rope
        )
    if cfg.attention_kernel == "flash":
        attention = _fused(cfg, wl, attention, sliding, chip)
    if kind == "H":  # Falcon-H1: both mixers read the normed x; their outputs are summed
        attention = [*mixer, *attention, combine_cost(cfg, M)]
    post_attn = [norm_cost(cfg, kernels.NORM_POST_ATTN, M, D, w, a)] if cfg.sandwich_norms else []
    pre = cfg.pre_norms  # OLMo 2 norms only the outputs
    k = [
        *([norm_cost(cfg, kernels.NORM_ATTN, M, D, w, a)] if pre else []),
        *attention,
        *post_attn,
        _residual(kernels.RESIDUAL_ATTN, M, D, a, cfg.residual_multiplier),
        # a parallel block (Cohere) feeds the MLP the same normed x: no norm of its own
        *([norm_cost(cfg, kernels.NORM_MLP, M, D, w, a)] if pre and not cfg.parallel_block else []),
    ]
    if moe:
        from kvjax.analytic.moe import moe_kernels

        F = cfg.shared_d_ff  # the shared experts: one gated MLP
        if F:
            k += mlp_kernels(cfg, M, D, F, w, a)
        k += moe_kernels(cfg, wl)
    else:
        k += mlp_kernels(cfg, M, D, F, w, a)
    if cfg.sandwich_norms:
        k.append(norm_cost(cfg, kernels.NORM_POST_MLP, M, D, w, a))
    k.append(_residual(kernels.RESIDUAL_MLP, M, D, a, cfg.residual_multiplier))
    return {c.name: c for c in k}


def _fused(cfg, wl, attention: list[KernelCost], sliding: bool, chip) -> list[KernelCost]:
    """The layer's attention kernels with scores, softmax and av replaced, where scores stood,
    by the fused kernel (and flash-decoding's combine)."""
    from kvjax.analytic import flash

    tiles = flash.plan_for_chip(cfg, wl, chip)
    fused = flash.flash_attention_cost(cfg, wl, tiles, sliding).kernels()
    out = []
    for cost in attention:
        if cost.name == kernels.SCORES:
            out += fused
        elif cost.name not in kernels.ATTENTION_PARTS:
            out.append(cost)
    return out


def mlp_kernels(cfg: ModelConfig, M: int, D: int, F: int, w: int, a: int) -> list[KernelCost]:
    """A dense MLP of width F: gate_up (or up), the activation, down."""
    bias = cfg.mlp_bias
    k = [
        _matmul(kernels.GATE_UP, M, D, 2 * F, w, a, bias=bias)
        if cfg.gated_mlp
        else _matmul(kernels.UP, M, D, F, w, a, bias=bias)
    ]
    k.append(act_cost(cfg, M, F, w, a))  # silu, gelu or xIELU (`primitives.act_cost`)
    k.append(_matmul(kernels.DOWN, M, F, D, w, a, bias=bias))
    return k


def embed_kernel(cfg: ModelConfig, wl: Workload) -> KernelCost:
    """Row gather: reads M rows of the table (not all of it) and the ids, writes M x D.

    FLOPs as jnp.take lowers it: id wrapping and bounds checks (6 per id) and the select that
    fills out-of-range rows (one per output element).
    """
    M, D = wl.tokens, cfg.d_model
    w, a = cfg.weight_bytes_per_element, _act_bytes(cfg)
    scaled = cfg.scale_embeddings or cfg.embedding_multiplier != 1.0  # Gemma's sqrt(D), Granite's
    return KernelCost(
        kernels.EMBED,
        flops=M * D + 6 * M + (M * D if scaled else 0),
        bytes=M * D * w + M * INDEX_BYTES + M * D * a,
        weight_bytes=M * D * w,
    )


def head_kernels(cfg: ModelConfig, wl: Workload) -> dict[str, KernelCost]:
    """Final norm and the LM head (f32 logits for all T positions, as prefill returns them)."""
    M, D, V = wl.tokens, cfg.d_model, cfg.vocab_size
    w, a = cfg.weight_bytes_per_element, _act_bytes(cfg)
    out = {
        kernels.NORM_FINAL: norm_cost(cfg, kernels.NORM_FINAL, M, D, w, a),
        kernels.LM_HEAD: _matmul(kernels.LM_HEAD, M, D, V, w, a, out=SCORE_BYTES),
    }
    if cfg.logits_scaling != 1.0:  # Granite: a division of every logit (f32)
        out[kernels.LOGIT_SCALE] = KernelCost(kernels.LOGIT_SCALE, M * V, 2 * M * V * SCORE_BYTES)
    if cfg.final_softcap:
        out[kernels.LOGIT_SOFTCAP] = softcap_cost(kernels.LOGIT_SOFTCAP, M * V, SCORE_BYTES)
    return out


@lru_cache(maxsize=256)
def layer_kinds(cfg: ModelConfig) -> tuple[tuple[tuple[bool, bool, bool, str], int], ...]:
    """The layers of each kind, (sliding, MoE, RoPE, layer_kinds letter) and how many, in the
    order the layers first show them."""
    return tuple(
        Counter(
            (cfg.layer_is_sliding(i), cfg.layer_is_moe(i), cfg.layer_has_rope(i), cfg.layer_kind(i))
            for i in range(cfg.num_layers)
        ).items()
    )


def step_kernels(cfg: ModelConfig, wl: Workload, chip=None) -> dict[str, KernelCost]:
    """Every kernel of the step, layer kernels summed over the L layers (global and sliding);
    `chip` tiles a fused attention (`layer_kernels`)."""
    out = {kernels.EMBED: embed_kernel(cfg, wl)}
    for (sliding, moe, rope, kind), count in layer_kinds(cfg):
        for name, cost in layer_kernels(cfg, wl, sliding, moe, chip, rope, kind).items():
            out[name] = out[name] + cost.scaled(count) if name in out else cost.scaled(count)
    out.update(head_kernels(cfg, wl))
    return out


def step_cost(cfg: ModelConfig, wl: Workload, chip=None) -> StepCost:
    return StepCost.total(step_kernels(cfg, wl, chip).values())


def attention_cost(cfg: ModelConfig, wl: Workload) -> KernelCost:
    """The attention of one layer (scores, softmax, av) as one unfused kernel."""
    ks = layer_kernels(cfg.replace(attention_kernel="xla"), wl)
    total = ks[kernels.ATTENTION_PARTS[0]]
    for name in kernels.ATTENTION_PARTS[1:]:
        total = total + ks[name]
    return KernelCost(
        kernels.ATTENTION, total.flops, total.bytes, total.transcendentals, 0.0, total.kv_bytes
    )
