"""Over num_kv_heads (or, for an MLA model, kv_lora_rank: `configs/mla_ablation.yaml`; the figure
puts both on one axis, KV bytes per token): attention intensity, predicted (closed-form bound on
the measured ceilings) and measured decode-step time, and XLA's traced step bytes.

The points of the sweep are measured together, interleaved (`run_points`): every model is built
first, then each is timed for a few steps in turn, round after round, with the read bandwidth
re-measured before each round, so a change of the machine's bandwidth mode biases no point.
A point measured below its bound, or whose time moves against its bytes along the sweep, is
flagged in its record (and the figure)."""

from kvjax import analytic
from kvjax.analytic import roofline
from kvjax.runs import options as o
from kvjax.runs.config import resolve

# timed: in a multi-process run, every point on process 0 (kvjax.runs.launcher)
MEASURED = True

OPTIONS = {"measured": o.BOOLEAN, "budget_s": o.POSITIVE, "rounds": o.POSITIVE_INT}

NOISE = 0.05  # a time differing by less than this from another's is within timing noise


def _closed_record(point, ceilings) -> dict:
    from kvjax.traced.step import trace_step

    cfg, wl, _ = resolve(point)
    step = analytic.step_cost(cfg, wl)
    peak, bw = ceilings.peak(cfg.compute_dtype), ceilings.bandwidth_bytes_per_s
    return {
        "model": cfg.name,
        "attention_kind": cfg.attention_variant,
        "num_kv_heads": cfg.num_kv_heads,
        "kv_lora_rank": cfg.kv_lora_rank,
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


def run_points(points) -> list[list[dict]]:
    """Every point's record, the measured ones timed interleaved and placed under the read
    ceiling measured in the same run."""
    from kvjax.measured.ceilings import in_run_ceilings, load_or_measure_ceilings
    from kvjax.measured.interleave import flag_sweep, time_interleaved

    ceilings = load_or_measure_ceilings()
    measured = [i for i, p in enumerate(points) if p.options.get("measured", True)]
    timed = None
    if measured:
        opts = points[measured[0]].options
        timed = time_interleaved(
            [resolve(points[i])[:2] for i in measured],
            rounds=int(opts.get("rounds", 3)),
            budget_s=float(opts.get("budget_s", 1.0)),
        )
        ceilings = in_run_ceilings(ceilings, timed.bandwidth_rounds_bytes_per_s)
    records = [_closed_record(p, ceilings) for p in points]
    if timed is not None:
        for i, result in zip(measured, timed.points, strict=True):
            records[i].update(
                measured_s=result.median_s,
                measured_iqr_s=result.iqr_s,
                bandwidth_rounds_bytes_per_s=timed.bandwidth_rounds_bytes_per_s,
            )
        flag_sweep([records[i] for i in measured], "closed_step_bytes", NOISE)
    return [[r] for r in records]


def run_point(point) -> list[dict]:
    return run_points([point])[0]
