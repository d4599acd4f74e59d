"""Arguments every `kvjax` subcommand shares: types whose failures name the flag, the model /
workload / chip option groups and their resolution, and `--json` output."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from kvjax.analytic import PHASES, Workload
from kvjax.config import DTYPE_BYTES, ModelConfig, canonical_dtype, get_model_config
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec, chip_from_numbers, get_chip
from kvjax.hf_config import from_hf_config

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


def int_list(text: str) -> list[int]:
    """A comma-separated list of positive integers: 1,2,4,8."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of integers, e.g. 1,2,4,8"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} must list positive integers, e.g. 1,2,4,8")
    return values


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
                "--kv-heads", dest=flag, type=int_list, help="num_kv_heads to sweep: 1,2,4,8"
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
    dtype = cfg.compute_dtype
    if args.chip is None and args.peak_flops is not None and args.bandwidth is not None:
        return chip_from_numbers(args.peak_flops, args.bandwidth, args.memory, dtype=dtype)
    chip = get_chip(args.chip or DEFAULT_CHIP)
    return chip.with_overrides(args.peak_flops, args.bandwidth, args.memory, dtype=dtype)


def json_default(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    raise TypeError(f"cannot serialise {type(x).__name__}")


def finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def emit(args: argparse.Namespace, report: dict[str, Any], render) -> int:
    """`--json` prints the report as one object; otherwise it is rendered as tables."""
    if args.json:
        print(json.dumps(report, indent=2, default=json_default))
    else:
        render(report)
    return 0
