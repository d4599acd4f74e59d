"""Every kernel of the served step timed in situ (`kvjax.measured.profile`) for each num_kv_heads
in options.kv_heads, interleaved round-robin with the read bandwidth re-measured before each
round, placed on this machine's measured roofline. One record per kernel row and one per step."""

from kvjax.runs.config import resolve


def run_point(point, artifacts=None) -> list[dict]:
    from kvjax.measured.attribution import reports_on_ceilings
    from kvjax.measured.ceilings import load_or_measure_ceilings, measure_read_bandwidth
    from kvjax.measured.profile import profile_sweep

    cfg, wl, _ = resolve(point)
    opts = point.options
    kv_heads = [int(k) for k in opts.get("kv_heads", [cfg.num_kv_heads])]
    cfgs = [cfg.replace(num_kv_heads=k) for k in kv_heads]
    ceilings = load_or_measure_ceilings()
    rounds_bw = []

    def between(_round):  # the ceiling re-measured among the points
        rounds_bw.append(measure_read_bandwidth(256 * 2**20, budget_s=0.3, trials=2)[0])

    profiles = profile_sweep(
        cfgs,
        wl,
        steps=int(opts.get("steps", 8)),
        rounds=int(opts.get("rounds", 3)),
        trace_root=None if artifacts is None else str(artifacts),
        between=between,
    )
    reports = reports_on_ceilings(
        profiles, ceilings, remeasure=lambda: load_or_measure_ceilings(refresh=True)
    )
    records = []
    for prof, report in zip(profiles, reports, strict=True):
        common = {
            "model": cfg.name,
            "num_kv_heads": prof.cfg.num_kv_heads,
            "phase": wl.phase,
            "batch": wl.batch,
            "context": wl.context,
            "device": report["device"],
            "chip": ceilings.name,
            "peak_flops_per_s": report["ceilings"]["peak_flops_per_s"],
            "bandwidth_bytes_per_s": report["ceilings"]["bandwidth_bytes_per_s"],
            "bandwidth_rounds_bytes_per_s": rounds_bw,
            "coverage": report["coverage"],
            "steps": report["steps"],
            "trace_dir": report["trace_dir"],
            "source": "in situ",
        }
        for row in [*report["rows"], report["step"]]:
            records.append({**common, **{("kernel" if k == "name" else k): v
                                         for k, v in row.items()}})  # fmt: skip
    return records
