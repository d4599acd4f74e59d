"""`kvjax ceilings` (this device's measured roofline) and `kvjax bench` (kernels timed alone and
the decode step, on that roofline)."""

from __future__ import annotations

import argparse
from typing import Any

from kvjax.cli import render
from kvjax.cli.arg_types import positive_float
from kvjax.cli.args import (
    add_chip_args,
    add_model_args,
    add_workload_args,
    dequantized_experts,
    dumps,
    emit,
    resolve_chip,
    resolve_model,
    resolve_workload,
)
from kvjax.cli.calc_report import workload_report
from kvjax.units import fmt_rate, sig


def add_parsers(sub) -> None:
    ceilings = sub.add_parser(
        "ceilings",
        help="measured matmul FLOP/s and memory bandwidth of this device (cached)",
        description="Measure (or read from the per-device cache) the roofline of this device.",
    )
    ceilings.add_argument("--refresh", action="store_true", help="measure again")
    ceilings.add_argument("--quick", action="store_true", help="small sizes (tests)")
    ceilings.add_argument("--json", action="store_true")
    ceilings.set_defaults(func=run_ceilings)

    bench = sub.add_parser(
        "bench",
        help="time the traced kernels and the decode step on this device, against its roofline",
        description="Time each kernel of one layer (jitted alone, random inputs rotated past the "
        "cache) and the whole decode step, against the measured ceilings of this device.",
    )
    add_model_args(bench, kv_heads_sweep=True)
    add_workload_args(bench, extend=True)
    add_chip_args(bench)
    bench.add_argument("--kernels", help="comma-separated kernel names (default: all), or step")
    bench.add_argument("--no-step", action="store_true", help="skip the whole decode step")
    bench.add_argument("--budget-s", type=positive_float, default=1.0, help="seconds per kernel")
    bench.add_argument("--refresh-ceilings", action="store_true")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    return emit(args, bench_report(args), render.print_bench)


def run_ceilings(args: argparse.Namespace) -> int:
    from kvjax.measured.ceilings import ceilings_cache_path, load_or_measure_ceilings

    with render.progress("measuring matmul and bandwidth ceilings"):
        spec = load_or_measure_ceilings(refresh=args.refresh, quick=args.quick)
    if args.json:
        print(dumps(spec.to_dict()))
        return 0
    print(f"{spec.name} ({spec.date}; cached in {ceilings_cache_path()})")
    for dtype, peak in spec.peak_flops_per_s.items():
        print(f"  matmul {dtype:<5}      {fmt_rate(peak, 'FLOP/s')}")
    print(
        f"  bandwidth         {fmt_rate(spec.bandwidth_bytes_per_s, 'B/s')} (best read: read, gemv)"
    )
    for name, trials in spec.extra.get("bandwidth_trials_bytes_per_s", {}).items():
        spread = ", ".join(fmt_rate(r, "B/s") for r in trials)
        kind = "read + write, in place" if name in ("copy", "triad") else "read"
        print(f"    {name:<7} {kind:<22} best {fmt_rate(max(trials), 'B/s')} (trials: {spread})")
    print(f"  ridge (f32)       {sig(spec.ridge('f32'))} FLOP/byte")
    return 0


def bench_report(args: argparse.Namespace) -> dict[str, Any]:
    from rich.progress import Progress

    from kvjax.measured.bench import bench_point, check_bench_fits
    from kvjax.measured.ceilings import load_or_measure_ceilings
    from kvjax.measured.timing import device_name

    base, wl = resolve_model(args), resolve_workload(args)
    base = dequantized_experts(base)  # gpt-oss's MXFP4 experts: timed as the model runs them
    kv_heads = args.kv_heads or [base.num_kv_heads]
    cfgs = [base.replace(num_kv_heads=k) for k in kv_heads]  # validated before any timing
    chip = resolve_chip(args, base) if (args.chip or args.peak_flops or args.bandwidth) else None
    for cfg in cfgs:  # refused before the ceilings or any kernel allocate anything
        check_bench_fits(cfg, wl, not args.no_step)
    with render.progress("measuring ceilings (cached per device)"):
        ceilings = load_or_measure_ceilings(refresh=args.refresh_ceilings)
    names = args.kernels.split(",") if args.kernels else None
    points: list[dict[str, Any]] = []
    with Progress(transient=True, disable=args.json) as progress:
        task = progress.add_task("timing", total=len(cfgs))
        for cfg in cfgs:
            points += bench_point(
                cfg,
                wl,
                ceilings,
                names=names,
                include_step=not args.no_step,
                budget_s=args.budget_s,
                chip=chip,
            )
            progress.advance(task)
    return {
        "device": device_name(),
        "model": base.to_dict(),
        "workload": workload_report(wl),
        "ceilings": {
            "peak_flops_per_s": ceilings.peak(base.compute_dtype),
            "bandwidth_bytes_per_s": ceilings.bandwidth_bytes_per_s,
            "date": ceilings.date,
            "all": ceilings.to_dict(),
        },
        "chip": None if chip is None else chip.name,
        "points": points,
    }
