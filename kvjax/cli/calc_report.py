"""The reports of `kvjax calc`, built from `kvjax.analytic` alone: every closed-form number for a
model, workload and chip (`calc_report`), per device for a placement over tp, ep and
data-parallel attention (`placement_report`, `expert_parallel_report`), and the attention both
ways, unfused and fused (`attention_kernel_report`)."""

from __future__ import annotations

from typing import Any

from kvjax import analytic, kernels
from kvjax.analytic import Workload, flash, moe, parallel, placement_point, roofline, serving
from kvjax.analytic.costs import EXTEND
from kvjax.analytic.hybrid import state_layer_bytes
from kvjax.analytic.primitives import _act_bytes
from kvjax.analytic.quant import scale_bytes_per_token_per_layer, tensor_scale_bytes
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig


def calc_report(
    cfg: ModelConfig, wl: Workload, chip: ChipSpec, page_size: int = 0
) -> dict[str, Any]:
    """Every closed-form number of `kvjax calc --json`, keyed as documented in the README; the
    cache and capacity on pages of `page_size` when given."""
    peak, bw = chip.peak(cfg.peak_dtype), chip.bandwidth_bytes_per_s
    placed = roofline.place(analytic.step_kernels(cfg, wl, chip).values(), peak, bw)
    return {
        **_model_and_chip(cfg, wl, chip),
        **_cache(cfg, wl, page_size),
        **_intensities(cfg, wl, chip),
        **_floors(cfg, wl, chip, placed, page_size),
        **_capacity(cfg, wl, chip, page_size),
        "kernels": [p.to_dict() for p in placed],
        # the fused-kernel report (tiles, pairs) is written for prefill and decode
        "attention_kernel": None if wl.phase == EXTEND else attention_kernel_report(cfg, wl, chip),
    }


def workload_report(wl: Workload) -> dict[str, Any]:
    """The workload as every report writes it: phase, B, S and an extend step's T."""
    return {
        "phase": wl.phase,
        "batch": wl.batch,
        "context": wl.context,
        "new_tokens": wl.new_tokens,
    }


def _model_and_chip(cfg: ModelConfig, wl: Workload, chip: ChipSpec) -> dict[str, Any]:
    """The model, workload and chip as given; the parameters and the weights' bytes."""
    dtype = cfg.peak_dtype
    return {
        "model": cfg.to_dict(),
        "workload": workload_report(wl),
        "chip": {
            "name": chip.name,
            "compute_dtype": dtype,
            "peak_flops_per_s": chip.peak(dtype),
            "bandwidth_bytes_per_s": chip.bandwidth_bytes_per_s,
            "memory_bytes": chip.memory_bytes,
            "source": chip.source,
        },
        "attention_variant": cfg.attention_variant,
        "params": analytic.num_params(cfg),
        "active_params": moe.active_params(cfg),
        "param_counts": analytic.param_counts(cfg),
        "moe": moe_report(cfg, Workload("decode", wl.batch, wl.context)),
        "weight_bytes": analytic.weight_bytes(cfg),
    }


def _cache(cfg: ModelConfig, wl: Workload, page_size: int) -> dict[str, Any]:
    """The KV cache (on pages of `page_size` when given) and a hybrid's states: per token, for
    B sequences at S, the positions the windows hold, and the quantized cache's scales."""
    kv_cache = analytic.kv_cache_bytes(cfg, wl.context, wl.batch, page_size)
    states = analytic.state_bytes(cfg, wl.batch)  # a hybrid's state layers: flat in S
    return {
        "kv_bytes_per_token_per_layer": analytic.kv_bytes_per_token_per_layer(cfg),
        "kv_bytes_per_token": analytic.kv_bytes_per_token(cfg),
        "kv_cache_bytes": kv_cache,
        "state_bytes": states,  # a hybrid's recurrent states and conv caches of B sequences
        "state": state_report(cfg),
        "cache_bytes": kv_cache + states,
        "kv_positions_held": analytic.kv_positions_held(cfg, wl.context, page_size),
        "page_size": page_size,
        "kv_page_waste_bytes": kv_cache - analytic.kv_cache_bytes(cfg, wl.context, wl.batch),
        "kv_scales": cfg.kv_scale_kind,
        "kv_scale_bytes_per_token_per_layer": scale_bytes_per_token_per_layer(cfg),
        "kv_tensor_scale_bytes": tensor_scale_bytes(cfg),
    }


def _intensities(cfg: ModelConfig, wl: Workload, chip: ChipSpec) -> dict[str, Any]:
    """The decode step's and the given step's FLOPs, bytes and intensity, the attention's
    intensity, the ridge, and where the step lands on the roofline."""
    peak, bw = chip.peak(cfg.peak_dtype), chip.bandwidth_bytes_per_s
    decode = analytic.step_cost(cfg, Workload("decode", wl.batch, wl.context), chip)
    step = analytic.step_cost(cfg, wl, chip)
    on_roof = roofline.point(kernels.STEP_KERNEL, step.flops, step.bytes, peak, bw)
    return {
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
    }


def _floors(
    cfg: ModelConfig, wl: Workload, chip: ChipSpec, placed: list, page_size: int
) -> dict[str, Any]:
    """The memory floors a token, the step's bound whole and as its kernels one after another,
    and the serving point at this batch (`kvjax frontier`)."""
    peak, bw = chip.peak(cfg.peak_dtype), chip.bandwidth_bytes_per_s
    step = analytic.step_cost(cfg, wl, chip)
    step_floor = roofline.point(kernels.STEP_KERNEL, step.flops, step.bytes, peak, bw).bound_s
    kv_cache = analytic.kv_cache_bytes(cfg, wl.context, wl.batch, page_size)
    states = analytic.state_bytes(cfg, wl.batch)
    # an MoE model's floor: the weights a decode step of B tokens reads (the active weights at
    # B = 1, the expected experts touched above it); a dense model's: all of them (the seed's)
    decode_wl = Workload("decode", wl.batch, wl.context)
    floor_weights = (
        sum(k.weight_bytes for k in analytic.step_kernels(cfg, decode_wl).values())
        if cfg.is_moe
        else analytic.weight_bytes(cfg)
    )
    return {
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
    }


def _capacity(cfg: ModelConfig, wl: Workload, chip: ChipSpec, page_size: int) -> dict[str, Any]:
    """Whether the weights and cache fit the chip, and the largest batch and context that do."""
    weights = analytic.weight_bytes(cfg)
    cache = analytic.kv_cache_bytes(cfg, wl.context, wl.batch, page_size)
    cache += analytic.state_bytes(cfg, wl.batch)
    memory = chip.memory_bytes
    return {
        # the whole cache (KV + states) of B sequences passes the weights from this S (both keys)
        "kv_exceeds_weights_at_context": analytic.kv_exceeds_weights_at_context(cfg, wl.batch),
        "cache_exceeds_weights_at_context": analytic.kv_exceeds_weights_at_context(cfg, wl.batch),
        "fits_in_memory": None if memory is None else weights + cache <= memory,
        "max_batch_at_context": (
            None
            if memory is None
            else analytic.max_batch_that_fits(cfg, memory, wl.context, page_size)
        ),
        "max_context_at_batch": (
            None
            if memory is None
            else analytic.max_context_that_fits(cfg, memory, wl.batch, page_size)
        ),
    }


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
        p = placement_point.placement_point(cfg, pl, wl, chip, link_latency_s, capacity_factor)
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
