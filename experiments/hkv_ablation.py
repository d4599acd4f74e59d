"""Over num_kv_heads: KV bytes, attention intensity, predicted (closed-form bound on the measured
ceilings) and measured decode-step time, and XLA's traced step bytes."""

from kvjax import analytic
from kvjax.analytic import roofline
from kvjax.runs.config import resolve


def run_point(point) -> list[dict]:
    from kvjax.measured.ceilings import load_or_measure_ceilings
    from kvjax.measured.step import time_decode_step
    from kvjax.traced.step import trace_step

    cfg, wl, _ = resolve(point)
    opts = point.options
    step = analytic.step_cost(cfg, wl)
    ceilings = load_or_measure_ceilings()
    peak, bw = ceilings.peak(cfg.compute_dtype), ceilings.bandwidth_bytes_per_s
    record = {
        "model": cfg.name,
        "num_kv_heads": cfg.num_kv_heads,
        "batch": wl.batch,
        "context": wl.context,
        "kv_bytes_per_token": analytic.kv_bytes_per_token(cfg),
        "kv_cache_bytes": analytic.kv_cache_bytes(cfg, wl.context, wl.batch),
        "attention_intensity": analytic.attention_intensity(cfg),
        "closed_step_bytes": step.bytes,
        "traced_step_bytes": trace_step(
            cfg, "decode", wl.batch, wl.context, layers="one"
        ).total.bytes,
        "predicted_s": roofline.point("decode step", step.flops, step.bytes, peak, bw).bound_s,
        "device": ceilings.name,
    }
    if opts.get("measured", True):
        stats = time_decode_step(cfg, wl, budget_s=float(opts.get("budget_s", 1.0)))
        record["measured_s"] = stats.median_s
        record["measured_iqr_s"] = stats.iqr_s
    return [record]
