"""`kvjax frontier`: the throughput-latency frontier of a model on a chip at one context, for B
from 1 to the largest batch that fits (weights + paged KV cache + the step's activations), per
attention variant (`kvjax.analytic.serving`)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from kvjax.analytic import serving
from kvjax.analytic.variants import variant_configs
from kvjax.cli.args import (
    add_chip_args,
    add_model_args,
    add_serving_args,
    emit,
    positive_int,
    resolve_chip,
    resolve_model,
)
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig
from kvjax.units import fmt_bytes, fmt_seconds, sig


def add_parser(sub) -> None:
    p = sub.add_parser(
        "frontier",
        help="tokens/s against ms/token per sequence, B from 1 to what fits, per variant",
        description="The serving frontier in closed form: for each batch that fits the chip "
        "(weights + paged KV cache + activations), the decode step's bound (the sum of its "
        "kernels' roofline bounds), tokens/s per chip and ms/token per sequence, and the time to "
        "first token of a context-long prompt.",
    )
    add_model_args(p)
    add_chip_args(p)
    add_serving_args(p, speculative=False)
    p.add_argument("--context", type=positive_int, default=8192, help="S positions (default 8k)")
    p.add_argument(
        "--variants",
        action="store_true",
        help="one curve per attention variant (MHA, GQA, MQA, MLA) of the model",
    )
    p.add_argument(
        "--tp",
        type=positive_int,
        default=None,
        help="tensor-parallel degree inside each attention group (default: 1, or, when one chip "
        "cannot hold the model, the fewest of 2, 4, 8 that can, said in the output)",
    )
    p.add_argument(
        "--dp-attention",
        type=positive_int,
        default=None,
        metavar="N",
        help="data-parallel attention groups (default: --ep, else 1); devices = tp x N",
    )
    p.add_argument(
        "--ep",
        type=positive_int,
        default=1,
        help="MoE: experts spread over the --dp-attention devices (tp = 1)",
    )
    p.add_argument(
        "--chunk",
        type=positive_int,
        default=0,
        metavar="C",
        help="time to first token with chunked prefill of C-token chunks",
    )
    p.add_argument(
        "--predict",
        action="store_true",
        help="add each point's predicted step time [80%% interval] beside its bound, from the "
        "efficiency model fitted on the published measurements (kvjax validate)",
    )
    p.add_argument(
        "--max-quality-cost",
        type=finite_float,
        default=None,
        metavar="NATS",
        help="a quality budget: mark each variant whose committed quality cost (validation loss "
        "over MHA's, nats/byte, on the small quality model: kvjax.quality.costs) is above NATS "
        "and name the fastest point within it; a variant with no committed cost is refused",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number (nats/byte, e.g. 0.03)")
    return value


def variants_of(cfg: ModelConfig, all_variants: bool) -> list[tuple[str, ModelConfig]]:
    """(label, config) per curve: the model alone, or each attention variant kvjax has a model
    for (an MLA model's MHA/GQA/MQA rows have none: their values are narrower than the keys)."""
    if not all_variants:
        return [(cfg.attention_variant, cfg)]
    return [(label, v) for label, _, v, _ in variant_configs(cfg) if v is not None]


def frontier_report(
    cfg: ModelConfig,
    chip: ChipSpec,
    context: int,
    page_size: int = 0,
    chunk: int = 0,
    all_variants: bool = False,
    placement: dict[str, int] | None = None,
) -> dict[str, Any]:
    """`placement`: tp, ep, dp_attention (`kvjax.analytic.parallel.Placement`), one chip if
    None."""
    curves = []
    for label, variant in variants_of(cfg, all_variants):
        curve = serving.frontier(variant, chip, context, page_size, label, **(placement or {}))
        curve["time_to_first_token_s"] = curve["time_to_first_token_chunked_s"] = None
        if curve["devices"] == 1:  # a placed prefill (its collectives) is not modelled
            curve["time_to_first_token_s"] = serving.time_to_first_token_s(variant, chip, context)
        if chunk and curve["devices"] == 1:
            try:
                curve["time_to_first_token_chunked_s"] = serving.time_to_first_token_s(
                    variant, chip, context, chunk
                )
            except KvjaxError as exc:  # an extend step the model does not run (MLA, windows)
                curve["chunked_note"] = str(exc)
        curves.append(curve)
    return {
        "model": cfg.name,
        "chip": {
            "name": chip.name,
            "memory_bytes": chip.memory_bytes,
            "peak_flops_per_s": chip.peak(cfg.peak_dtype),
            "bandwidth_bytes_per_s": chip.bandwidth_bytes_per_s,
        },
        "context": context,
        "page_size": page_size,
        "chunk": chunk,
        "variants": curves,
        **{k: curves[0][k] for k in ("tp", "ep", "dp_attention", "devices")},
        "points": [p for c in curves for p in c["points"]],
        "max_batch": {c["variant"]: c["max_batch"] for c in curves},
    }


def run(args: argparse.Namespace) -> int:
    cfg = resolve_model(args)
    chip = resolve_chip(args, cfg)
    placement = {"tp": args.tp or 1, "ep": args.ep, "dp_attention": args.dp_attention or args.ep}
    report = frontier_report(
        cfg, chip, args.context, args.page_size, args.chunk, args.variants, placement
    )
    auto = args.tp is None and args.ep == 1 and args.dp_attention is None and not args.predict
    if auto and not all(report["max_batch"].values()):
        for tp in (2, 4, 8):  # the seed's 70B on H100s: the explorer opens on 8
            placed = frontier_report(
                cfg,
                chip,
                args.context,
                args.page_size,
                args.chunk,
                args.variants,
                {**placement, "tp": tp},
            )
            if all(placed["max_batch"].values()):
                placed["tp_note"] = (
                    f"no --tp given and one {chip.name} holds no batch: tp={tp}, the fewest of "
                    "1, 2, 4, 8 that does"
                )
                report = placed
                break
    for (_, variant), curve in zip(
        variants_of(cfg, args.variants), report["variants"], strict=True
    ):
        curve["no_batch_fits"] = None if curve["max_batch"] else nothing_fits(variant, chip, curve)
    if args.predict:
        if report["devices"] > 1:
            raise KvjaxError(
                "--predict fits one chip's steps; drop it with --tp/--ep/--dp-attention"
            )
        add_predictions(report, cfg, chip, args.variants)
    if args.max_quality_cost is not None:
        apply_quality_budget(report, cfg, args.variants, args.max_quality_cost)
    return emit(args, report, print_frontier)


def apply_quality_budget(
    report: dict[str, Any], cfg: ModelConfig, all_variants: bool, budget: float
) -> None:
    """Each curve's committed quality cost and whether it is within `budget` (its mean; the
    interval printed beside), and the fastest point (tokens/s per chip) of the curves within."""
    from kvjax.quality.costs import quality_cost

    variants = dict(variants_of(cfg, all_variants))
    for curve in report["variants"]:
        cost = quality_cost(variants[curve["variant"]])
        if cost.missing:
            raise KvjaxError(
                f"--max-quality-cost {budget:g}: variant {curve['variant']!r} has no committed "
                f"quality cost ({cost.missing})"
            )
        curve["quality_cost"] = cost.as_dict()
        curve["within_quality_budget"] = bool(cost.delta <= budget)
    kept = [(c, p) for c in report["variants"] if c["within_quality_budget"] for p in c["points"]]
    best = max(kept, key=lambda cp: cp[1]["tokens_per_s"], default=None)
    report["max_quality_cost"] = budget
    report["fastest_within_quality_budget"] = best and {
        "variant": best[0]["variant"],
        "quality_cost": best[0]["quality_cost"]["delta"],
        **{k: best[1][k] for k in ("batch", "tokens_per_s", "ms_per_token")},
    }


def add_predictions(report: dict[str, Any], cfg: ModelConfig, chip: ChipSpec, all_variants: bool):
    """Each point's whole decode step predicted by the corpus's `step` class (its FLOPs and
    bytes from the closed form, attention fused as engines run it), with the 80% interval, and
    ms/token and tokens/s at it."""
    from kvjax.analytic.costs import Workload
    from kvjax.predict.apply import engine_step_cost, predict_step_s

    variants = dict(variants_of(cfg, all_variants))
    for curve in report["variants"]:
        variant = variants[curve["variant"]]
        for p in curve["points"]:
            cost = engine_step_cost(
                variant, Workload("decode", p["batch"], report["context"]), chip
            )
            pred = predict_step_s(
                cost.flops, cost.bytes, chip, variant.peak_dtype, variant.num_layers
            )
            p.update(pred)
            p["predicted_ms_per_token"] = 1e3 * pred["predicted_s"]
            p["predicted_tokens_per_s"] = p["batch"] / pred["predicted_s"]


def print_frontier(report: dict[str, Any]) -> None:
    from rich.table import Table

    from kvjax.cli.render import console

    con = console()
    pages = f", pages of {report['page_size']}" if report["page_size"] else ""
    con.print(
        f"[bold]{report['model']}[/bold] on {report['chip']['name']} "
        f"({fmt_bytes(report['chip']['memory_bytes'])}){placed_label(report)} | "
        f"S={report['context']:,}{pages} | decode bound = sum of the step's kernels' roofline "
        "bounds"
        + (
            ", collectives over the link overlapped (the larger); tokens/s per chip"
            if report["devices"] > 1
            else ""
        )
    )
    t = Table(title="throughput-latency frontier (each curve ends where memory ends)")
    predicted = any("predicted_s" in p for p in report["points"])
    cols = ["variant", "B", "ms/token", "tokens/s", "memory"]
    if predicted:
        cols += ["predicted ms/token [80%]", "predicted tokens/s"]
    for col in cols:
        t.add_column(col, justify="left" if col == "variant" else "right")
    for curve in report["variants"]:
        for p in curve["points"]:
            over = " (over the quality budget)" * (curve.get("within_quality_budget") is False)
            cells = [
                curve["variant"] + over,
                f"{p['batch']:,}",
                sig(p["ms_per_token"]),
                f"{p['tokens_per_s']:,.0f}",
                fmt_bytes(p["memory_bytes"]),
            ]
            if predicted:
                cells += [
                    f"{sig(1e3 * p['predicted_s'])} [{sig(1e3 * p['predicted_lo_s'])}, "
                    f"{sig(1e3 * p['predicted_hi_s'])}]",
                    f"{p['predicted_tokens_per_s']:,.0f}",
                ]
            t.add_row(*cells)
    if report.get("tp_note"):
        con.print(f"  ({report['tp_note']})")
    con.print(t)
    for curve in report["variants"]:
        if not curve["max_batch"]:
            con.print(f"  {curve['variant']:<16} no batch fits: {curve['no_batch_fits']}")
        if "quality_cost" in curve:
            q = curve["quality_cost"]
            verdict = "within" if curve["within_quality_budget"] else "OVER"
            con.print(
                f"  {curve['variant']:<16} quality cost {q['delta']:+.4f} [{q['low']:+.4f}, "
                f"{q['high']:+.4f}] nats/byte ({q['comparison']}): {verdict} the budget "
                f"{report['max_quality_cost']:g}"
            )
        chunked = curve["time_to_first_token_chunked_s"]
        extra = (
            f"; chunked by {report['chunk']:,}: {fmt_seconds(chunked)}"
            if chunked is not None
            else (f"; chunked: {curve['chunked_note']}" if curve.get("chunked_note") else "")
        )
        ttft = curve["time_to_first_token_s"]
        con.print(
            f"  {curve['variant']:<16} max batch {curve['max_batch']:,}; weights floor "
            f"{sig(curve['weights_floor_ms_per_token'])} ms/token; first token of an "
            f"S-token prompt "
            + (f"{fmt_seconds(ttft)}{extra}" if ttft is not None else "(one chip only)")
        )
    if "max_quality_cost" in report:
        best = report["fastest_within_quality_budget"]
        con.print(
            f"  fastest within a quality cost of {report['max_quality_cost']:g} nats/byte: "
            + (
                f"{best['variant']} at B={best['batch']:,}, {best['tokens_per_s']:,.0f} "
                f"tokens/s, {sig(best['ms_per_token'])} ms/token"
                if best
                else "none (no variant within)"
            )
        )


def nothing_fits(variant: ModelConfig, chip: ChipSpec, curve: dict[str, Any]) -> str:
    """Why a curve has no point: the weights a device holds against its memory, and what helps."""
    from kvjax.analytic.parallel import Placement, placed_weight_bytes

    pl = Placement(curve["tp"], curve["ep"], curve["dp_attention"])
    return (
        f"weights {placed_weight_bytes(variant, pl):,} B a device of {chip.memory_bytes:,.0f} B "
        "(and one sequence's cache at S): more chips (--tp 2, 4, 8), lighter weights "
        "(--weight-dtype fp8) or a larger --chip"
    )


def placed_label(report: dict[str, Any]) -> str:
    """' x 8 (dp8 x ep8)': the placement, when there are several chips."""
    if report["devices"] == 1:
        return ""
    from kvjax.cli.render_parallel import split_label

    return f" x {report['devices']} ({split_label(report)})"
