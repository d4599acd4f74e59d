"""`kvjax plan`: which deployment a workload should run on N chips (`kvjax.serving.plan`): every
placement, KV dtype and batch searched, pruned by the bound, each option with its bound beside its
prediction and 80% interval; the Pareto frontier and the best option under the SLO, with its
`kvjax simulate` line."""

from __future__ import annotations

import argparse
from typing import Any

from kvjax.cli.arg_types import positive_float, positive_int
from kvjax.cli.args import add_chip_args, add_model_args, emit, resolve_chip, resolve_model
from kvjax.cli.render_common import console, progress_bar
from kvjax.errors import KvjaxError


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be a positive integer")
    return values


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="the deployment a workload should run on N chips, searched, bound beside prediction",
        description="Searches every placement of --chips chips (tensor and pipeline parallel, "
        "expert parallel over data-parallel attention groups, replicas; prefill and decode "
        "apart as xP + yD instances), KV dtype and engine batch; prunes by the system bound; "
        "predicts each option from the published kernels (the simulator, its steps from "
        "`--step-time kernels`) under the load: at --rate, at --concurrency, or at the highest "
        "rate the SLO holds at its percentile (MLPerf's Server). Prints each option's bound, "
        "prediction and 80% interval, the Pareto frontier of output tokens/s per chip against "
        "tokens/s per user, and the best option that meets "
        "the SLO with its `kvjax simulate` line.",
    )
    add_model_args(p)
    add_chip_args(p)
    _add_load_args(p)
    s = p.add_argument_group("SLO")
    s.add_argument("--slo-ttft", type=positive_float, help="time to first token, s")
    s.add_argument("--slo-tpot", type=positive_float, help="time per output token, s")
    s.add_argument(
        "--slo-percentile",
        type=positive_float,
        default=99.0,
        help="the percentile of requests the SLO holds at (default 99, as MLPerf)",
    )
    _add_engine_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--figure", default=None, help="write the frontier's figure to this PNG")
    p.set_defaults(func=run)


def _add_load_args(p) -> None:
    """The chips, their nodes and link, and the load."""
    g = p.add_argument_group("the chips and the load")
    g.add_argument("--chips", type=positive_int, required=True, help="chips to place the model on")
    g.add_argument(
        "--nodes",
        type=positive_int,
        default=1,
        help="nodes the chips sit in, evenly (tensor parallelism and a disaggregated instance "
        "stay inside one; default 1)",
    )
    g.add_argument(
        "--link-gb-per-s",
        type=positive_float,
        default=None,
        help="the prompt's KV between prefill and decode instances, GB/s a chip (default on "
        "one node: the chip's interconnect; required on several)",
    )
    g.add_argument("--prompt-len", type=positive_int, default=2048, help="tokens a prompt")
    g.add_argument("--output-len", type=positive_int, default=256, help="tokens an output")
    load = g.add_mutually_exclusive_group()
    load.add_argument("--rate", type=positive_float, help="Poisson arrivals, requests/s")
    load.add_argument("--concurrency", type=positive_int, help="clients in a closed loop")
    g.add_argument(
        "--requests",
        type=positive_int,
        default=100,
        help="requests a replica serves in a refined run (half, at least 50, screening)",
    )


def _add_engine_args(p) -> None:
    """The engine's settings searched, and the attention variants."""
    e = p.add_argument_group("engine")
    e.add_argument(
        "--engine",
        default=None,
        metavar="NAME[@VERSION]",
        help="an engine's cited defaults (vllm, sglang, trtllm-serve, ...; default kvjax's)",
    )
    e.add_argument(
        "--max-batch",
        type=_ints,
        default=None,
        help="engine batches to search, comma-separated (default: the engine's)",
    )
    e.add_argument(
        "--kv-dtypes",
        default=None,
        help="KV dtypes to search, comma-separated (default: the model's, and fp8 where the "
        "chip computes fp8)",
    )
    v = p.add_argument_group("attention variants")
    v.add_argument(
        "--variants",
        action="store_true",
        help="search each attention variant of the model (MHA, GQA, MQA, MLA) too, each option "
        "with its committed quality cost",
    )
    v.add_argument(
        "--max-quality-cost",
        type=float,
        default=None,
        metavar="NATS",
        help="with --variants: refuse a variant and KV dtype whose committed quality cost "
        "(validation loss over MHA's, nats/byte) is above NATS or not committed",
    )


def planner_of(args: argparse.Namespace):
    from kvjax.serving.engine_profiles import resolve
    from kvjax.serving.plan import Planner, Traffic

    cfg = resolve_model(args)
    chip = resolve_chip(args, cfg)
    traffic = Traffic(
        args.prompt_len,
        args.output_len,
        args.rate,
        args.concurrency,
        args.slo_ttft,
        args.slo_tpot,
        args.slo_percentile,
        args.requests,
    )
    engine, _ = resolve(args.engine, chip, {})
    batches = args.max_batch or (engine.max_batch,)
    if args.kv_dtypes:
        kv = tuple(v.strip() for v in args.kv_dtypes.split(","))
    else:
        kv = (cfg.kv_dtype,) + (("fp8",) if "fp8" in chip.peak_flops_per_s else ())
        kv = tuple(dict.fromkeys(kv))
    for dtype in kv:
        cfg.replace(kv_dtype=dtype)  # refused by name where the dtype is not one kvjax sizes
    link = args.link_gb_per_s * 1e9 if args.link_gb_per_s else None
    return Planner(
        cfg, chip, args.chips, traffic, engine, kv, batches, nodes=args.nodes, link_bytes_per_s=link
    )


def run(args: argparse.Namespace) -> int:
    from kvjax.serving.plan_report import plan_report

    planner = planner_of(args)
    if args.max_quality_cost is not None and not args.variants:
        raise KvjaxError("--max-quality-cost chooses among variants: give --variants too")
    con = console(stderr=args.json)
    with progress_bar(con) as bar:
        variants = 4 if args.variants else 1  # MHA, GQA, MQA and MLA forms
        task = bar.add_task("planning", total=variants * len(planner.options()))

        def step(label: str) -> None:
            bar.update(task, description=label)
            bar.advance(task)

        planner.progress = step
        search = None
        if args.variants:
            from kvjax.cli.plan_variants import plan_variants

            def search(p):
                return plan_variants(p, args.max_quality_cost)

        report = plan_report(
            planner,
            args.model or planner.model.name,
            args.engine,
            search,
            variants=args.variants,
            max_quality_cost=args.max_quality_cost,
        )
    if args.figure:
        from kvjax.plotting.plan import plan_figure

        plan_figure(report, args.figure)
    if not report["options"] or not any(r["status"] != "refused" for r in report["options"]):
        raise KvjaxError(
            f"no placement of {args.chips} x {planner.chip.name} holds {planner.model.name}: "
            + report["options"][0]["why"]
        )
    return emit(args, report, print_plan)


def _note(r: dict[str, Any]) -> str:
    """An option's note: why it was not refined, and a variant's quality cost."""
    cost = r.get("quality_cost")
    quality = f"quality +{cost:.4f} nats/B" if cost is not None else ""
    return "; ".join(x for x in (quality, r.get("why", "")) if x)


def print_plan(report: dict[str, Any]) -> None:
    from rich.table import Table

    con = console()
    t = report["traffic"]
    load = (
        f"{t['rate']} requests/s"
        if t["rate"]
        else f"{t['concurrency']} clients"
        if t["concurrency"]
        else "the highest rate the SLO holds at"
    )
    con.print(
        f"{report['model']} on {report['chips']} x {report['chip']}, prompts {t['prompt_len']}, "
        f"outputs {t['output_len']}, {load}; SLO TTFT {t['slo_ttft_s']} s, TPOT "
        f"{t['slo_tpot_s']} s at P{t['slo_percentile']:g}; {report['counts']}, "
        f"{report['seconds']:.1f} s"
    )
    table = Table(title="options (output tokens/s per chip; * on the frontier)")
    for col in ("option", "bound", "predicted [80%]", "per user", "TTFT", "TPOT", "SLO", "note"):
        table.add_column(col)
    on_frontier = {r["option"] for r in report["frontier"]}
    for r in report["options"]:
        if r["status"] == "refused":
            quality = "quality" in r.get("why", "")
            why = r["why"] if quality else "does not fit"
            table.add_row(r["option"], "", "", "", "", "", "", f"refused: {why}")
            continue
        pred = (
            f"{r['predicted']:,.0f} [{r['predicted_lo']:,.0f}, {r['predicted_hi']:,.0f}]"
            if r.get("predicted")
            else ""
        )
        table.add_row(
            r["option"] + (" *" if r["option"] in on_frontier else ""),
            f"{r['bound']:,.0f}",
            pred,
            f"{r['per_user']:.1f}" if r.get("per_user") else "",
            f"{r['ttft_s']:.3f}" if r.get("ttft_s") is not None else "",
            f"{r['tpot_s']:.4f}" if r.get("tpot_s") is not None else "",
            {True: "met", False: "missed"}.get(r.get("meets_slo"), ""),
            _note(r),
        )
    con.print(table)
    best = report["best"]
    if best is None:
        con.print("no option meets the SLO")
        return
    con.print(
        f"best under the SLO: {best['option']}, {best['predicted']:,.0f} output tokens/s a chip "
        f"[{best['predicted_lo']:,.0f}, {best['predicted_hi']:,.0f}] (bound {best['bound']:,.0f})"
    )
    con.print(best["command"] or best["command_note"])
