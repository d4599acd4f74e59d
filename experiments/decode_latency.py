"""Minimum ms/token and fraction of peak against batch for each num_kv_heads (and MoE models
beside the dense: their weights read grow with the experts the batch touches): the closed-form
bound on a chip preset, or (options.measured) the decode step timed on this machine beside the
closed-form bound on its measured ceilings, the batches timed interleaved (round-robin, the
bandwidth re-measured between rounds) and flagged when below their bound or against the trend
of their bytes (`kvjax.measured.interleave`). A model with `attention_kernel: flash` counts its
decode attention as one fused flash-decoding kernel (`kvjax.analytic.flash`) tiled for the chip."""

from kvjax import analytic
from kvjax.analytic import Workload, roofline
from kvjax.runs import options as o
from kvjax.runs.config import resolve

# timed: in a multi-process run, every point on process 0 (kvjax.runs.launcher)
MEASURED = True

OPTIONS = {
    "batches": o.list_of(o.POSITIVE_INT),
    "measured": o.BOOLEAN,
    "budget_s": o.POSITIVE,
    "rounds": o.POSITIVE_INT,
}


def run_point(point) -> list[dict]:
    cfg, wl, chip = resolve(point)
    opts = point.options
    batches = [int(b) for b in opts.get("batches", [1, 2, 4, 8, 16, 32, 64, 128, 256])]
    workloads = [Workload("decode", b, wl.context) for b in batches]
    result = None
    if opts.get("measured", False):  # on this machine, under the read ceiling of this run
        from kvjax.measured.ceilings import in_run_ceilings, load_or_measure_ceilings
        from kvjax.measured.interleave import time_interleaved

        result = time_interleaved(
            [(cfg, w) for w in workloads],
            rounds=int(opts.get("rounds", 3)),
            budget_s=float(opts.get("budget_s", 1.0)),
        )
        chip = in_run_ceilings(load_or_measure_ceilings(), result.bandwidth_rounds_bytes_per_s)
    peak, bw = chip.peak(cfg.compute_dtype), chip.bandwidth_bytes_per_s
    records, measured = [], []
    for i, w in enumerate(workloads):
        step = analytic.step_cost(cfg, w, chip)  # chip: the fused attention's tiles, if fused
        on_roof = roofline.point("decode step", step.flops, step.bytes, peak, bw)
        # an MoE model's weights floor: the weights this batch reads (its touched experts)
        floor = analytic.weight_bytes(cfg)
        # what one chip must hold: the weights, B sequences' cache (and a hybrid's states)
        held = (floor + analytic.kv_cache_bytes(cfg, wl.context, w.batch)
                + analytic.state_bytes(cfg, w.batch))  # fmt: skip
        if cfg.is_moe:
            floor = sum(k.weight_bytes for k in analytic.step_kernels(cfg, w).values())
        record = {
            "model": cfg.name,
            "num_kv_heads": cfg.num_kv_heads,
            "attention_kernel": cfg.attention_kernel,
            "batch": w.batch,
            "context": wl.context,
            "chip": chip.name,
            "source": "closed form",
            "decode_intensity": step.intensity,
            "step_floor_s": on_roof.bound_s,
            "weight_floor_s": roofline.memory_floor_s(floor, bw),
            "moe": cfg.is_moe,
            "fraction_of_peak": on_roof.attainable_flops_per_s / peak,
            "memory_needed_bytes": held,
            "chip_memory_bytes": chip.memory_bytes,
            "fits": chip.memory_bytes is None or held <= chip.memory_bytes,
        }
        records.append(record)
        if result is not None:
            t = result.points[i]
            measured.append({
                **record,
                "source": "measured",
                "step_floor_s": t.median_s,
                "iqr_s": t.iqr_s,
                "fraction_of_peak": step.flops / t.median_s / peak,
                "measured_s": t.median_s,
                "predicted_s": record["step_floor_s"],
                "closed_step_bytes": step.bytes,
                "bandwidth_rounds_bytes_per_s": result.bandwidth_rounds_bytes_per_s,
            })  # fmt: skip
    if measured:
        from kvjax.measured.interleave import flag_sweep

        flag_sweep(measured, "closed_step_bytes")
    return records + measured
