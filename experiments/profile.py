"""Every kernel of the served step timed in situ (`kvjax.measured.profile`) for each num_kv_heads
in options.kv_heads, interleaved round-robin with the read bandwidth re-measured before each
round, placed on this machine's measured roofline. One record per kernel row and one per step."""

from kvjax.runs import options as o
from kvjax.runs.config import resolve

# timed: in a multi-process run, every point on process 0 (kvjax.runs.launcher)
MEASURED = True

OPTIONS = {
    "kv_heads": o.list_of(o.POSITIVE_INT),
    "steps": o.POSITIVE_INT,
    "rounds": o.POSITIVE_INT,
}


def run_point(point, artifacts=None) -> list[dict]:
    from kvjax.measured.attribution import report_records, reports_on_ceilings
    from kvjax.measured.ceilings import ReadCeiling, in_run_ceilings, load_or_measure_ceilings
    from kvjax.measured.profile import profile_sweep

    cfg, wl, _ = resolve(point)
    opts = point.options
    kv_heads = [int(k) for k in opts.get("kv_heads", [cfg.num_kv_heads])]
    cfgs = [cfg.replace(num_kv_heads=k) for k in kv_heads]
    ceilings = load_or_measure_ceilings()
    rounds_bw = []
    read_ceiling = ReadCeiling.beside(ceilings)

    def between(_round):  # the read ceiling re-measured among the points
        rounds_bw.append(read_ceiling())

    profiles = profile_sweep(
        cfgs,
        wl,
        steps=int(opts.get("steps", 8)),
        rounds=int(opts.get("rounds", 3)),
        trace_root=None if artifacts is None else str(artifacts),
        between=between,
    )
    reports = reports_on_ceilings(  # placed under the read ceiling of this very run
        profiles,
        in_run_ceilings(ceilings, rounds_bw),
        remeasure=lambda: in_run_ceilings(ceilings, [*rounds_bw, read_ceiling()]),
    )
    records = []
    for report in reports:
        records += report_records(report, model=cfg.name, bandwidth_rounds_bytes_per_s=rounds_bw)
    return records
