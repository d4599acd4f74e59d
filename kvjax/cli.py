"""The `kvjax` command. Subcommands stay thin: the numbers come from importable functions."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvjax import analytic
from kvjax.analytic import PHASES, Workload
from kvjax.config import DTYPE_BYTES, ModelConfig, from_hf_config, get_model_config
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec, chip_from_numbers, get_chip
from kvjax.units import fmt_bytes, fmt_count, fmt_rate, fmt_seconds, sig

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
def _console():
    """A console that does not squeeze tables into 80 columns when piped or captured."""
    from rich.console import Console

    con = Console(highlight=False, soft_wrap=True)
    return con if con.is_terminal else Console(highlight=False, soft_wrap=True, width=200)


def _print_calc(report: dict[str, Any], variants: list[dict[str, Any]] | None) -> None:
    from rich.table import Table

    con = _console()
    m, wl, chip = report["model"], report["workload"], report["chip"]
    B, S = wl["batch"], wl["context"]
    con.print(
        f"[bold]{m['name']}[/bold] ({report['attention_variant']}, num_kv_heads={m['num_kv_heads']}"
        f" of {m['num_heads']}) | {wl['phase']} | B={B:,} | S={S:,} | chip {chip['name']}"
    )
    con.print(
        f"  params      {report['params']:,} ({fmt_count(report['params'])}); weights "
        f"{fmt_bytes(report['weight_bytes'])} = {fmt_rate(report['weight_bytes'], 'B')} "
        f"in {m['weight_dtype']}"
    )
    con.print(
        f"  KV cache    {fmt_bytes(report['kv_bytes_per_token'], 'KiB')} per token "
        f"({fmt_bytes(report['kv_bytes_per_token_per_layer'], 'KiB')} per layer) "
        f"in {m['kv_dtype']}; {fmt_bytes(report['kv_cache_bytes'])} at S={S:,} x B={B:,}; "
        f"for B={B:,} larger than the weights from S={report['kv_exceeds_weights_at_context']:,}"
    )
    con.print(
        f"  roofline    {fmt_rate(chip['peak_flops_per_s'], 'FLOP/s')} ({chip['compute_dtype']}), "
        f"{fmt_rate(chip['bandwidth_bytes_per_s'], 'B/s')}: ridge "
        f"{sig(report['ridge_flops_per_byte'])} FLOP/byte"
    )
    con.print(
        f"  decode      intensity {sig(report['decode_intensity'])} FLOP/byte (B={B}); attention "
        f"intensity {sig(report['attention_intensity'])} (h/h_kv = {m['num_heads']}/"
        f"{m['num_kv_heads']}), {sig(report['attention_kernel_intensity'])} with scores and "
        f"probabilities"
    )
    con.print(
        f"  {wl['phase']:<11} {fmt_count(report['step_flops'])}FLOP, "
        f"{fmt_rate(report['step_bytes'], 'B')}: intensity {sig(report['step_intensity'])}, "
        f"attainable {fmt_rate(report['attainable_flops_per_s'], 'FLOP/s')} = "
        f"{sig(100 * report['fraction_of_peak'])}% of peak"
    )
    floor = report["weight_floor_s_per_token"]
    con.print(
        f"  floors      weights only {fmt_seconds(floor)}/token ({sig(1 / floor)} tokens/s); "
        f"weights + KV {fmt_seconds(report['weights_kv_floor_s_per_token'])}; whole step bound "
        f"{fmt_seconds(report['step_floor_s'])} (unfused kernels: "
        f"{fmt_seconds(report['kernel_sum_bound_s'])})"
    )
    mem = chip["memory_bytes"]
    if mem is not None and report["weight_bytes"] > mem:
        con.print(
            f"  memory      the weights alone ({fmt_rate(report['weight_bytes'], 'B')}) exceed one "
            f"chip's {fmt_rate(mem, 'B')}: at least {math.ceil(report['weight_bytes'] / mem)} "
            f"chips are needed before any KV cache"
        )
    elif mem is not None:
        fits = "fits" if report["fits_in_memory"] else "does NOT fit"
        con.print(
            f"  memory      weights + KV cache {fits} in {fmt_rate(mem, 'B')}; at most "
            f"B={report['max_batch_at_context']:,} at S={S:,}, "
            f"or S={report['max_context_at_batch']:,} at B={B:,} (activations not counted)"
        )

    if variants:
        t = Table(title="KV cache by attention variant (sizes binary: KiB, GiB, TiB)")
        for col in ("variant", "h_kv", "per token"):
            t.add_column(col, justify="right")
        for c in variants[0]["cache"]:
            t.add_column(f"{c['context'] // 1024}k ctx x {c['batch']} seq", justify="right")
        for col in ("vs MHA", "params", "B=1 floor", "attn I"):
            t.add_column(col, justify="right")
        for row in variants:
            t.add_row(
                row["variant"],
                str(row["num_kv_heads"]),
                fmt_bytes(row["kv_bytes_per_token"], "KiB"),
                *(fmt_bytes(c["kv_cache_bytes"]) for c in row["cache"]),
                f"{sig(row['cache_reduction_vs_mha'])}x smaller"
                if row["cache_reduction_vs_mha"] != 1
                else "baseline",
                fmt_count(row["params"]),
                fmt_seconds(row["weight_floor_s_per_token"]),
                sig(row["attention_intensity"]),
            )
        con.print(t)

    t = Table(title=f"kernels of the {wl['phase']} step (summed over layers)")
    for col in ("kernel", "FLOPs", "bytes", "FLOP/byte", "bound", "side"):
        t.add_column(col, justify="left" if col in ("kernel", "side") else "right")
    for k in report["kernels"]:
        t.add_row(
            k["name"],
            fmt_count(k["flops"]) if k["flops"] else "0",
            fmt_rate(k["bytes"], "B"),
            sig(k["intensity"]) if k["flops"] else "0",
            fmt_seconds(k["bound_s"]),
            k["bound"],
        )
    con.print(t)


def cmd_calc(args: argparse.Namespace) -> int:
    from kvjax.report import calc_report, variants_table

    cfg = resolve_model(args)
    wl = resolve_workload(args)
    chip = resolve_chip(args, cfg)
    report = calc_report(cfg, wl, chip)
    variants = variants_table(cfg, chip) if args.variants else None
    if args.json:
        if variants is not None:
            report["variants"] = variants
        print(json.dumps(report, indent=2, default=_json_default))
    else:
        _print_calc(report, variants)
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
    with _progress(f"lowering {cfg.name} ({cfg.num_layers} layers, tracing {args.trace_layers})"):
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


class _progress:
    """A spinner on stderr while a large model lowers (silent when stderr is not a terminal)."""

    def __init__(self, message: str):
        from rich.console import Console

        self.console = Console(stderr=True)
        self.status = self.console.status(message) if self.console.is_terminal else None

    def __enter__(self):
        if self.status:
            self.status.__enter__()
        return self

    def __exit__(self, *exc):
        if self.status:
            self.status.__exit__(*exc)


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _print_trace(report: dict[str, Any]) -> None:
    from rich.table import Table

    con = _console()
    m, wl = report["model"], report["workload"]
    con.print(
        f"[bold]{m['name']}[/bold] num_kv_heads={m['num_kv_heads']} | {wl['phase']} | "
        f"B={wl['batch']:,} | S={wl['context']:,} | XLA {report['stage']} stage on "
        f"{report['backend']} ({report['layers_traced']} layer(s) traced) | chip "
        f"{report['chip']['name']} | traced in {report['trace_seconds']:.1f} s"
    )
    if report["kernels"]:
        t = Table(title="per kernel, summed over layers: closed form vs XLA (lowered stage)")
        for col in (
            "kernel",
            "closed FLOPs",
            "traced FLOPs",
            "ratio",
            "closed bytes",
            "traced bytes",
            "ratio",
            "FLOP/byte",
            "bound",
            "side",
            "note",
        ):
            t.add_column(col, justify="left" if col in ("kernel", "side", "note") else "right")
        for k in report["kernels"]:
            note = ""
            if k["explanation"] and (k["bytes_ratio"] is None or abs(k["bytes_ratio"] - 1) > 0.05):
                note = k["explanation"].split(":")[0]
            t.add_row(
                k["name"],
                fmt_count(k["closed_flops"]) if k["closed_flops"] else "0",
                fmt_count(k["traced_flops"]) if k["traced_flops"] else "0",
                _ratio(k["flops_ratio"]),
                fmt_rate(k["closed_bytes"], "B"),
                fmt_rate(k["traced_bytes"], "B"),
                _ratio(k["bytes_ratio"]),
                sig(k["intensity"]) if k["intensity"] is not None else "-",
                fmt_seconds(k["bound_s"]),
                k["bound"],
                note,
            )
        con.print(t)
    tot = report["total"]
    con.print(
        f"  step        FLOPs closed {fmt_count(tot['closed_flops'])} / traced "
        f"{fmt_count(tot['traced_flops'])} (x{tot['flops_ratio']:.4f}); bytes closed "
        f"{fmt_rate(tot['closed_bytes'], 'B')} / traced {fmt_rate(tot['traced_bytes'], 'B')} "
        f"(x{tot['bytes_ratio']:.3f}); traced intensity {sig(tot['intensity'])} FLOP/byte; "
        f"bound {fmt_seconds(tot['bound_s'])} (closed form {fmt_seconds(tot['closed_bound_s'])})"
    )
    xla = report["xla_module"]
    if xla:
        con.print(
            f"  XLA module  flops {fmt_count(xla.get('flops', 0))}, bytes accessed "
            f"{fmt_rate(xla.get('bytes accessed', 0), 'B')} "
            f"({report['stage']}; the kernels sum to it)"
        )
    op = report["roofline_opinion"]
    if op:
        if "error" in op:
            con.print(f"  jax.experimental.roofline: no opinion ({op['error']})")
        else:
            con.print(
                f"  jax.experimental.roofline: {fmt_count(op['flops'])}FLOP unfused, "
                f"{fmt_rate(op['unfused_hbm_bytes'], 'B')} unfused HBM bytes"
            )
    for note in report["notes"]:
        con.print(f"  note: {note}")


def cmd_trace(args: argparse.Namespace) -> int:
    report = trace_report(args)
    if args.json:
        print(json.dumps(report, indent=2, default=_json_default))
    else:
        _print_trace(report)
    return 0


# ---------------------------------------------------------------------------------------------
# kvjax ceilings / kvjax bench
# ---------------------------------------------------------------------------------------------
def cmd_ceilings(args: argparse.Namespace) -> int:
    from kvjax.timing import ceilings_cache_path, load_or_measure_ceilings

    with _progress("measuring matmul and bandwidth ceilings"):
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
    with _progress("measuring ceilings (cached per device)"):
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


def _print_bench(report: dict[str, Any]) -> None:
    from rich.table import Table

    con = _console()
    c, wl = report["ceilings"], report["workload"]
    con.print(
        f"[bold]{report['model']['name']}[/bold] | {wl['phase']} | B={wl['batch']:,} | "
        f"S={wl['context']:,} | {report['device']}: {fmt_rate(c['peak_flops_per_s'], 'FLOP/s')}, "
        f"{fmt_rate(c['bandwidth_bytes_per_s'], 'B/s')} measured {c['date']}"
    )
    t = Table(title="measured kernels (one layer each; step = the whole decode step)")
    cols = (
        "h_kv",
        "kernel",
        "bound",
        "closed bytes",
        "traced bytes",
        "median",
        "IQR",
        "achieved",
        "of bound",
    )
    for col in cols:
        t.add_column(col, justify="left" if col == "kernel" else "right")
    for p in report["points"]:
        t.add_row(
            str(p["num_kv_heads"]),
            p["kernel"],
            f"{fmt_seconds(p['bound_s'])} {p['bound'][:3]}",
            fmt_rate(p["closed_bytes"], "B"),
            fmt_rate(p["traced_bytes"], "B") if p.get("traced_bytes") else "-",
            fmt_seconds(p["median_s"]),
            fmt_seconds(p["iqr_s"]) if p["iqr_s"] > 0 else "0",
            fmt_rate(p["achieved_bytes_per_s"], "B/s"),
            f"{100 * p['fraction_of_bound']:.0f}%",
        )
    con.print(t)


def cmd_bench(args: argparse.Namespace) -> int:
    report = bench_report(args)
    if args.json:
        print(json.dumps(report, indent=2, default=_json_default))
    else:
        _print_bench(report)
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
        default="lowered",
        help="lowered: pre-optimization, per kernel (default); compiled: after fusion, totals",
    )
    trace.add_argument(
        "--trace-layers",
        choices=("all", "one"),
        default="all",
        help="trace every layer (default) or one layer times num_layers (identical layers)",
    )
    trace.add_argument("--roofline", action="store_true", help="add jax.experimental.roofline")
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KvjaxError as exc:
        print(f"kvjax {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
