"""`kvjax calc`: its options and the run that assembles the report (`kvjax.cli.calc_report`, from
`kvjax.analytic` alone): every closed-form number for a model, workload and chip, per device
over a placement, speculative decoding's verify step, a pipeline's stages, and predictions."""

from __future__ import annotations

import argparse
import math

from kvjax.analytic import Workload, parallel, serving
from kvjax.analytic.variants import variant_configs, variants_table
from kvjax.cli.args import (
    add_chip_args,
    add_model_args,
    add_serving_args,
    add_workload_args,
    emit,
    int_list,
    model_from_name,
    positive_int,
    resolve_chip,
    resolve_model,
    resolve_workload,
)
from kvjax.cli.calc_report import (
    attention_kernel_report,
    calc_report,
    expert_parallel_report,
    placement_report,
)
from kvjax.cli.render_calc import print_calc
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig


def add_parser(sub) -> None:
    calc = sub.add_parser(
        "calc",
        help="closed-form sizes, intensities and floors for a model, workload and chip",
        description="Closed forms of the seed text for any model, num_kv_heads, workload and chip.",
    )
    add_model_args(calc)
    add_workload_args(calc, extend=True)
    add_chip_args(calc)
    add_serving_args(calc)
    calc.add_argument("--variants", action="store_true", help="add the MHA/GQA/MQA table")
    calc.add_argument("--tp", type=int_list, help="tensor-parallel degree(s), e.g. 8 or 1,2,4,8")
    calc.add_argument(
        "--pp",
        type=positive_int,
        help="pipeline stages (layers split, tp-way inside): each stage's weights, cache, step; "
        "the bytes between",
    )
    calc.add_argument(
        "--ep",
        type=positive_int,
        help="MoE: expert-parallel degree: E/ep experts a device, dispatch and combine "
        "all-to-alls (with data-parallel attention: --dp-attention = ep)",
    )
    calc.add_argument(
        "--dp-attention",
        type=positive_int,
        metavar="N",
        help="data-parallel attention: N groups, each on batch/N sequences with its own KV (or "
        "MLA latent) cache; tp-way inside a group; devices = tp x N (default: --ep, else 1)",
    )
    calc.add_argument(
        "--capacity-factor",
        type=float,
        metavar="CF",
        help="with --ep: count fixed-shape all-to-alls of ceil(CF x tokens x k / E) rows an "
        "expert (GShard; E/k never drops) instead of ragged ones (the routed rows)",
    )
    calc.add_argument(
        "--link-latency",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="per-message link latency added to the --tp link term (ring: 2(tp-1) messages per "
        "all-reduce); default 0 = bandwidth only",
    )
    calc.add_argument(
        "--predict",
        action="store_true",
        help="add predicted times [80%% interval] beside the bounds, per kernel and for the step, "
        "from the efficiency model fitted on the published measurements (kvjax validate)",
    )
    calc.add_argument("--json", action="store_true", help="print one JSON object")
    calc.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    placed = args.tp or args.ep or args.dp_attention
    if args.link_latency and not placed:
        raise KvjaxError("--link-latency applies to the link term of --tp/--ep; add one")
    if args.capacity_factor is not None and not args.ep:
        raise KvjaxError("--capacity-factor sizes the --ep all-to-alls; add --ep")
    if not math.isfinite(args.link_latency) or args.link_latency < 0:
        raise KvjaxError(f"--link-latency {args.link_latency} must be >= 0 seconds")
    cfg = resolve_model(args)
    wl = resolve_workload(args)
    chip = resolve_chip(args, cfg)
    report = calc_report(cfg, wl, chip, args.page_size)
    report["speculative"] = speculative_report(args, cfg, wl, chip)
    if args.variants:
        report["variants"] = variants_table(cfg, chip)
        # each variant's attention at this step, unfused and fused (the kernel the step counts)
        for row, (_, _, variant, _) in zip(report["variants"], variant_configs(cfg), strict=True):
            row["attention_kernel"] = (
                None if variant is None else attention_kernel_report(variant, wl, chip)
            )
    if placed:
        ep = args.ep or 1
        dp = args.dp_attention or ep
        pls = [parallel.Placement(tp, ep, dp) for tp in (args.tp or [1])]
        report.update(placement_report(cfg, wl, chip, pls, args.link_latency, args.capacity_factor))
    if args.ep:
        report["expert_parallel"] = [expert_parallel_report(cfg, args.ep, wl)]
    if args.pp:
        from kvjax.analytic.pipeline import pipeline_report

        if args.tp and len(args.tp) > 1:
            raise KvjaxError("--pp takes one --tp (the tensor-parallel size inside each stage)")
        report["pipeline"] = pipeline_report(cfg, wl, chip, args.pp, args.tp[0] if args.tp else 1)
    if args.predict:
        from kvjax.predict.apply import predict_step
        from kvjax.predict.steps import step_from_kernels

        report["predicted"] = predict_step(report["kernels"], cfg, wl, chip)
        report["predicted"]["step_from_kernels"] = step_from_kernels(cfg, wl, chip)
    return emit(args, report, print_calc)


def speculative_report(args, cfg: ModelConfig, wl: Workload, chip: ChipSpec):
    """--spec-tokens K --acceptance A [--draft-model NAME]: the verify step against decode."""
    given = [
        f
        for f in ("spec_tokens", "acceptance", "draft_model")
        if getattr(args, f, None) is not None
    ]
    if not given:
        return None
    if args.spec_tokens is None or args.acceptance is None:
        raise KvjaxError(
            "speculative decoding needs --spec-tokens K and --acceptance A "
            f"(given: {', '.join('--' + f.replace('_', '-') for f in given)})"
        )
    draft = None if args.draft_model is None else model_from_name(args.draft_model)
    return serving.speculative(cfg, wl, chip, args.spec_tokens, args.acceptance, draft)
