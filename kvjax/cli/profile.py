"""`kvjax profile`: the served step timed in situ under jax.profiler, every executed op
attributed to its kernel (or fused group of kernels), on this device's measured roofline."""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import Any

from kvjax.cli import render
from kvjax.cli.args import (
    add_model_args,
    add_workload_args,
    dequantized_experts,
    emit,
    resolve_model,
    resolve_workload,
)
from kvjax.units import fmt_rate, fmt_seconds

OPEN_TRACE = (
    "open the trace: drag perfetto_trace.json.gz into the Perfetto UI (ui.perfetto.dev), or "
    "`pip install xprof && xprof --logdir {dir}` (offline once installed)"
)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="time every kernel inside the real step (jax.profiler), on the measured roofline",
        description="Run the served step (prefill, or decode = attend + donated append) under "
        "jax.profiler and attribute every executed op to its kernel through the compiled "
        "module's op metadata; fused kernels are one row naming its members.",
    )
    add_model_args(p, kv_heads_sweep=True)
    add_workload_args(p, extend=True)
    p.add_argument("--steps", type=int, default=20, help="profiled steps per point (default 20)")
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="the points are profiled round-robin in this many rounds (default 2), so a change "
        "of the machine's speed biases no point",
    )
    p.add_argument(
        "--trace-dir",
        default=None,
        help="where the traces are kept (default runs/profiles/<model>-<phase>-<time>/)",
    )
    p.add_argument("--refresh-ceilings", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def profile_report(args: argparse.Namespace) -> dict[str, Any]:
    from kvjax.measured.attribution import reports_on_ceilings
    from kvjax.measured.ceilings import ReadCeiling, in_run_ceilings, load_or_measure_ceilings
    from kvjax.measured.profile import check_sweep_fits, profile_sweep

    base, wl = resolve_model(args), resolve_workload(args)
    base = dequantized_experts(base)  # gpt-oss's MXFP4 experts: timed as the model runs them
    cfgs = [base.replace(num_kv_heads=k) for k in (args.kv_heads or [base.num_kv_heads])]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    root = Path(args.trace_dir or f"runs/profiles/{base.name}-{wl.phase}-{stamp}")
    check_sweep_fits(cfgs, wl)  # before the ceilings or any model allocate anything
    with render.progress("measuring ceilings (cached per device)"):
        ceilings = load_or_measure_ceilings(refresh=args.refresh_ceilings)
    rounds = min(args.rounds, args.steps)
    with render.progress(
        f"profiling {base.name} over num_kv_heads {[c.num_kv_heads for c in cfgs]}"
    ):
        read_ceiling, bandwidths = ReadCeiling.beside(ceilings), []
        profiles = profile_sweep(
            cfgs,
            wl,
            steps=-(-args.steps // rounds),
            rounds=rounds,
            trace_root=str(root),
            between=lambda _: bandwidths.append(read_ceiling()),
        )
    points = reports_on_ceilings(  # under the read ceiling measured in this run
        profiles,
        in_run_ceilings(ceilings, bandwidths),
        remeasure=lambda: in_run_ceilings(ceilings, [*bandwidths, read_ceiling()]),
    )
    return {"trace_root": str(root), "points": points}


def run(args: argparse.Namespace) -> int:
    from kvjax.runs import distributed

    if distributed.requested() is not None:
        from kvjax.errors import KvjaxError

        raise KvjaxError(
            "kvjax profile times the step on one host (timings and ceilings are per machine): "
            "run it as a single process, without JAX_NUM_PROCESSES or srun"
        )
    for flag in ("steps", "rounds"):
        if getattr(args, flag) < 1:
            from kvjax.errors import KvjaxError

            raise KvjaxError(f"--{flag} {getattr(args, flag)} must be a positive integer")
    return emit(args, profile_report(args), print_profile)


def print_profile(report: dict[str, Any]) -> None:
    from rich.table import Table

    con = render.console()
    for point in report["points"]:
        m, wl, c = point["model"], point["workload"], point["ceilings"]
        con.print(
            f"[bold]{m['name']}[/bold] {render.attention_label(m)} | {wl['phase']} | "
            f"B={wl['batch']:,} | S={wl['context']:,} | {point['device']}: "
            f"{fmt_rate(c['peak_flops_per_s'], 'FLOP/s')}, "
            f"{fmt_rate(c['bandwidth_bytes_per_s'], 'B/s')} measured {c['date']}"
        )
        t = Table(title=f"in situ, median of {point['steps']} steps (bytes: per step)")
        cols = (
            "kernel(s)",
            "ops",
            "median",
            "of step",
            "closed bytes",
            "compiled bytes",
            "achieved",
            "bound",
            "of bound",
            "",
        )
        for col in cols:
            t.add_column(col, justify="left" if col in ("kernel(s)", "") else "right")
        step = point["step"]
        marked = {}
        for r in [*point["rows"], step]:
            mark = (" *" if r.get("interpreted") else " †") if r.get("executed_as") else ""
            if mark:
                marked[f"{r['name']}{mark} runs as {r['executed_as']}"] = r.get("interpreted")
            t.add_row(
                r["name"] + mark,
                str(r.get("ops", "")),
                fmt_seconds(r["median_s"]),
                f"{100 * r['median_s'] / step['median_s']:.1f}%",
                fmt_rate(r["closed_bytes"], "B"),
                fmt_rate(r["compiled_bytes"], "B"),
                fmt_rate(r["achieved_bytes_per_s"] or 0, "B/s"),
                f"{fmt_seconds(r['bound_s'])} {r['bound'][:3]}",
                f"{100 * (r['fraction_of_bound'] or 0):.0f}%",
                "above the roof (see --json)" if r["above_roof"] else "",
            )
        con.print(t)
        for line in marked:
            con.print(f"  {line}")
        if any(marked.values()):
            con.print(
                "  * interpreted: Pallas has no CPU backend, so this time is the "
                "interpreter's, not the kernel's; time it on a GPU"
            )
        con.print(
            f"  coverage    kernels {fmt_seconds(sum(r['median_s'] for r in point['rows']))} of "
            f"the step's {fmt_seconds(step['median_s'])} wall time = "
            f"{100 * point['coverage']:.1f}% (the rest: dispatch and gaps between ops)"
        )
        con.print(f"  trace       {point['trace_dir']}")
    con.print("  " + OPEN_TRACE.format(dir=report["trace_root"]))
