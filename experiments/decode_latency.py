"""Minimum ms/token and fraction of peak against batch for each num_kv_heads: the closed-form
bound on a chip preset, or (options.measured) the decode step timed on this machine beside the
closed-form bound on its measured ceilings, the batches timed interleaved (round-robin, the
bandwidth re-measured between rounds) and flagged when below their bound or against the trend
of their bytes (`kvjax.measured.interleave`)."""

from kvjax import analytic
from kvjax.analytic import Workload, roofline
from kvjax.runs.config import resolve


def run_point(point) -> list[dict]:
    cfg, wl, chip = resolve(point)
    opts = point.options
    measured = bool(opts.get("measured", False))
    if measured:
        from kvjax.measured.ceilings import load_or_measure_ceilings

        chip = load_or_measure_ceilings()
    dtype = cfg.compute_dtype
    peak, bw = chip.peak(dtype), chip.bandwidth_bytes_per_s
    records, timed = [], []
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
        timed.append((w, record, step))
    if measured:
        records += _measured([(cfg, w) for w, _, _ in timed], timed, peak, opts)
    return records


def _measured(points, timed, peak, opts) -> list[dict]:
    from kvjax.measured.interleave import flag_sweep, time_interleaved

    result = time_interleaved(
        points, rounds=int(opts.get("rounds", 3)), budget_s=float(opts.get("budget_s", 1.0))
    )
    out = []
    for t, (_, record, step) in zip(result.points, timed, strict=True):
        out.append(
            {
                **record,
                "source": "measured",
                "step_floor_s": t.median_s,
                "iqr_s": t.iqr_s,
                "fraction_of_peak": step.flops / t.median_s / peak,
                "measured_s": t.median_s,
                "predicted_s": record["step_floor_s"],
                "closed_step_bytes": step.bytes,
                "bandwidth_rounds_bytes_per_s": result.bandwidth_rounds_bytes_per_s,
            }
        )
    flag_sweep(out, "closed_step_bytes")
    return out
