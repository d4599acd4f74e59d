"""Every kernel of prefill and decode placed on a roofline: closed form and traced on a chip
preset, and (options.measured) timed on this machine against its measured ceilings."""

from kvjax import analytic
from kvjax.analytic import Workload, roofline
from kvjax.runs import options as o
from kvjax.runs.config import resolve

OPTIONS = {
    "phases": o.list_of(o.one_of("prefill", "decode")),
    "traced": o.BOOLEAN,
    "measured": o.BOOLEAN,
    "steps": o.POSITIVE_INT,
}


def _point(kernel, phase, source, flops, bytes_, peak, bw, chip, cfg, seconds=None):
    on_roof = roofline.point(kernel, flops, bytes_, peak, bw)
    record = {
        "model": cfg.name,
        "num_kv_heads": cfg.num_kv_heads,
        "phase": phase,
        "kernel": kernel,
        "source": source,
        "chip": chip,
        "peak_flops_per_s": peak,
        "bandwidth_bytes_per_s": bw,
        "flops": flops,
        "bytes": bytes_,
        "intensity": on_roof.intensity,
        "bound_s": on_roof.bound_s,
        "bound": on_roof.bound,
    }
    if seconds is not None:
        record["median_s"] = seconds
        record["achieved_flops_per_s"] = flops / seconds
    return record


def run_point(point) -> list[dict]:
    cfg, wl, chip = resolve(point)
    opts = point.options
    dtype = cfg.compute_dtype
    if opts.get("measured", False):  # everything on this machine's measured roofline
        from kvjax.measured.ceilings import load_or_measure_ceilings

        chip = load_or_measure_ceilings()
    peak, bw = chip.peak(dtype), chip.bandwidth_bytes_per_s
    records = []
    for phase in opts.get("phases", ["prefill", "decode"]):
        w = Workload(phase, wl.batch, wl.context)
        layer = analytic.layer_kernels(cfg, w) | analytic.head_kernels(cfg, w)
        for name, k in layer.items():
            records.append(
                _point(name, phase, "closed form", k.flops, k.bytes, peak, bw, chip.name, cfg)
            )
        if opts.get("traced", True):
            from kvjax.traced.step import trace_step

            trace = trace_step(cfg, phase, wl.batch, wl.context, layers="one")
            for k in trace.kernels:
                if k.layer in (None, 0) and k.kernel in layer:
                    records.append(
                        _point(
                            k.kernel, phase, "traced", k.flops, k.bytes, peak, bw, chip.name, cfg
                        )
                    )
        if opts.get("measured", False):  # every kernel timed inside the real step
            records += _measured_in_situ(cfg, w, opts)
    return records


def _measured_in_situ(cfg, wl, opts) -> list[dict]:
    from kvjax.measured.attribution import reports_on_ceilings
    from kvjax.measured.ceilings import ReadCeiling, in_run_ceilings, load_or_measure_ceilings
    from kvjax.measured.profile import profile_sweep

    ceilings = load_or_measure_ceilings()
    read_ceiling, bandwidths = ReadCeiling(), []
    profiles = profile_sweep([cfg], wl, steps=int(opts.get("steps", 8)), rounds=2,
                             between=lambda _: bandwidths.append(read_ceiling()))  # fmt: skip
    (report,) = reports_on_ceilings(  # under the read ceiling measured in this run
        profiles,
        in_run_ceilings(ceilings, bandwidths),
        remeasure=lambda: in_run_ceilings(ceilings, [*bandwidths, read_ceiling()]),
    )
    peak, bw = report["ceilings"]["peak_flops_per_s"], report["ceilings"]["bandwidth_bytes_per_s"]
    out = []
    for row in report["rows"]:
        if not row["closed_flops"] or not row["closed_bytes"]:
            continue  # glue rows have no closed form to place
        flops, bytes_, chip = row["closed_flops"], row["closed_bytes"], report["ceilings"]["name"]
        record = _point(row["name"], wl.phase, "measured", flops, bytes_, peak, bw, chip, cfg,
                        seconds=row["median_s"])  # fmt: skip
        record.update(members=list(row["members"]), above_roof=row["above_roof"],
                      coverage=report["coverage"], measured="in situ")  # fmt: skip
        out.append(record)
    return out
