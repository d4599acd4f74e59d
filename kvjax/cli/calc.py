"""`kvjax calc`: every closed-form number for a model, workload and chip (and per device over
`--tp`), built by `calc_report` from `kvjax.analytic` alone."""

from __future__ import annotations

import argparse
import math
from typing import Any

from kvjax import analytic, kernels
from kvjax.analytic import Workload, flash, moe, parallel, roofline, serving
from kvjax.analytic.costs import EXTEND
from kvjax.analytic.hybrid import state_layer_bytes
from kvjax.analytic.primitives import _act_bytes
from kvjax.analytic.quant import scale_bytes_per_token_per_layer, tensor_scale_bytes
from kvjax.analytic.variants import variant_configs, variants_table
from kvjax.cli import render
from kvjax.cli.args import (
    add_chip_args,
    add_model_args,
    add_serving_args,
    add_workload_args,
    emit,
    int_list,
    model_from_name,
    positive_int,
    resolve_chip,
    resolve_model,
    resolve_workload,
)
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig


def add_parser(sub) -> None:
    calc = sub.add_parser(
        "calc",
        help="closed-form sizes, intensities and floors for a model, workload and chip",
        description="Closed forms of the seed text for any model, num_kv_heads, workload and chip.",
    )
    add_model_args(calc)
    add_workload_args(calc, extend=True)
    add_chip_args(calc)
    add_serving_args(calc)
    calc.add_argument("--variants", action="store_true", help="add the MHA/GQA/MQA table")
    calc.add_argument("--tp", type=int_list, help="tensor-parallel degree(s), e.g. 8 or 1,2,4,8")
    calc.add_argument(
        "--pp",
        type=positive_int,
        help="pipeline stages (layers split, tp-way inside): each stage's weights, cache, step; "
        "the bytes between",
    )
    calc.add_argument(
        "--ep",
        type=positive_int,
        help="MoE: expert-parallel degree: E/ep experts a device, dispatch and combine "
        "all-to-alls (with data-parallel attention: --dp-attention = ep)",
    )
    calc.add_argument(
        "--dp-attention",
        type=positive_int,
        metavar="N",
        help="data-parallel attention: N groups, each on batch/N sequences with its own KV (or "
        "MLA latent) cache; tp-way inside a group; devices = tp x N (default: --ep, else 1)",
    )
    calc.add_argument(
        "--capacity-factor",
        type=float,
        metavar="CF",
        help="with --ep: count fixed-shape all-to-alls of ceil(CF x tokens x k / E) rows an "
        "expert (GShard; E/k never drops) instead of ragged ones (the routed rows)",
    )
    calc.add_argument(
        "--link-latency",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="per-message link latency added to the --tp link term (ring: 2(tp-1) messages per "
        "all-reduce); default 0 = bandwidth only",
    )
    calc.add_argument(
        "--predict",
        action="store_true",
        help="add predicted times [80%% interval] beside the bounds, per kernel and for the step, "
        "from the efficiency model fitted on the published measurements (kvjax validate)",
    )
    calc.add_argument("--json", action="store_true", help="print one JSON object")
    calc.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    placed = args.tp or args.ep or args.dp_attention
    if args.link_latency and not placed:
        raise KvjaxError("--link-latency applies to the link term of --tp/--ep; add one")
    if args.capacity_factor is not None and not args.ep:
        raise KvjaxError("--capacity-factor sizes the --ep all-to-alls; add --ep")
    if not math.isfinite(args.link_latency) or args.link_latency < 0:
        raise KvjaxError(f"--link-latency {args.link_latency} must be >= 0 seconds")
    cfg = resolve_model(args)
    wl = resolve_workload(args)
    chip = resolve_chip(args, cfg)
    report = calc_report(cfg, wl, chip, args.page_size)
    report["speculative"] = speculative_report(args, cfg, wl, chip)
    if args.variants:
        report["variants"] = variants_table(cfg, chip)
        # each variant's attention at this step, unfused and fused (the kernel the step counts)
        for row, (_, _, variant, _) in zip(report["variants"], variant_configs(cfg), strict=True):
            row["attention_kernel"] = (
                None if variant is None else attention_kernel_report(variant, wl, chip)
            )
    if placed:
        ep = args.ep or 1
        dp = args.dp_attention or ep
        pls = [parallel.Placement(tp, ep, dp) for tp in (args.tp or [1])]
        report.update(placement_report(cfg, wl, chip, pls, args.link_latency, args.capacity_factor))
    if args.ep:
        report["expert_parallel"] = [expert_parallel_report(cfg, args.ep, wl)]
    if args.pp:
        from kvjax.analytic.pipeline import pipeline_report

        if args.tp and len(args.tp) > 1:
            raise KvjaxError("--pp takes one --tp (the tensor-parallel size inside each stage)")
        report["pipeline"] = pipeline_report(cfg, wl, chip, args.pp, args.tp[0] if args.tp else 1)
    if args.predict:
        from kvjax.predict.apply import predict_step
        from kvjax.predict.steps import step_from_kernels

        report["predicted"] = predict_step(report["kernels"], cfg, wl, chip)
        report["predicted"]["step_from_kernels"] = step_from_kernels(cfg, wl, chip)
    return emit(args, report, render.print_calc)


def speculative_report(args, cfg: ModelConfig, wl: Workload, chip: ChipSpec):
    """--spec-tokens K --acceptance A [--draft-model NAME]: the verify step against decode."""
    given = [
        f
        for f in ("spec_tokens", "acceptance", "draft_model")
        if getattr(args, f, None) is not None
    ]
    if not given:
        return None
    if args.spec_tokens is None or args.acceptance is None:
        raise KvjaxError(
            "speculative decoding needs --spec-tokens K and --acceptance A "
            f"(given: {', '.join('--' + f.replace('_', '-') for f in given)})"
        )
    draft = None if args.draft_model is None else model_from_name(args.draft_model)
    return serving.speculative(cfg, wl, chip, args.spec_tokens, args.acceptance, draft)


def placement_report(
    cfg: ModelConfig,
    wl: Workload,
    chip: ChipSpec,
    placements: list[parallel.Placement],
    link_latency_s: float = 0.0,
    capacity_factor: float | None = None,
) -> dict[str, Any]:
    """Per device for each placement: the closed form's point (`per_device` weights, KV and
    activations; the step's collectives by kind) and one device's kernels."""
    points = []
    for pl in placements:
        p = parallel.placement_point(cfg, pl, wl, chip, link_latency_s, capacity_factor)
        point = p.to_dict()
        dev_wl = parallel.device_workload(cfg, pl, wl)
        share = analytic.step_kernels(parallel.device_config(cfg, pl.tp), dev_wl)
        point["kernels_per_device"] = [
            {"name": n, "flops": k.flops, "bytes": k.bytes} for n, k in share.items()
        ]
        points.append(point)
    first = points[0]
    return {
        **{k: first[k] for k in ("tp", "ep", "dp_attention", "devices", "per_device")},
        "collectives": first["collectives"],
        "weight_bytes_per_device": first["weight_bytes_per_device"],
        "kv_cache_bytes_per_device": first["kv_cache_bytes_per_device"],
        "collective_bytes_per_token": first["collective_bytes_per_step"],
        "tensor_parallel": points,
    }


def expert_parallel_report(cfg: ModelConfig, ep: int, wl: Workload) -> dict[str, float]:
    """Expert parallelism over `ep` devices with data-parallel attention (DeepSeek-V3's serving
    layout), per device and step under uniform routing: the weights held (all but the E - E/ep
    routed experts of each MoE layer), the experts touched, (E/ep) * (1 - (1 - k/E)^M) a MoE
    layer, the expert bytes they read, and the ragged all-to-alls' bytes sent (M/ep tokens to
    their k experts and back, (ep - 1)/ep of them off the device)."""
    pl = parallel.Placement(ep=ep, dp_attention=ep)
    dev = parallel.device_workload(cfg, pl, wl)
    touched = dev.experts_touched
    held = parallel.placed_weight_bytes(cfg, pl)
    colls = parallel.placed_collectives(cfg, pl, wl)
    return {
        "ep": ep,
        "experts_per_device": cfg.num_experts // ep,
        "weight_bytes_per_device": held,
        "experts_touched_per_device_per_layer": touched,
        "expert_bytes_read_per_device": cfg.num_moe_layers
        * touched
        * moe.expert_matrix_bytes(cfg, moe.expert_params(cfg)),
        "all_to_all_bytes_per_device": colls["all-to-all"]["bytes_per_device"],
    }


def moe_report(cfg: ModelConfig, decode: Workload) -> dict[str, Any] | None:
    """An MoE model's experts: per MoE layer, the experts a decode step's B tokens touch
    (expected under uniform routing, with the best and worst cases) and the weights it reads."""
    if not cfg.is_moe:
        return None
    E, k, M = cfg.num_experts, cfg.experts_per_token, decode.tokens
    best, worst = moe.experts_touched_bounds(E, k, M)
    step = analytic.step_kernels(cfg, decode)
    return {
        "num_experts": E,
        "experts_per_token": k,
        "num_shared_experts": cfg.num_shared_experts,
        "moe_layers": cfg.num_moe_layers,
        "experts_touched_per_layer": moe.expected_experts_touched(E, k, M),
        "experts_touched_best": best,
        "experts_touched_worst": worst,
        "decode_weight_bytes_read": sum(c.weight_bytes for c in step.values()),
    }


def calc_report(
    cfg: ModelConfig, wl: Workload, chip: ChipSpec, page_size: int = 0
) -> dict[str, Any]:
    """Every closed-form number of `kvjax calc --json`, keyed as documented in the README; the
    cache and capacity on pages of `page_size` when given."""
    dtype = cfg.peak_dtype
    peak, bw = chip.peak(dtype), chip.bandwidth_bytes_per_s
    decode = analytic.step_cost(cfg, Workload("decode", wl.batch, wl.context), chip)
    step = analytic.step_cost(cfg, wl, chip)
    weights = analytic.weight_bytes(cfg)
    kv_cache = analytic.kv_cache_bytes(cfg, wl.context, wl.batch, page_size)
    unpaged = analytic.kv_cache_bytes(cfg, wl.context, wl.batch)
    states = analytic.state_bytes(cfg, wl.batch)  # a hybrid's state layers: flat in S
    placed = roofline.place(analytic.step_kernels(cfg, wl, chip).values(), peak, bw)
    on_roof = roofline.point(kernels.STEP_KERNEL, step.flops, step.bytes, peak, bw)
    step_floor = on_roof.bound_s
    decode_wl = Workload("decode", wl.batch, wl.context)
    # an MoE model's floor: the weights a decode step of B tokens reads (the active weights at
    # B = 1, the expected experts touched above it); a dense model's: all of them (the seed's)
    floor_weights = (
        sum(k.weight_bytes for k in analytic.step_kernels(cfg, decode_wl).values())
        if cfg.is_moe
        else weights
    )
    report: dict[str, Any] = {
        "model": cfg.to_dict(),
        "workload": {
            "phase": wl.phase,
            "batch": wl.batch,
            "context": wl.context,
            "new_tokens": wl.new_tokens,
        },
        "chip": {
            "name": chip.name,
            "compute_dtype": dtype,
            "peak_flops_per_s": peak,
            "bandwidth_bytes_per_s": bw,
            "memory_bytes": chip.memory_bytes,
            "source": chip.source,
        },
        "attention_variant": cfg.attention_variant,
        "params": analytic.num_params(cfg),
        "active_params": moe.active_params(cfg),
        "param_counts": analytic.param_counts(cfg),
        "moe": moe_report(cfg, decode_wl),
        "weight_bytes": weights,
        "kv_bytes_per_token_per_layer": analytic.kv_bytes_per_token_per_layer(cfg),
        "kv_bytes_per_token": analytic.kv_bytes_per_token(cfg),
        "kv_cache_bytes": kv_cache,
        "state_bytes": states,  # recurrent states and conv caches of B sequences (issue 31)
        "state": state_report(cfg),
        "cache_bytes": kv_cache + states,
        "kv_positions_held": analytic.kv_positions_held(cfg, wl.context, page_size),
        "page_size": page_size,
        "kv_page_waste_bytes": kv_cache - unpaged,
        "kv_scales": cfg.kv_scale_kind,
        "kv_scale_bytes_per_token_per_layer": scale_bytes_per_token_per_layer(cfg),
        "kv_tensor_scale_bytes": tensor_scale_bytes(cfg),
        "decode_flops": decode.flops,
        "decode_bytes": decode.bytes,
        "decode_intensity": decode.intensity,
        "attention_intensity": analytic.attention_intensity(cfg),
        "attention_kernel_intensity": analytic.attention_cost(
            cfg, Workload("decode", wl.batch, wl.context)
        ).intensity,
        "ridge_flops_per_byte": roofline.ridge(peak, bw),
        "step_flops": step.flops,
        "step_bytes": step.bytes,
        "step_intensity": step.intensity,
        "attainable_flops_per_s": on_roof.attainable_flops_per_s,
        "fraction_of_peak": on_roof.attainable_flops_per_s / peak,
        "weight_floor_s_per_token": roofline.memory_floor_s(floor_weights, bw),
        # the states are read and written back every step
        "weights_kv_floor_s_per_token": roofline.memory_floor_s(
            floor_weights + kv_cache + 2 * states, bw
        ),
        "step_floor_s": step_floor,
        "kernel_sum_bound_s": sum(k.bound_s for k in placed),
        # the serving frontier's point at this batch (`kvjax frontier`): the kernels one after
        # another, and the largest batch whose weights + KV + activations fit
        "serving_tokens_per_s": (
            wl.batch / sum(k.bound_s for k in placed) if wl.phase == "decode" else None
        ),
        "max_serving_batch": (
            None
            if chip.memory_bytes is None
            else serving.max_serving_batch(cfg, chip, wl.context, page_size)
        ),
        "tokens_per_s_per_sequence": (1.0 / step_floor) if wl.phase == "decode" else None,
        "tokens_per_s": (wl.batch / step_floor) if wl.phase == "decode" else None,
        # the whole cache (KV + states) of B sequences passes the weights from this S (both keys)
        "kv_exceeds_weights_at_context": analytic.kv_exceeds_weights_at_context(cfg, wl.batch),
        "cache_exceeds_weights_at_context": analytic.kv_exceeds_weights_at_context(cfg, wl.batch),
        "fits_in_memory": (
            None if chip.memory_bytes is None else weights + kv_cache + states <= chip.memory_bytes
        ),
        "max_batch_at_context": (
            None
            if chip.memory_bytes is None
            else analytic.max_batch_that_fits(cfg, chip.memory_bytes, wl.context, page_size)
        ),
        "max_context_at_batch": (
            None
            if chip.memory_bytes is None
            else analytic.max_context_that_fits(cfg, chip.memory_bytes, wl.batch, page_size)
        ),
        "kernels": [p.to_dict() for p in placed],
        # the fused-kernel report (tiles, pairs) is written for prefill and decode
        "attention_kernel": None if wl.phase == EXTEND else attention_kernel_report(cfg, wl, chip),
    }
    return report


def state_report(cfg: ModelConfig) -> dict[str, Any] | None:
    """A hybrid's state layers (`kvjax.analytic.hybrid`), one sequence: per kind of layer its
    count and the recurrent state's and conv cache's bytes; None for a transformer."""
    if not cfg.is_hybrid:
        return None
    kinds = [cfg.layer_kind(i) for i in range(cfg.num_layers)]
    return {
        "state_dtype": cfg.state_dtype,
        "bytes_per_sequence": analytic.state_bytes(cfg),
        "layers": {
            kind: {"count": kinds.count(kind), **state_layer_bytes(cfg, kind)}
            for kind in sorted(set(kinds) - {"A"})
        },
    }


def attention_kernel_report(cfg: ModelConfig, wl: Workload, chip: ChipSpec) -> dict[str, Any]:
    """The attention of the step both ways, summed over the layers: XLA's unfused scores,
    softmax and av, and the fused kernel (`kvjax.analytic.flash`) tiled for `chip`, with the
    pairs each computes; `kernel` is the one the step above counts."""
    peak, bw = chip.peak(cfg.peak_dtype), chip.bandwidth_bytes_per_s
    unfused = analytic.step_kernels(cfg.replace(attention_kernel="xla"), wl)
    fused_cfg = cfg.replace(attention_kernel="flash")
    fused = analytic.step_kernels(fused_cfg, wl, chip)
    parts = [unfused[n] for n in kernels.ATTENTION_PARTS]
    fused_parts = [fused[n] for n in (kernels.ATTENTION, kernels.ATTN_COMBINE) if n in fused]
    tiles = flash.plan_for_chip(fused_cfg, wl, chip)
    exact = computed = 0
    for layer in filter(cfg.layer_has_attention, range(cfg.num_layers)):  # not state layers
        cost = flash.flash_attention_cost(fused_cfg, wl, tiles, cfg.layer_is_sliding(layer))
        exact += cost.exact_pairs
        computed += cost.computed_pairs
    shape = flash.attention_shape(cfg, wl.phase)
    per_pair = shape.query_heads * (2 * shape.key_width + 2 * shape.value_width)

    def side(costs) -> dict[str, Any]:
        f, b = sum(c.flops for c in costs), sum(c.bytes for c in costs)
        point = roofline.point(kernels.ATTENTION, f, b, peak, bw)
        return {
            "flops": f,
            "bytes": b,
            "intensity": f / b,
            "bound": point.bound,
            "bound_s": point.bound_s,
        }

    return {
        "kernel": cfg.attention_kernel,
        "xla": side(parts),
        "flash": side(fused_parts),
        "block_q": tiles.block_q,
        "block_k": tiles.block_k,
        "splits": tiles.splits,
        "kv_on_chip": tiles.kv_on_chip,
        "onchip_bytes_per_core": chip.onchip_bytes_per_core,
        "exact_pairs": exact,
        "computed_pairs": computed,
        "exact_causal_flops": exact * per_pair,
        "flash_over_exact_flops": computed / exact,
        "qkvo_bytes": _qkvo_bytes(cfg, wl),
    }


def _qkvo_bytes(cfg: ModelConfig, wl: Workload) -> float:
    """Q, K, V and O of every layer read or written once: the least a fused kernel moves."""
    shape = flash.attention_shape(cfg, wl.phase)
    T, a = wl.query_len, _act_bytes(cfg)
    q_o = wl.batch * T * shape.query_heads * (shape.key_width + shape.value_width) * a
    span = cfg.sliding_window + cfg.sink_tokens  # a sliding layer's window and sinks
    held = sum(
        min(wl.context, span) if cfg.layer_is_sliding(i) and cfg.sliding_window else wl.context
        for i in filter(cfg.layer_has_attention, range(cfg.num_layers))
    )
    per_position = (
        shape.kv_bytes_per_position
        if wl.phase == "decode"
        else ((shape.key_width + shape.value_width) * a)
    )
    return q_o * cfg.num_attention_layers + wl.batch * shape.kv_heads * held * per_position
