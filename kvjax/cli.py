"""The `kvjax` command. Subcommands stay thin: the numbers come from importable functions."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvjax import analytic, views
from kvjax.analytic import PHASES, Workload
from kvjax.config import DTYPE_BYTES, ModelConfig, from_hf_config, get_model_config
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec, chip_from_numbers, get_chip
from kvjax.units import fmt_rate, sig

DEFAULT_MODEL = "seed-70b"
DEFAULT_CHIP = "h100-sxm"
_SUFFIXES = {"k": 2**10, "m": 2**20}


# ---------------------------------------------------------------------------------------------
# Argument types: each failure is one line naming the flag (argparse adds "argument --flag:").
# ---------------------------------------------------------------------------------------------
def positive_int(text: str) -> int:
    """An integer > 0; '8k' = 8192 and '1m' = 1048576 (binary, as context lengths are quoted)."""
    raw = text.strip().lower().replace("_", "")
    scale = 1
    if raw and raw[-1] in _SUFFIXES:
        raw, scale = raw[:-1], _SUFFIXES[raw[-1]]
    try:
        value = int(raw) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a positive integer (e.g. 8192 or 8k)"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer (> 0)")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 3.35e12)") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def dtype_name(text: str) -> str:
    from kvjax.config import canonical_dtype

    try:
        return canonical_dtype(text)
    except KvjaxError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a dtype; allowed: {', '.join(DTYPE_BYTES)}"
        ) from None


# ---------------------------------------------------------------------------------------------
# Shared option groups (calc, trace, bench, ... take the same model / workload / chip options).
# ---------------------------------------------------------------------------------------------
_SIZE_FLAGS = {
    "layers": "num_layers",
    "d_model": "d_model",
    "heads": "num_heads",
    "kv_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "d_ff": "d_ff",
    "vocab": "vocab_size",
}


def add_model_args(parser: argparse.ArgumentParser, kv_heads_sweep: bool = False) -> None:
    """Model options; with `kv_heads_sweep`, --kv-heads takes a list (1,2,4,8) to sweep."""
    g = parser.add_argument_group("model")
    g.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"preset name or path to a Hugging Face config.json (default {DEFAULT_MODEL})",
    )
    for flag, field in _SIZE_FLAGS.items():
        if flag == "kv_heads" and kv_heads_sweep:
            g.add_argument(
                "--kv-heads", dest=flag, type=_kv_heads_list, help="num_kv_heads to sweep: 1,2,4,8"
            )
            continue
        g.add_argument(
            f"--{flag.replace('_', '-')}", dest=flag, type=positive_int, help=f"override {field}"
        )
    g.add_argument("--weight-dtype", type=dtype_name, help="override the weight dtype")
    g.add_argument("--kv-dtype", type=dtype_name, help="override the KV-cache dtype")


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("workload")
    g.add_argument("--batch", type=positive_int, default=1, help="B sequences (default 1)")
    g.add_argument(
        "--context",
        type=positive_int,
        default=8192,
        help="S positions, e.g. 8192 or 8k (default 8k)",
    )
    g.add_argument("--phase", choices=PHASES, default="decode")


def add_chip_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("chip")
    g.add_argument("--chip", default=None, help=f"chip preset (default {DEFAULT_CHIP})")
    g.add_argument("--peak-flops", type=positive_float, help="peak FLOP/s for the compute dtype")
    g.add_argument("--bandwidth", type=positive_float, help="memory bandwidth in bytes/s")
    g.add_argument("--memory", type=positive_float, help="memory capacity in bytes")


def resolve_model(args: argparse.Namespace) -> ModelConfig:
    name = args.model
    path = Path(name)
    if path.suffix == ".json" or path.is_dir() or path.exists() or "/" in name:
        cfg = from_hf_config(path)
    else:
        cfg = get_model_config(name)
    changes: dict[str, Any] = {
        field: getattr(args, flag)
        for flag, field in _SIZE_FLAGS.items()
        if getattr(args, flag, None) is not None
    }
    if isinstance(changes.get("num_kv_heads"), list):  # a sweep: the first value is the base
        changes["num_kv_heads"] = changes["num_kv_heads"][0]
    if getattr(args, "weight_dtype", None):
        changes["weight_dtype"] = args.weight_dtype
    if getattr(args, "kv_dtype", None):
        changes["kv_dtype"] = args.kv_dtype
    return cfg.replace(**changes) if changes else cfg


def resolve_workload(args: argparse.Namespace) -> Workload:
    return Workload(args.phase, args.batch, args.context)


def resolve_chip(args: argparse.Namespace, cfg: ModelConfig) -> ChipSpec:
    dtype = analytic.compute_dtype(cfg)
    if args.chip is None and args.peak_flops is not None and args.bandwidth is not None:
        return chip_from_numbers(args.peak_flops, args.bandwidth, args.memory, dtype=dtype)
    chip = get_chip(args.chip or DEFAULT_CHIP)
    return chip.with_overrides(args.peak_flops, args.bandwidth, args.memory, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# kvjax calc
# ---------------------------------------------------------------------------------------------
def cmd_calc(args: argparse.Namespace) -> int:
    from kvjax.report import calc_report, variants_table

    cfg = resolve_model(args)
    wl = resolve_workload(args)
    chip = resolve_chip(args, cfg)
    report = calc_report(cfg, wl, chip)
    variants = variants_table(cfg, chip) if args.variants else None
    tp_points = None
    if args.link_latency and not args.tp:
        raise KvjaxError("--link-latency applies to the --tp link term; add --tp")
    if not math.isfinite(args.link_latency) or args.link_latency < 0:
        raise KvjaxError(f"--link-latency {args.link_latency} must be >= 0 seconds")
    if args.tp:
        from kvjax.parallel import device_config, tensor_parallel_point

        tp_points = []
        for t in args.tp:
            point = tensor_parallel_point(cfg, t, wl, chip, args.link_latency).to_dict()
            kernels = analytic.step_kernels(device_config(cfg, t), wl)  # one device's share
            point["kernels_per_device"] = [
                {"name": n, "flops": k.flops, "bytes": k.bytes} for n, k in kernels.items()
            ]
            tp_points.append(point)
        first = tp_points[0]
        report["tp"] = first["tp"]
        report["weight_bytes_per_device"] = first["weight_bytes_per_device"]
        report["kv_cache_bytes_per_device"] = first["kv_cache_bytes_per_device"]
        report["collective_bytes_per_token"] = first["collective_bytes_per_step"]
        report["tensor_parallel"] = tp_points
    if args.json:
        if variants is not None:
            report["variants"] = variants
        print(json.dumps(report, indent=2, default=_json_default))
    else:
        views.print_calc(report, variants)
        if tp_points:
            views.print_tensor_parallel(report, tp_points)
    return 0


def _json_default(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    raise TypeError(f"cannot serialise {type(x).__name__}")


# ---------------------------------------------------------------------------------------------
# kvjax trace
# ---------------------------------------------------------------------------------------------
def trace_report(args: argparse.Namespace) -> dict[str, Any]:
    """The traced view beside the closed form, as the JSON `kvjax trace --json` prints."""
    import time

    from kvjax import roofline
    from kvjax.cost import compare, trace_step

    cfg, wl = resolve_model(args), resolve_workload(args)
    chip = resolve_chip(args, cfg)
    peak, bw = chip.peak(analytic.compute_dtype(cfg)), chip.bandwidth_bytes_per_s
    t0 = time.perf_counter()
    with views.progress(
        f"lowering {cfg.name} ({cfg.num_layers} layers, tracing {args.trace_layers})"
    ):
        trace = trace_step(
            cfg,
            wl.phase,
            wl.batch,
            wl.context,
            stage=args.stage,
            layers=args.trace_layers,
            roofline=args.roofline,
        )
    closed = analytic.step_cost(cfg, wl)
    kernels = []
    if trace.stage == "lowered":
        for r in compare(trace):
            kernels.append(
                {
                    "name": r.name,
                    "closed_flops": r.closed_flops,
                    "traced_flops": r.traced_flops,
                    "flops_ratio": _finite(r.flops_ratio),
                    "closed_bytes": r.closed_bytes,
                    "traced_bytes": r.traced_bytes,
                    "bytes_ratio": _finite(r.bytes_ratio),
                    "closed_transcendentals": r.closed_transcendentals,
                    "traced_transcendentals": r.traced_transcendentals,
                    "intensity": _finite(roofline.intensity(r.traced_flops, r.traced_bytes)),
                    "bound_s": roofline.bound_time_s(r.traced_flops, r.traced_bytes, peak, bw),
                    "bound": roofline.bound_side(r.traced_flops, r.traced_bytes, peak, bw),
                    "explanation": r.explanation,
                }
            )
    return {
        "model": cfg.to_dict(),
        "workload": {"phase": wl.phase, "batch": wl.batch, "context": wl.context},
        "chip": {"name": chip.name, "peak_flops_per_s": peak, "bandwidth_bytes_per_s": bw},
        "stage": trace.stage,
        "backend": trace.backend,
        "layers_traced": trace.layers_traced,
        "kernels": kernels,
        "total": {
            "closed_flops": closed.flops,
            "traced_flops": trace.total.flops,
            "flops_ratio": trace.total.flops / closed.flops,
            "closed_bytes": closed.bytes,
            "traced_bytes": trace.total.bytes,
            "bytes_ratio": trace.total.bytes / closed.bytes,
            "traced_transcendentals": trace.total.transcendentals,
            "intensity": roofline.intensity(trace.total.flops, trace.total.bytes),
            "bound_s": roofline.bound_time_s(trace.total.flops, trace.total.bytes, peak, bw),
            "closed_bound_s": roofline.bound_time_s(closed.flops, closed.bytes, peak, bw),
        },
        "xla_module": {
            k: v
            for k, v in trace.xla.items()
            if k in ("flops", "bytes accessed", "transcendentals")
        },
        "roofline_opinion": trace.roofline,
        "notes": trace.notes,
        "trace_seconds": trace.trace_seconds,
        "command_seconds": time.perf_counter() - t0,
    }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _emit(args: argparse.Namespace, report: dict[str, Any], render) -> int:
    """`--json` prints the report as one object; otherwise it is rendered as tables."""
    if args.json:
        print(json.dumps(report, indent=2, default=_json_default))
    else:
        render(report)
    return 0


def sharded_trace_report(args: argparse.Namespace) -> dict[str, Any]:
    """`kvjax trace --tp N`: the compiled per-device step and its collectives vs closed form."""
    from kvjax.parallel import tensor_parallel_point
    from kvjax.sharded_cost import trace_sharded_step

    cfg, wl = resolve_model(args), resolve_workload(args)
    chip = resolve_chip(args, cfg)
    if wl.batch % args.dp:
        raise KvjaxError(f"--batch {wl.batch} is not divisible by --dp {args.dp}")
    with views.progress(
        f"compiling {cfg.name} on {args.tp * args.dp} devices (tp={args.tp}, dp={args.dp})"
    ):
        t = trace_sharded_step(
            cfg, wl.phase, wl.batch, wl.context, args.tp, args.dp, layers=args.trace_layers
        )
    wl_device = Workload(wl.phase, wl.batch // args.dp, wl.context)
    closed = tensor_parallel_point(cfg, args.tp, wl_device, chip).to_dict()
    peak, bw = chip.peak(analytic.compute_dtype(cfg)), chip.bandwidth_bytes_per_s
    link = chip.interconnect_bytes_per_s
    traced_floor = max(t.flops_per_device / peak, t.bytes_per_device / bw)
    report = t.to_dict()
    report.update(
        chip={
            "name": chip.name,
            "peak_flops_per_s": peak,
            "bandwidth_bytes_per_s": bw,
            "interconnect_bytes_per_s": link,
        },  # fmt: skip
        closed_form=closed,
        flops_ratio=t.flops_per_device / t.closed_flops_per_device,
        bytes_ratio=t.bytes_per_device / t.closed_bytes_per_device,
        collective_ratio=(
            t.collective_bytes / t.closed_collective_bytes if t.closed_collective_bytes else None
        ),
        # XLA:CPU widens bf16 products and all-reduces to f32: its compiled costs of a bf16
        # model are not the chip's, so no traced floor is derived from them
        comparable=t.backend != "cpu" or analytic.compute_dtype(cfg) == "f32",
        traced_floor_s=traced_floor,
        traced_link_s=(t.collective_bytes / link) if link else None,
    )
    return report


def cmd_trace(args: argparse.Namespace) -> int:
    sharded = args.tp > 1 or args.dp > 1
    if sharded:
        if args.stage == "lowered":
            raise KvjaxError(
                "--tp/--dp trace the compiled module (the lowered module of a sharded program "
                "is the global one); drop --stage or pass --stage compiled"
            )
        if args.roofline:
            raise KvjaxError("--roofline is for the single-device trace; drop it with --tp/--dp")
        from kvjax.devices import request_host_devices

        request_host_devices(args.tp * args.dp)
        return _emit(args, sharded_trace_report(args), views.print_sharded_trace)
    args.stage = args.stage or "lowered"
    return _emit(args, trace_report(args), views.print_trace)


# ---------------------------------------------------------------------------------------------
# kvjax ceilings / kvjax bench
# ---------------------------------------------------------------------------------------------
def cmd_ceilings(args: argparse.Namespace) -> int:
    from kvjax.timing import ceilings_cache_path, load_or_measure_ceilings

    with views.progress("measuring matmul and bandwidth ceilings"):
        spec = load_or_measure_ceilings(refresh=args.refresh, quick=args.quick)
    if args.json:
        print(json.dumps(spec.to_dict(), indent=2, default=_json_default))
        return 0
    print(f"{spec.name} ({spec.date}; cached in {ceilings_cache_path()})")
    for dtype, peak in spec.peak_flops_per_s.items():
        print(f"  matmul {dtype:<5} {fmt_rate(peak, 'FLOP/s')}")
    print(f"  read bandwidth    {fmt_rate(spec.bandwidth_bytes_per_s, 'B/s')}")
    update = spec.extra.get("update_bandwidth_bytes_per_s")
    if update:
        print(f"  update bandwidth  {fmt_rate(update, 'B/s')} (read + write, donated in place)")
    print(f"  ridge (f32)       {sig(spec.ridge('f32'))} FLOP/byte")
    return 0


def _kv_heads_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of integers, e.g. 1,2,4,8"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} must list positive integers, e.g. 1,2,4,8")
    return values


def bench_report(args: argparse.Namespace) -> dict[str, Any]:
    from rich.progress import Progress

    from kvjax.bench import bench_point
    from kvjax.timing import device_name, load_or_measure_ceilings

    base, wl = resolve_model(args), resolve_workload(args)
    kv_heads = args.kv_heads or [base.num_kv_heads]
    cfgs = [base.replace(num_kv_heads=k) for k in kv_heads]  # validated before any timing
    chip = resolve_chip(args, base) if (args.chip or args.peak_flops or args.bandwidth) else None
    with views.progress("measuring ceilings (cached per device)"):
        ceilings = load_or_measure_ceilings(refresh=args.refresh_ceilings)
    kernels = args.kernels.split(",") if args.kernels else None
    points: list[dict[str, Any]] = []
    with Progress(transient=True, disable=args.json) as progress:
        task = progress.add_task("timing", total=len(cfgs))
        for cfg in cfgs:
            points += bench_point(
                cfg,
                wl,
                ceilings,
                kernels=kernels,
                include_step=not args.no_step,
                budget_s=args.budget_s,
                chip=chip,
            )
            progress.advance(task)
    return {
        "device": device_name(),
        "model": base.to_dict(),
        "workload": {"phase": wl.phase, "batch": wl.batch, "context": wl.context},
        "ceilings": {
            "peak_flops_per_s": ceilings.peak(analytic.compute_dtype(base)),
            "bandwidth_bytes_per_s": ceilings.bandwidth_bytes_per_s,
            "date": ceilings.date,
            "all": ceilings.to_dict(),
        },
        "chip": None if chip is None else chip.name,
        "points": points,
    }


def cmd_bench(args: argparse.Namespace) -> int:
    return _emit(args, bench_report(args), views.print_bench)


def cmd_run(args: argparse.Namespace) -> int:
    from kvjax.launcher import run_config

    for run in run_config(args.config, args.overrides, args.runs, args.run_id, progress=True):
        print(f"{run.path}: {len(run.records())} records")
    print(f"figures: python3 -m kvjax figures --runs {args.runs}")
    return 0


def cmd_figures(args: argparse.Namespace) -> int:
    from kvjax.explorer import write_explorer
    from kvjax.plotting import make_figures
    from kvjax.records import load_records

    written = make_figures(load_records(args.runs), args.out)
    written.append(write_explorer(Path(args.out) / "explorer.html"))
    for path in written:
        print(path)
    return 0


def cmd_explore(args: argparse.Namespace) -> int:
    from kvjax.explorer import write_explorer

    path = write_explorer(args.out, model=args.model, chip=args.chip)
    print(f"wrote {path} (open it in a browser; it needs no server and no network)")
    return 0


# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvjax",
        description="Why transformer decoding is slow: closed forms, traces and measurements.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    calc = sub.add_parser(
        "calc",
        help="closed-form sizes, intensities and floors for a model, workload and chip",
        description="Closed forms of the seed text for any model, num_kv_heads, workload and chip.",
    )
    add_model_args(calc)
    add_workload_args(calc)
    add_chip_args(calc)
    calc.add_argument("--variants", action="store_true", help="add the MHA/GQA/MQA table")
    calc.add_argument(
        "--tp", type=_kv_heads_list, help="tensor-parallel degree(s), e.g. 8 or 1,2,4,8"
    )
    calc.add_argument(
        "--link-latency",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="per-message link latency added to the --tp link term (ring: 2(tp-1) messages per "
        "all-reduce); default 0 = bandwidth only",
    )
    calc.add_argument("--json", action="store_true", help="print one JSON object")
    calc.set_defaults(func=cmd_calc)

    trace = sub.add_parser(
        "trace",
        help="XLA's cost analysis of the real Flax model, per kernel, beside the closed form",
        description="Trace one step of the Flax model from abstract shapes (no weights allocated) "
        "and compare XLA's per-kernel FLOPs and bytes with the closed form.",
    )
    add_model_args(trace)
    add_workload_args(trace)
    add_chip_args(trace)
    trace.add_argument(
        "--stage",
        choices=("lowered", "compiled"),
        default=None,
        help="lowered: pre-optimization, per kernel (default); compiled: after fusion, totals "
        "(the only stage with --tp/--dp)",
    )
    trace.add_argument(
        "--trace-layers",
        choices=("all", "one"),
        default="all",
        help="trace every layer (default) or one layer times num_layers (identical layers)",
    )
    trace.add_argument("--roofline", action="store_true", help="add jax.experimental.roofline")
    trace.add_argument(
        "--tp",
        type=positive_int,
        default=1,
        help="tensor-parallel degree: trace the sharded program per device, with its "
        "collectives (on a CPU, tp x dp simulated devices)",
    )
    trace.add_argument("--dp", type=positive_int, default=1, help="data-parallel degree")
    trace.add_argument("--json", action="store_true", help="print one JSON object")
    trace.set_defaults(func=cmd_trace)

    ceilings = sub.add_parser(
        "ceilings",
        help="measured matmul FLOP/s and memory bandwidth of this device (cached)",
        description="Measure (or read from the per-device cache) the roofline of this device.",
    )
    ceilings.add_argument("--refresh", action="store_true", help="measure again")
    ceilings.add_argument("--quick", action="store_true", help="small sizes (tests)")
    ceilings.add_argument("--json", action="store_true")
    ceilings.set_defaults(func=cmd_ceilings)

    bench = sub.add_parser(
        "bench",
        help="time the traced kernels and the decode step on this device, against its roofline",
        description="Time each kernel of one layer (jitted alone, random inputs rotated past the "
        "cache) and the whole decode step, against the measured ceilings of this device.",
    )
    add_model_args(bench, kv_heads_sweep=True)
    add_workload_args(bench)
    add_chip_args(bench)
    bench.add_argument(
        "--kv-heads-sweep",
        dest="kv_heads",
        type=_kv_heads_list,
        help="sweep num_kv_heads, e.g. 1,2,4,8,32",
    )
    bench.add_argument("--kernels", help="comma-separated kernel names (default: all), or step")
    bench.add_argument("--no-step", action="store_true", help="skip the whole decode step")
    bench.add_argument("--budget-s", type=positive_float, default=1.0, help="seconds per kernel")
    bench.add_argument("--refresh-ceilings", action="store_true")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(func=cmd_bench)

    run = sub.add_parser("run", help="run (or resume) an experiment config's points")
    run.add_argument(
        "config",
        nargs="?",
        default="configs/default.yaml",
        help="an experiment config or a suite (default configs/default.yaml)",
    )
    run.add_argument(
        "overrides", nargs="*", help="key=value, e.g. model.num_kv_heads=4 (before any --option)"
    )
    run.add_argument("--runs", default="runs", help="the runs folder (default runs/)")
    run.add_argument("--run-id", help="default: a hash of the resolved config (reruns resume)")
    run.set_defaults(func=cmd_run)

    figures = sub.add_parser("figures", help="regenerate paper_figures/ from the records")
    figures.add_argument("--runs", default="runs")
    figures.add_argument("--out", default="paper_figures")
    figures.set_defaults(func=cmd_figures)

    explore = sub.add_parser(
        "explore",
        help="write the interactive B / S / num_kv_heads explorer as one offline HTML file",
    )
    explore.add_argument("--model", default=DEFAULT_MODEL, help="initial model preset")
    explore.add_argument("--chip", default=DEFAULT_CHIP, help="initial chip preset")
    explore.add_argument("--out", default="explorer.html", help="the .html file to write")
    explore.set_defaults(func=cmd_explore)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BrokenPipeError:  # `kvjax ... | head`: the reader left; nothing more to say
        sys.stderr.close()
        return 0
    except KvjaxError as exc:
        print(f"kvjax {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
