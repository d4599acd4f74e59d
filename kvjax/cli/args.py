"""Arguments every `kvjax` subcommand shares: the model / workload / chip / serving option
groups and their resolution, and `--json` output (the flags' value types: `arg_types`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from kvjax.analytic import PHASES, Workload
from kvjax.analytic.costs import EXTEND
from kvjax.cli.arg_types import (
    dtype_name,
    fraction,
    in_range,
    int_list,
    kv_dtype_name,
    matmul_dtype_name,
    positive_int,
)
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec, chip_from_numbers, get_chip
from kvjax.model.config import KV_SCALES, MLA_FORMS, ModelConfig, get_model_config
from kvjax.model.hf import from_hf_config

DEFAULT_MODEL = "seed-70b"
DEFAULT_CHIP = "h100-sxm"


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
# Multi-head latent attention's widths (ModelConfig validates them, naming the field).
_MLA_FLAGS = {
    "kv_lora_rank": "kv_lora_rank",
    "q_lora_rank": "q_lora_rank",
    "rope_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
}


def add_model_args(parser: argparse.ArgumentParser, kv_heads_sweep: bool = False) -> None:
    """Model options; with `kv_heads_sweep`, --kv-heads takes a list (1,2,4,8) to sweep."""
    g = parser.add_argument_group("model")
    g.add_argument(
        "--model",
        default=None,
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
    for flag, field in _MLA_FLAGS.items():
        g.add_argument(
            f"--{flag.replace('_', '-')}",
            dest=flag,
            type=int,
            help=f"override {field} (MLA; 0 = off)",
        )
    g.add_argument("--mla-decode", choices=MLA_FORMS, help="MLA decode form (default absorbed)")
    g.add_argument("--sliding-window", type=int, help="override sliding_window (0 = none)")
    g.add_argument(
        "--sink-tokens",
        type=int,
        metavar="S",
        help="sliding layers keep the first S tokens beside their window (StreamingLLM)",
    )
    g.add_argument(
        "--kv-budget",
        type=positive_int,
        metavar="N",
        help="evict to N positions a layer: every layer sliding over N - S recent "
        "tokens beside the --sink-tokens S (default 0)",
    )
    g.add_argument(
        "--kv-scales",
        choices=KV_SCALES,
        help="a quantized cache's scales (auto: per token per head for int8, per tensor for fp8, "
        "per group for int4/int2)",
    )
    g.add_argument(
        "--kv-group-size", type=int, help="int4/int2: elements per f16 scale + zero (default 32)"
    )
    g.add_argument(
        "--layer-pattern", help="override layer_pattern: G global / L sliding, tiled (L, LG, ...)"
    )
    g.add_argument("--weight-dtype", type=dtype_name, help="override the weight dtype")
    g.add_argument(
        "--compute-dtype",
        type=matmul_dtype_name,
        dest="matmul_dtype",
        help="the matmuls' input dtype, whose peak they run at (fp8: TensorRT-LLM's "
        "FP8 engines, fp4: NVFP4; default bf16 for int8/fp8 weights)",
    )
    g.add_argument(
        "--attention-kernel",
        choices=("xla", "flash"),
        help="xla: scores, softmax and av as XLA runs the einsums (default); flash: one fused "
        "kernel (FlashAttention-2 prefill, flash-decoding), tiled for the chip",
    )
    g.add_argument(
        "--kv-dtype",
        type=kv_dtype_name,
        help="override the KV-cache dtype (int4/int2: KIVI-style packed, closed form only)",
    )


def add_workload_args(parser: argparse.ArgumentParser, extend: bool = False) -> None:
    """--batch, --context, --phase; `extend`: the phase 'extend' and its --new-tokens too."""
    g = parser.add_argument_group("workload")
    g.add_argument("--batch", type=positive_int, default=1, help="B sequences (default 1)")
    g.add_argument(
        "--context",
        type=positive_int,
        default=8192,
        help="S positions, e.g. 8192 or 8k (default 8k)",
    )
    g.add_argument("--phase", choices=(*PHASES, EXTEND) if extend else PHASES, default="decode")
    if extend:
        g.add_argument(
            "--new-tokens",
            type=positive_int,
            default=None,
            metavar="T",
            help="with --phase extend: T new tokens on context - T cached",
        )


def _page_default(page_size: int | None) -> str:
    return "the --engine's, else 16" if page_size is None else str(page_size or "unpaged")


def add_serving_args(
    parser, page_size: int | None = 0, speculative: bool = True, draft: bool = True
) -> None:
    """The serving flags, defined once: --page-size (default `page_size`: 0, an unpaged cache
    as the closed form sizes it; an engine's 16, vLLM's default block; None: resolved by the
    command, from an --engine), and (`speculative`)
    --spec-tokens and --acceptance, and (`draft`) --draft-model. `parser`: a parser, or the
    argument group to add them to."""
    g = (
        parser.add_argument_group("serving")
        if isinstance(parser, argparse.ArgumentParser)
        else parser
    )
    g.add_argument(
        "--page-size",
        type=positive_int,
        default=page_size,
        metavar="P",
        help=f"a paged KV cache of P-token pages (vLLM: 16): sizes and capacity on pages "
        f"(default {_page_default(page_size)})",
    )
    if speculative:
        g.add_argument(
            "--spec-tokens",
            type=positive_int,
            default=None,
            metavar="K",
            help="speculative decoding (DeepSeek's MTP as the draft): K drafted tokens verified "
            "in one step of K + 1, kept up to the first rejected",
        )
        g.add_argument(
            "--acceptance",
            type=fraction,
            default=None,
            metavar="A",
            help="with --spec-tokens: each draft token's acceptance probability",
        )
    if draft:
        g.add_argument(
            "--draft-model",
            default=None,
            metavar="NAME",
            help="with --spec-tokens: the draft (preset or config.json) whose K decode steps are "
            "added per verify step",
        )


def add_chip_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("chip")
    g.add_argument("--chip", default=None, help=f"chip preset (default {DEFAULT_CHIP})")
    g.add_argument(
        "--peak-flops", type=in_range(1e6, 1e21, "FLOP/s"), help="peak FLOP/s (compute dtype)"
    )
    g.add_argument("--bandwidth", type=in_range(1e6, 1e16, "B/s"), help="memory bandwidth, B/s")
    g.add_argument("--memory", type=in_range(1e6, 1e16, "bytes"), help="memory capacity, bytes")


def model_from_name(name: str, **changes: Any) -> ModelConfig:
    """A preset name or a local Hugging Face config.json (or its folder), with `changes` applied
    before validation: every command that takes a model takes the same forms."""
    path = Path(name)
    if path.suffix == ".json" or path.is_dir() or path.exists() or "/" in name:
        return from_hf_config(path, **changes)
    return get_model_config(name, **changes)


def dequantized_experts(cfg: ModelConfig) -> ModelConfig:
    """The config kvjax's model runs: MXFP4 experts (gpt-oss) are closed form only, so the
    measured views time them dequantized in the weight dtype, and say so on stderr."""
    if not cfg.expert_weight_dtype:
        return cfg
    print(
        f"note: {cfg.name}'s {cfg.expert_weight_dtype} experts are timed in {cfg.weight_dtype}, "
        "as kvjax's model runs them (MXFP4 is sized by the closed form only: kvjax calc)",
        file=sys.stderr,
    )
    return cfg.replace(expert_weight_dtype="")


def resolve_model(args: argparse.Namespace) -> ModelConfig:
    changes: dict[str, Any] = {
        field: getattr(args, flag)
        for flag, field in _SIZE_FLAGS.items()
        if getattr(args, flag, None) is not None
    }
    changes.update(
        {
            field: getattr(args, flag)
            for flag, field in _MLA_FLAGS.items()
            if getattr(args, flag, None) is not None
        }
    )
    if getattr(args, "mla_decode", None):
        changes["mla_decode"] = args.mla_decode
    for flag in (
        "sliding_window",
        "layer_pattern",
        "kv_scales",
        "kv_group_size",
        "attention_kernel",
        "sink_tokens",
    ):
        if getattr(args, flag, None) is not None:
            changes[flag] = getattr(args, flag)
    budget = getattr(args, "kv_budget", None)
    if budget is not None:  # eviction to a budget: sinks + a window of the rest, every layer
        sinks = changes.get("sink_tokens") or 0
        if "sliding_window" in changes or "layer_pattern" in changes:
            raise KvjaxError(
                "--kv-budget sets the window and the pattern itself; drop "
                "--sliding-window / --layer-pattern"
            )
        if budget <= sinks:
            raise KvjaxError(
                f"--kv-budget {budget} must exceed --sink-tokens {sinks} (the "
                "recent window is the budget minus the sinks)"
            )
        changes.update(sliding_window=budget - sinks, layer_pattern="L", sink_tokens=sinks)
    if isinstance(changes.get("num_kv_heads"), list):  # a sweep: the first value is the base
        changes["num_kv_heads"] = changes["num_kv_heads"][0]
    if getattr(args, "weight_dtype", None):
        changes["weight_dtype"] = args.weight_dtype
    if getattr(args, "kv_dtype", None):
        changes["kv_dtype"] = args.kv_dtype
    if getattr(args, "matmul_dtype", None):
        changes["matmul_dtype"] = args.matmul_dtype
    named = args.model is not None
    cfg = model_from_name(args.model or DEFAULT_MODEL, **changes)
    return cfg.replace(name=custom_name(cfg, named)) if _reshaped(cfg, changes) else cfg


# Fields that make a different model from the preset (its weights' shapes); num_kv_heads, the
# dtypes and the attention options keep the preset's name (they are recorded beside it).
_SHAPE_FIELDS = (*_SIZE_FLAGS.values(), *_MLA_FLAGS.values())


def _reshaped(cfg: ModelConfig, changes: dict[str, Any]) -> bool:
    return any(f in changes and f != "num_kv_heads" for f in _SHAPE_FIELDS)


def custom_name(cfg: ModelConfig, named: bool) -> str:
    """The name of a model given by its dimensions: `custom-L2-D1024-N16-K8-H64-F2816-V32000`
    when no preset was named, `<preset>-custom-<hash>` of its fields when one was (what a
    profile folder or record is named after: never the preset's own name, which it is not)."""
    if not named:
        dims = (
            f"L{cfg.num_layers}-D{cfg.d_model}-N{cfg.num_heads}-K{cfg.num_kv_heads}-"
            f"H{cfg.head_dim}-F{cfg.d_ff}-V{cfg.vocab_size}"
        )
        return f"custom-{dims}" + (f"-A{cfg.kv_lora_rank}" if cfg.kv_lora_rank else "")
    import hashlib

    fields = {k: v for k, v in cfg.to_dict().items() if k != "name"}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:8]
    return f"{cfg.name}-custom-{digest}"


def resolve_workload(args: argparse.Namespace) -> Workload:
    T = getattr(args, "new_tokens", None)
    if args.phase == EXTEND and T is None:
        raise KvjaxError("--phase extend needs --new-tokens T (T new tokens on context - T cached)")
    if args.phase != EXTEND and T is not None:
        raise KvjaxError(f"--new-tokens applies to --phase extend (got --phase {args.phase})")
    return Workload(args.phase, args.batch, args.context, new_tokens=T or 0)


def resolve_chip(args: argparse.Namespace, cfg: ModelConfig) -> ChipSpec:
    dtype = cfg.peak_dtype
    if args.chip is None and args.peak_flops is not None and args.bandwidth is not None:
        return chip_from_numbers(args.peak_flops, args.bandwidth, args.memory, dtype=dtype)
    chip = get_chip(args.chip or DEFAULT_CHIP)
    return chip.with_overrides(args.peak_flops, args.bandwidth, args.memory, dtype=dtype)


def json_default(x: Any) -> Any:
    raise TypeError(f"cannot serialise {type(x).__name__}")


def finite_json(x: Any) -> Any:
    """`x` with every non-finite float replaced by null: the output is always valid JSON (the
    standard has no Infinity or NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite_json(v) for v in x]
    return x


def dumps(report: Any) -> str:
    return json.dumps(finite_json(report), indent=2, default=json_default, allow_nan=False)


def finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def emit(args: argparse.Namespace, report: dict[str, Any], render) -> int:
    """`--json` prints the report as one object; otherwise it is rendered as tables."""
    if args.json:
        print(dumps(report))
    else:
        render(report)
    return 0
