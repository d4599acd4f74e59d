"""`kvjax simulate`: requests arriving at a rate, served by kvjax's scheduler on a chip whose step
times are the closed form's bounds, or their prediction from published measurements, or on the
engine of a `kvjax serve --save-steps` file with step times fitted to its steps
(`kvjax.serving`): per-request TTFT, ITL and end-to-end times, throughput, goodput under an SLO,
preemptions, the KV pool in pages and tokens."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from kvjax.cli.arg_types import instances_spec, positive_float, positive_int
from kvjax.cli.args import (
    add_chip_args,
    add_model_args,
    emit,
    resolve_chip,
    resolve_model,
)
from kvjax.cli.load_args import add_engine_args, add_load_args, load_requests
from kvjax.errors import KvjaxError
from kvjax.serving.router import ROUTES

STEP_TIMES = {
    "bound": "closed form (sum of kernel bounds)",
    "predicted": "predicted (the published engine steps' fit, fused attention)",
    "kernels": "predicted from its kernels (the published kernels' fits, a fixed time a step)",
    "fitted": "fitted to the steps `kvjax serve` measured",
}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="requests under load on a chip: TTFT, ITL, goodput (bound, predicted or fitted)",
        description="A discrete-event simulation of serving: Poisson (or gamma) arrivals, a "
        "vLLM-v1-style scheduler (token budget, chunked prefill, paged KV with prefix caching "
        "and preemption by recompute), each step as long as the closed form's bound on the chip.",
    )
    add_model_args(p)
    add_chip_args(p)
    add_load_args(p, closed_loop=True)
    s = add_engine_args(p, speculative=True, profiles=True)
    s.add_argument(
        "--engine",
        default=None,
        metavar="NAME[@VERSION]",
        help="an engine's scheduler as its code sets the defaults, each cited (vllm, vllm-llm, "
        "sglang, trtllm-serve, trtllm-bench; kvjax.serving.engine_profiles); the flags given "
        "override it",
    )
    s.add_argument(
        "--memory-utilization",
        type=positive_float,
        default=None,
        help="share of the chip's memory the engine takes (default the --engine's, else 0.9)",
    )
    s.add_argument("--no-prefix-caching", action="store_true")
    s.add_argument(
        "--admission",
        choices=("recompute", "reserve"),
        default=None,
        help="recompute: pages as a request grows, the last admitted preempted when they run out "
        "(vLLM; default); reserve: admitted only with pages for its prompt and all its output "
        "(TensorRT-LLM's GUARANTEED_NO_EVICT)",
    )
    _add_step_time_args(s)
    _add_placement_args(p.add_argument_group("placement"))
    _add_cost_args(p.add_argument_group("cost and disaggregation"))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _add_step_time_args(s) -> None:
    """--step-time and the steps it may be fitted to."""
    s.add_argument(
        "--step-time",
        choices=sorted(STEP_TIMES),
        default="bound",
        help="bound: the sum of the closed form's kernel bounds (default); predicted: the "
        "published-measurements fit of an engine's step (fused attention; `calc --predict`); "
        "kernels: each kernel by its published class plus a fixed time a step (kvjax validate's "
        "system predictions); "
        "fitted: fitted to the steps of --steps, on that engine (its slots, max_len, budget and "
        "pool; --chip, --max-batch, --token-budget, --page-size, --memory-utilization unused)",
    )
    s.add_argument(
        "--steps",
        default=None,
        metavar="JSON",
        help="the measured steps of `kvjax serve --save-steps JSON`, for --step-time fitted",
    )


def _add_placement_args(g) -> None:
    """The chips a deployment spreads over: tensor, pipeline, expert parallel, replicas."""
    g.add_argument(
        "--tp",
        type=positive_int,
        default=None,
        help="tensor-parallel chips serving as one (each step a device's shard, then its "
        "all-reduces over the link); default: 1, or the fewest of 2, 4, 8 that hold the model "
        "when one chip does not (said in the output)",
    )
    g.add_argument(
        "--pp",
        type=positive_int,
        default=1,
        help="pipeline stages, pp micro-batches in flight (kvjax.serving.placed)",
    )
    g.add_argument(
        "--dp-attention",
        type=positive_int,
        default=1,
        metavar="D",
        help="data-parallel attention groups, each an engine copy; with --ep D",
    )
    g.add_argument(
        "--ep",
        type=positive_int,
        default=1,
        help="expert parallelism over the --dp-attention D devices (tp = 1)",
    )
    g.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="copies of the deployment behind a router, each its own scheduler and pool",
    )
    g.add_argument(
        "--route",
        choices=ROUTES,
        default="round-robin",
        help="with --replicas: round-robin (the i-th arrival to copy i mod N) or least-loaded "
        "(to the copy with the fewest unfinished requests)",
    )


def _add_cost_args(c) -> None:
    """Cost a million tokens, and prefill and decode on two chips."""
    c.add_argument(
        "--price-per-chip-hour",
        type=positive_float,
        default=None,
        metavar="USD",
        help="cost per million output tokens at this price (energy: the chip's rated power)",
    )
    c.add_argument(
        "--disaggregate",
        nargs="?",
        const="1P1D",
        default=None,
        type=instances_spec,
        metavar="XPYD",
        help="prefill on X instances, decode on Y others (default 1P1D), each of --tp chips, "
        "the prompt's KV over the link between",
    )
    c.add_argument(
        "--link-gb-per-s",
        type=positive_float,
        default=None,
        help="the KV transfer's bandwidth, GB/s (default: the chip's interconnect)",
    )
    c.add_argument("--link-latency-us", type=float, default=0.0, help="per transfer (default 0)")


def run(args: argparse.Namespace) -> int:
    from kvjax.cli.render_simulation import print_simulation

    return emit(args, simulate_report(args), print_simulation)


def _check(args: argparse.Namespace) -> None:
    """Flags that do not go together, refused by name."""
    spec = bool(args.spec_tokens)
    if spec != (args.acceptance is not None):
        raise KvjaxError("speculative decoding needs --spec-tokens K and --acceptance A together")
    if spec and (args.disaggregate or args.steps is not None):
        raise KvjaxError(
            "--spec-tokens runs on one colocated engine (not with --disaggregate or --step-time "
            "fitted)"
        )
    if (args.step_time == "fitted") != (args.steps is not None):
        raise KvjaxError("--step-time fitted and --steps JSON go together (one without the other)")
    placed = args.pp > 1 or args.ep > 1 or args.dp_attention > 1
    if args.steps is not None and (placed or args.tp or args.replicas > 1):
        raise KvjaxError(
            "--step-time fitted runs the one engine that measured --steps (not with "
            "--tp/--pp/--ep/--dp-attention/--replicas)"
        )
    if args.tp and args.tp > 1 and args.ep > 1:
        raise KvjaxError(
            f"--tp {args.tp} with --ep {args.ep}: expert parallelism is modelled over "
            "data-parallel attention groups of one chip each (tp = 1)"
        )
    if args.disaggregate and args.concurrency:
        raise KvjaxError("--disaggregate runs arrivals at --rate (not a --concurrency loop)")
    if args.disaggregate and (args.replicas > 1 or placed):
        raise KvjaxError(
            "--pp/--ep/--dp-attention/--replicas and --disaggregate do not go together "
            "(instances of --tp chips, as many as XPYD says)"
        )
    if args.ep != args.dp_attention or (args.pp > 1 and args.ep > 1):
        raise KvjaxError(
            f"--ep {args.ep} --dp-attention {args.dp_attention} --pp {args.pp}: "
            "experts spread over the data-parallel attention groups, --ep D "
            "--dp-attention D, without --pp (--dp-attention alone is --replicas)"
        )


def engine_of(args: argparse.Namespace, chip) -> tuple[Any, dict[str, Any] | None]:
    """The engine's settings (`engine_profiles.resolve`: an --engine's defaults on the chip, or
    kvjax's, with the flags given over them) and, with an --engine, where each came from."""
    from kvjax.serving.engine_profiles import resolve

    given = {
        "max_batch": args.max_batch,
        "token_budget": args.token_budget,
        "page_size": args.page_size,
        "memory_utilization": args.memory_utilization,
        "reserve": None if args.admission is None else args.admission == "reserve",
        "prefix_caching": False if args.no_prefix_caching else None,
    }
    engine, used = resolve(args.engine, chip, {k: v for k, v in given.items() if v is not None})
    return replace(
        engine,
        spec_tokens=args.spec_tokens or 0,
        acceptance=args.acceptance or 0.0,
        route=args.route,
    ), used


def deployment_of(args: argparse.Namespace, cfg, chip, longest: int):
    """The deployment the flags describe (`kvjax.serving.deployment`), on the fewest
    tensor-parallel chips that hold the model where --tp is not given, and why in words."""
    from kvjax.serving.deployment import Deployment, Placement, fewest_tensor_parallel
    from kvjax.serving.step_time import STEP_MODELS

    placement = Placement(args.tp or 1, args.pp, args.ep, args.dp_attention, args.replicas)
    engine, _ = engine_of(args, chip)
    d = Deployment(
        cfg,
        chip,
        longest,
        placement,
        engine,
        STEP_MODELS[args.step_time],
        achieved=args.step_time != "bound",
    )
    if args.tp or args.disaggregate or placement != Placement(replicas=args.replicas):
        return d, None
    return fewest_tensor_parallel(d)


def simulate_report(args: argparse.Namespace) -> dict[str, Any]:
    from kvjax.serving.cost import energy_and_cost
    from kvjax.serving.simulate import report

    cfg = resolve_model(args)
    _check(args)
    requests = load_requests(args)
    if args.steps is not None:
        return fitted_report(args, cfg, requests)
    chip = resolve_chip(args, cfg)
    d, tp_note = deployment_of(args, cfg, chip, max(r.prompt_len + r.output_len for r in requests))
    if args.disaggregate:
        link = args.link_gb_per_s * 1e9 if args.link_gb_per_s else chip.interconnect_bytes_per_s
        if not link:
            raise KvjaxError(
                f"chip {chip.name!r} has no interconnect bandwidth; give --link-gb-per-s"
            )
        x, y = args.disaggregate
        result = d.run_disaggregated(requests, link, args.link_latency_us * 1e-6, (x, y))
        chips = (x + y) * d.placement.tp
    else:  # copies behind a router (kvjax.serving.router)
        result = d.run(requests, concurrency=args.concurrency)
        chips = d.placement.chips
    out = report(result, args.slo_ttft, args.slo_itl)
    out.update(
        energy_and_cost(
            out["output_tokens"],
            out["duration_s"],
            chips,
            chip.power_watts,
            args.price_per_chip_hour,
        )
    )
    out["disaggregated"] = bool(args.disaggregate)
    if args.disaggregate:
        out["instances"] = dict(zip(("prefill", "decode"), args.disaggregate, strict=True))
    engine_used = engine_of(args, chip)[1]
    if engine_used is not None:
        out["engine"] = engine_used
    p, pool = d.placement, d.pool
    out.update(
        tp=p.tp,
        tp_note=tp_note,
        replicas=p.replicas,
        route=args.route,
        pp=p.pp,
        ep=p.ep,
        dp_attention=p.dp_attention,
        chips=chips,
    )
    out.update(
        model=cfg.name,
        chip=chip.name,
        **({"concurrency": args.concurrency} if args.concurrency else {}),
        rate_requests_per_s=args.rate if not args.trace else None,
        kv_pool_tokens=pool.tokens,
        kv_pool_pages=pool.pages,
        page_size=pool.page_size,
        kv_bytes_per_token=pool.bytes_per_token,
        weight_bytes=pool.weight_bytes,
        activation_bytes=pool.activation_bytes,
        reserve_bytes=pool.reserve_bytes,
        slot_bytes_per_request=pool.slot_bytes,
        token_budget=d.token_budget,
        chunked_prefill=d.chunked,
        whole_prefill_reason=d.whole_prefill,
        step_time=STEP_TIMES[args.step_time],
    )
    return out


def fitted_report(args: argparse.Namespace, cfg, requests) -> dict[str, Any]:
    """The simulator on the engine that measured `--steps`: its slots, token budget, pool and
    chunk buckets, no prefix caching (the engine has none); each step the mean of the fit to the
    calibration runs (their shape, at their median speed) times one of their measured/fitted
    ratios drawn (seeded by --seed). The served run is left out of the fit: its speed against
    the fit is reported (`fit.served_speed`), so a simulation of the served load is an out of
    sample prediction of it."""
    from kvjax.measured.engine import check_requests
    from kvjax.serving.fitted import FittedStepTime
    from kvjax.serving.pages import PagePool
    from kvjax.serving.router import closed_loop
    from kvjax.serving.scheduler import Scheduler
    from kvjax.serving.simulate import report, simulate
    from kvjax.serving.steps_file import load_steps

    engine, runs = load_steps(args.steps)
    if engine["model"] != cfg.name:
        raise KvjaxError(
            f"--steps {args.steps} were measured on {engine['model']!r}, not "
            f"{cfg.name!r}: give --model {engine['model']}"
        )
    if args.disaggregate:
        raise KvjaxError("--disaggregate needs a chip (--step-time bound, predicted or kernels)")
    page = engine["page_size"]
    sched = Scheduler(
        PagePool(engine["kv_pool_tokens"] // page, page),
        engine["max_batch"],
        engine["token_budget"],
        prefix_caching=False,
    )
    check_requests(requests, engine["max_len"], sched)  # what the engine would refuse
    # one shape over the calibration runs (each at its own speed: the machine's moves between
    # runs), at their median speed; the served runs (after them) left out
    calib, served = runs[: engine["calibration_runs"]], runs[engine["calibration_runs"] :]
    try:
        mean, fit, _ = FittedStepTime.fit_runs(calib, engine["buckets"], names=engine["features"])
    except KvjaxError as exc:  # a hand-made file: named, with what its steps lack
        raise KvjaxError(f"--steps {args.steps}: its calibration runs: {exc}") from None
    step = mean.scaled(1.0, fit.spread, args.seed)
    if args.concurrency:  # a closed loop of clients on the one engine
        result = closed_loop(requests, [sched], step, args.concurrency)
    else:
        result = simulate(requests, sched, step)
    out = report(result, args.slo_ttft, args.slo_itl)
    out.update(
        model=cfg.name,
        chip=engine["device"],
        **({"concurrency": args.concurrency} if args.concurrency else {}),
        disaggregated=False,
        rate_requests_per_s=args.rate if not args.trace else None,
        kv_pool_tokens=engine["kv_pool_tokens"] // page * page,
        kv_pool_pages=engine["kv_pool_tokens"] // page,
        page_size=page,
        max_batch=engine["max_batch"],
        token_budget=engine["token_budget"],
        chunked_prefill=True,
        whole_prefill_reason=None,
        step_time=STEP_TIMES["fitted"],
        fit={
            "steps": fit.steps,
            "coefficients_s": fit.coefficients_s,
            "median_relative_error": fit.median_relative_error,
            "calibration_runs": len(calib),
            # measured / fitted time of each served run left out of the fit (1: as fitted)
            "served_speed": [mean.speed(run) for run in served],
        },
    )
    return out
