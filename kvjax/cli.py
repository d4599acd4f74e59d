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


def add_model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"preset name or path to a Hugging Face config.json (default {DEFAULT_MODEL})",
    )
    for flag, field in _SIZE_FLAGS.items():
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
def _print_calc(report: dict[str, Any], variants: list[dict[str, Any]] | None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(highlight=False, soft_wrap=True)
    if not con.is_terminal:  # piped or captured: do not squeeze tables into 80 columns
        con = Console(highlight=False, soft_wrap=True, width=160)
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
