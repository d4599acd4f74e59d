"""`kvjax bench`: kernels timed alone and the whole decode step, each placed on the measured
roofline of this machine (and on a named chip's, when given) with `kvjax.analytic.roofline.point`.
"""

from __future__ import annotations

from typing import Any

from kvjax import analytic, kernels
from kvjax.analytic import KernelCost, Workload, roofline
from kvjax.analytic.moe import model_workload
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.measured.kernels import check_fits, flash_execution, kernel_benches, time_kernel
from kvjax.measured.step import time_decode_step
from kvjax.measured.timing import TimingStats
from kvjax.model.config import ModelConfig


def place(
    name: str,
    closed: KernelCost,
    stats: TimingStats,
    ceilings: ChipSpec,
    dtype: str,
    chip: ChipSpec | None = None,
    layers: int = 1,
) -> dict[str, Any]:
    """One measured point on the measured roofline (and on a named chip's, if given)."""
    flops, bytes_ = closed.flops * layers, closed.bytes * layers
    on_roof = roofline.point(
        name, flops, bytes_, ceilings.peak(dtype), ceilings.bandwidth_bytes_per_s
    )
    point = {
        "kernel": name,
        "median_s": stats.median_s,
        "min_s": stats.min_s,
        "iqr_s": stats.iqr_s,
        "runs": stats.runs,
        "closed_flops": flops,
        "closed_bytes": bytes_,
        "bound_s": on_roof.bound_s,
        "bound": on_roof.bound,
        "achieved_flops_per_s": flops / stats.median_s,
        "achieved_bytes_per_s": bytes_ / stats.median_s,
        "fraction_of_bound": on_roof.bound_s / stats.median_s,
        "device": stats.device,
    }
    if chip is not None:
        point["chip_bound_s"] = roofline.point(
            name, flops, bytes_, chip.peak(dtype), chip.bandwidth_bytes_per_s
        ).bound_s
    return point


def check_bench_fits(cfg: ModelConfig, wl: Workload, include_step: bool = True) -> None:
    """The largest allocation a bench makes, refused before anything is allocated: the whole
    step (weights + KV cache) when it is timed."""
    if include_step and wl.phase in ("decode", "extend"):
        needed = analytic.weight_bytes(cfg) + analytic.kv_cache_bytes(cfg, wl.context, wl.batch)
        check_fits(f"the {cfg.name} decode step (weights + KV cache)", needed)


def bench_point(
    cfg: ModelConfig,
    wl: Workload,
    ceilings: ChipSpec,
    *,
    names: list[str] | None = None,
    include_step: bool = True,
    budget_s: float = 1.0,
    chip: ChipSpec | None = None,
) -> list[dict[str, Any]]:
    """Measured points of one (config, workload): the kernels named (default: all) and the whole
    step."""
    dtype = cfg.compute_dtype
    check_bench_fits(cfg, wl, include_step and (names is None or kernels.STEP_KERNEL in names))
    benches = kernel_benches(cfg, wl)
    wanted = names or list(benches)
    unknown = [k for k in wanted if k not in benches and k != kernels.STEP_KERNEL]
    if unknown:
        raise KvjaxError(
            f"unknown kernel(s) {', '.join(unknown)}; allowed: {', '.join(benches)}, "
            f"{kernels.STEP_KERNEL}"
        )
    traced = traced_bytes_per_kernel(cfg, wl)
    points = []
    for name in wanted:
        if name == kernels.STEP_KERNEL:
            continue
        stats = time_kernel(benches[name], budget_s=budget_s)
        points.append(place(name, benches[name].closed, stats, ceilings, dtype, chip))
        points[-1]["executed_as"] = benches[name].executed_as
    timed = wl.phase in ("decode", "extend")  # the served step (prefill's: `kvjax profile`)
    if include_step and timed and (names is None or kernels.STEP_KERNEL in names):
        stats = time_decode_step(cfg, wl, budget_s=2 * budget_s)
        step = analytic.step_cost(cfg, model_workload(cfg, wl))
        closed = KernelCost(kernels.STEP_KERNEL, step.flops, step.bytes)
        points.append(place(kernels.STEP_KERNEL, closed, stats, ceilings, dtype, chip))
        if cfg.attention_kernel == "flash":  # the step runs the fused attention as its bench does
            points[-1]["executed_as"] = flash_execution(cfg, wl.phase)
    for p in points:
        # a Pallas kernel interpreted on a CPU is a check of its values, not a kernel's time
        p["interpreted"] = p.get("executed_as") == "pallas interpret"
        p["num_kv_heads"] = cfg.num_kv_heads
        p["traced_bytes"] = traced.get(p["kernel"])
    return points


def traced_bytes_per_kernel(cfg: ModelConfig, wl: Workload) -> dict[str, float]:
    """XLA's lowered bytes of one layer's kernels (and of the whole step), for the bench table."""
    from kvjax.traced.step import trace_step

    trace = trace_step(cfg, wl.phase, wl.batch, wl.context, layers="one", new_tokens=wl.new_tokens)
    per_layer = {}
    for k in trace.kernels:
        if k.layer in (None, 0):  # one copy of each layer kernel, plus the head kernels
            per_layer[k.kernel] = per_layer.get(k.kernel, 0.0) + k.bytes
    if cfg.attention_kernel != "flash":
        per_layer[kernels.ATTENTION] = sum(per_layer.get(n, 0.0) for n in kernels.ATTENTION_PARTS)
    elif any(n.startswith("interpreted") for n in trace.notes):
        per_layer.pop(kernels.ATTENTION, None)  # the interpreter's loop: not a cost
    else:  # the fused kernel (XLA's composite of it on this backend) and the combine
        per_layer[kernels.ATTENTION] = sum(
            per_layer.get(n, 0.0) for n in (kernels.ATTENTION, kernels.ATTN_COMBINE)
        )
    per_layer[kernels.STEP_KERNEL] = trace.total.bytes
    return per_layer
