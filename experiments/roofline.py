"""Every kernel of prefill and decode placed on a roofline: closed form and traced on a chip
preset, and (options.measured) timed on this machine against its measured ceilings. Each phase
also places its attention twice: unfused (scores + softmax + av, as XLA runs it) and as one
fused kernel: in decode reading the cache once (`fused_attention_cost`: the seed's h/h_kv for
GQA, about 1.9 N for MLA's absorbed form), in prefill FlashAttention-2 over the causal blocks
(`kvjax.analytic.flash`, where the seed's I ~ S holds only up to the tile size). With
options.compiled_for (a target: h100, tpu-v5e, ...; needs the `targets` extra) each kernel also
as the chip's own executable counts it, compiled on this host (`kvjax.traced.target_step`);
every record of such a run names the target, and the figure `roofline_compiled` draws them."""

from kvjax import analytic, kernels
from kvjax.analytic import Workload, flash, roofline
from kvjax.runs import options as o
from kvjax.runs.config import resolve
from kvjax.traced.targets import TARGETS

# timed: in a multi-process run, every point on process 0 (kvjax.runs.launcher)
MEASURED = True

OPTIONS = {
    "phases": o.list_of(o.one_of("prefill", "decode")),
    "traced": o.BOOLEAN,
    "measured": o.BOOLEAN,
    "steps": o.POSITIVE_INT,
    "compiled_for": o.one_of(*TARGETS),
}
COMPILED_LAYERS = 2  # identical layers: two compiled, each layer kernel their mean


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
    phases = list(opts.get("phases", ["prefill", "decode"]))
    peak, bw, chip_name = chip.peak(cfg.compute_dtype), chip.bandwidth_bytes_per_s, chip.name
    reports = {}
    if opts.get("measured", False):  # every kernel timed inside the real step, on this machine
        reports = _measured_in_situ(cfg, wl, phases, opts)
        c = next(iter(reports.values()))["ceilings"]  # one roof for both phases: this run's
        peak, bw, chip_name = c["peak_flops_per_s"], c["bandwidth_bytes_per_s"], c["name"]
    records = []
    for phase in phases:
        w = Workload(phase, wl.batch, wl.context)
        layer = analytic.layer_kernels(cfg, w) | analytic.head_kernels(cfg, w)
        for name, k in layer.items():
            records.append(
                _point(name, phase, "closed form", k.flops, k.bytes, peak, bw, chip_name, cfg)
            )
        records += _attention_both_ways(cfg, w, layer, chip, peak, bw, chip_name)
        if opts.get("traced", True):
            from kvjax.traced.step import trace_step

            trace = trace_step(cfg, phase, wl.batch, wl.context, layers="one")
            for k in trace.kernels:
                if k.layer in (None, 0) and k.kernel in layer:
                    records.append(
                        _point(
                            k.kernel, phase, "traced", k.flops, k.bytes, peak, bw, chip_name, cfg
                        )
                    )
        if opts.get("compiled_for"):
            records += _compiled(cfg, w, opts["compiled_for"], layer, peak, bw, chip_name)
        for row in reports[phase]["rows"] if reports else []:
            if not row["closed_flops"] or not row["closed_bytes"]:
                continue  # glue rows have no closed form to place
            record = _point(row["name"], phase, "measured", row["closed_flops"],
                            row["closed_bytes"], peak, bw, chip_name, cfg,
                            seconds=row["median_s"])  # fmt: skip
            record.update(members=list(row["members"]), above_roof=row["above_roof"],
                          coverage=reports[phase]["coverage"], measured="in situ")  # fmt: skip
            records.append(record)
    if opts.get("compiled_for"):
        for r in records:
            r.update(target=opts["compiled_for"], batch=wl.batch, context=wl.context)
    return records


def _attention_both_ways(cfg, w, layer, chip, peak, bw, chip_name) -> list[dict]:
    """A layer's attention as two points: XLA's unfused scores + softmax + av summed, and one
    fused kernel. Decode: the seed's, the cache read once (`fused_attention_cost`); prefill:
    FlashAttention-2 over the causal blocks, tiled for the chip preset (`kvjax.analytic.flash`)."""
    parts = [layer[n] for n in kernels.ATTENTION_PARTS if n in layer]
    out = [_point(kernels.ATTENTION, w.phase, "closed form, unfused", sum(k.flops for k in parts),
                  sum(k.bytes for k in parts), peak, bw, chip_name, cfg)]  # fmt: skip
    if w.phase == "decode":  # the seed's decode attention intensity: the cache read once
        fused = analytic.fused_attention_cost(cfg, w)
    else:
        tiles = flash.plan_for_chip(cfg, w, chip)
        fused = flash.flash_attention_cost(cfg, w, tiles).attention
    out.append(_point(kernels.ATTENTION, w.phase, "closed form, fused", fused.flops, fused.bytes,
                      peak, bw, chip_name, cfg))  # fmt: skip
    return out


def _compiled(cfg, wl, target, layer, peak, bw, chip_name) -> list[dict]:
    """Each kernel of the step compiled for `target` (two layers, identical: a layer kernel is
    their mean), as kvjax counts the target's executable."""
    from kvjax.traced.target_step import trace_target_step

    L = min(COMPILED_LAYERS, cfg.num_layers)
    trace = trace_target_step(cfg.replace(num_layers=L), wl.phase, wl.batch, wl.context, target)
    out = []
    for name, c in trace.costs.by_kernel().items():
        if name not in layer:
            continue
        share = L if kernels.REGISTRY[name].per_layer else 1
        flops = (c.flops - (c.convert_flops if kernels.REGISTRY[name].kind == kernels.MATMUL
                            else 0.0)) / share  # fmt: skip
        record = _point(name, wl.phase, f"compiled for {target}", flops, c.bytes / share, peak,
                        bw, chip_name, cfg)  # fmt: skip
        record.update(device=trace.device_kind, split_k_bytes=c.split_k_bytes / share,
                      copy_bytes=c.copy_bytes / share, layers_compiled=L)  # fmt: skip
        out.append(record)
    return out


def _measured_in_situ(cfg, wl, phases, opts) -> dict[str, dict]:
    """Each phase's step profiled in situ, all placed under the read ceiling measured in this
    run (before each round of each phase)."""
    from kvjax.measured.attribution import reports_on_ceilings
    from kvjax.measured.ceilings import ReadCeiling, in_run_ceilings, load_or_measure_ceilings
    from kvjax.measured.profile import profile_sweep

    ceilings = load_or_measure_ceilings()
    read_ceiling, bandwidths = ReadCeiling.beside(ceilings), []
    profiles = [
        profile_sweep([cfg], Workload(phase, wl.batch, wl.context), steps=int(opts.get("steps", 8)),
                      rounds=2, between=lambda _: bandwidths.append(read_ceiling()))[0]
        for phase in phases
    ]  # fmt: skip
    reports = reports_on_ceilings(
        profiles,
        in_run_ceilings(ceilings, bandwidths),
        remeasure=lambda: in_run_ceilings(ceilings, [*bandwidths, read_ceiling()]),
    )
    return dict(zip(phases, reports, strict=True))
