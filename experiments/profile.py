"""Every kernel of the served step timed in situ (`kvjax.measured.profile`) for each num_kv_heads
in options.kv_heads, interleaved round-robin with the read bandwidth re-measured before each
round, placed on this machine's measured roofline. One record per kernel row and one per step."""

from kvjax.runs.config import resolve


def run_point(point, artifacts=None) -> list[dict]:
    from kvjax.measured.attribution import report_records, reports_on_ceilings
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
    for report in reports:
        records += report_records(report, model=cfg.name, bandwidth_rounds_bytes_per_s=rounds_bw)
    return records
