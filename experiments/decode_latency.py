"""Minimum ms/token and fraction of peak against batch for each num_kv_heads: the closed-form
bound on a chip preset, or (options.measured) the decode step timed on this machine beside the
closed-form bound on its measured ceilings."""

from kvjax import analytic
from kvjax.analytic import Workload, roofline
from kvjax.runs.config import resolve


def run_point(point) -> list[dict]:
    cfg, wl, chip = resolve(point)
    opts = point.options
    measured = bool(opts.get("measured", False))
    if measured:
        from kvjax.measured.ceilings import load_or_measure_ceilings
        from kvjax.measured.step import time_decode_step

        chip = load_or_measure_ceilings()
    dtype = cfg.compute_dtype
    peak, bw = chip.peak(dtype), chip.bandwidth_bytes_per_s
    records = []
    for batch in opts.get("batches", [1, 2, 4, 8, 16, 32, 64, 128, 256]):
        w = Workload("decode", int(batch), wl.context)
        step = analytic.step_cost(cfg, w)
        on_roof = roofline.point("decode step", step.flops, step.bytes, peak, bw)
        record = {
            "model": cfg.name,
            "num_kv_heads": cfg.num_kv_heads,
            "batch": int(batch),
            "context": wl.context,
            "chip": chip.name,
            "source": "closed form",
            "decode_intensity": step.intensity,
            "step_floor_s": on_roof.bound_s,
            "weight_floor_s": roofline.memory_floor_s(analytic.weight_bytes(cfg), bw),
            "fraction_of_peak": on_roof.attainable_flops_per_s / peak,
        }
        records.append(record)
        if measured:
            stats = time_decode_step(cfg, w, budget_s=float(opts.get("budget_s", 1.0)))
            records.append(
                {
                    **record,
                    "source": "measured",
                    "step_floor_s": stats.median_s,
                    "iqr_s": stats.iqr_s,
                    "fraction_of_peak": step.flops / stats.median_s / peak,
                }
            )
    return records
