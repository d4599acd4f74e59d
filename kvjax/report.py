"""What the closed form says about one (model, workload, chip): the `kvjax calc` report.

Pure Python, built only from `analytic` and `roofline`; the CLI prints it, tests check it.
"""

from __future__ import annotations

from typing import Any

from kvjax import analytic, roofline
from kvjax.analytic import Workload
from kvjax.config import ModelConfig
from kvjax.hardware import ChipSpec

# The seed's table: per token, 8k context x 1 sequence, 128k context x 32 sequences.
SEED_TABLE_POINTS = ((8192, 1), (131072, 32))


def calc_report(cfg: ModelConfig, wl: Workload, chip: ChipSpec) -> dict[str, Any]:
    """Every closed-form number of `kvjax calc --json`, keyed as documented in the README."""
    dtype = analytic.compute_dtype(cfg)
    peak, bw = chip.peak(dtype), chip.bandwidth_bytes_per_s
    decode = analytic.step_cost(cfg, Workload("decode", wl.batch, wl.context))
    step = analytic.step_cost(cfg, wl)
    weights = analytic.weight_bytes(cfg)
    kv_cache = analytic.kv_cache_bytes(cfg, wl.context, wl.batch)
    kernels = roofline.place(analytic.step_kernels(cfg, wl).values(), peak, bw)
    step_floor = roofline.bound_time_s(step.flops, step.bytes, peak, bw)
    report: dict[str, Any] = {
        "model": cfg.to_dict(),
        "workload": {"phase": wl.phase, "batch": wl.batch, "context": wl.context},
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
        "param_counts": analytic.param_counts(cfg),
        "weight_bytes": weights,
        "kv_bytes_per_token_per_layer": analytic.kv_bytes_per_token_per_layer(cfg),
        "kv_bytes_per_token": analytic.kv_bytes_per_token(cfg),
        "kv_cache_bytes": kv_cache,
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
        "attainable_flops_per_s": roofline.attainable_flops_per_s(step.intensity, peak, bw),
        "fraction_of_peak": roofline.fraction_of_peak(step.intensity, peak, bw),
        "weight_floor_s_per_token": roofline.memory_floor_s(weights, bw),
        "weights_kv_floor_s_per_token": roofline.memory_floor_s(weights + kv_cache, bw),
        "step_floor_s": step_floor,
        "kernel_sum_bound_s": sum(k.bound_s for k in kernels),
        "tokens_per_s_per_sequence": (1.0 / step_floor) if wl.phase == "decode" else None,
        "tokens_per_s": (wl.batch / step_floor) if wl.phase == "decode" else None,
        "kv_exceeds_weights_at_context": analytic.kv_exceeds_weights_at_context(cfg, wl.batch),
        "fits_in_memory": (
            None if chip.memory_bytes is None else weights + kv_cache <= chip.memory_bytes
        ),
        "max_batch_at_context": (
            None
            if chip.memory_bytes is None
            else analytic.max_batch_that_fits(cfg, chip.memory_bytes, wl.context)
        ),
        "max_context_at_batch": (
            None
            if chip.memory_bytes is None
            else analytic.max_context_that_fits(cfg, chip.memory_bytes, wl.batch)
        ),
        "kernels": [p.to_dict() for p in kernels],
    }
    return report


def variant_kv_heads(cfg: ModelConfig) -> list[tuple[str, int]]:
    """The seed's three rows for this model: MHA (K=N), a GQA K, MQA (K=1)."""
    choices = cfg.kv_head_choices()
    if 1 < cfg.num_kv_heads < cfg.num_heads:
        gqa = cfg.num_kv_heads
    else:
        middle = [k for k in choices if 1 < k < cfg.num_heads]
        gqa = 8 if 8 in middle else (max((k for k in middle if k <= 8), default=None))
    rows = [("MHA", cfg.num_heads)]
    if gqa is not None:
        rows.append(("GQA", gqa))
    if cfg.num_heads > 1:
        rows.append(("MQA", 1))
    return rows


def variants_table(
    cfg: ModelConfig, chip: ChipSpec, points: tuple[tuple[int, int], ...] = SEED_TABLE_POINTS
) -> list[dict[str, Any]]:
    """The seed's MHA/GQA/MQA table for any model, plus each variant's weights and B=1 floor."""
    bw = chip.bandwidth_bytes_per_s
    rows = []
    mha_per_token = analytic.kv_bytes_per_token(cfg.replace(num_kv_heads=cfg.num_heads))
    for label, k in variant_kv_heads(cfg):
        variant = cfg.replace(num_kv_heads=k)
        per_token = analytic.kv_bytes_per_token(variant)
        rows.append(
            {
                "variant": label,
                "num_kv_heads": k,
                "kv_bytes_per_token": per_token,
                "cache": [
                    {
                        "context": s,
                        "batch": b,
                        "kv_cache_bytes": analytic.kv_cache_bytes(variant, s, b),
                    }
                    for s, b in points
                ],
                "cache_reduction_vs_mha": mha_per_token / per_token,
                "params": analytic.num_params(variant),
                "weight_bytes": analytic.weight_bytes(variant),
                "weight_floor_s_per_token": roofline.memory_floor_s(
                    analytic.weight_bytes(variant), bw
                ),
                "attention_intensity": analytic.attention_intensity(variant),
            }
        )
    return rows
