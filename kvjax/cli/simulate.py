"""`kvjax simulate`: requests arriving at a rate, served by kvjax's scheduler on a chip whose step
times are the closed form's bounds, or their prediction from published measurements, or on the
engine of a `kvjax serve --save-steps` file with step times fitted to its steps
(`kvjax.serving`): per-request TTFT, ITL and end-to-end times, throughput, goodput under an SLO,
preemptions, the KV pool in pages and tokens."""

from __future__ import annotations

import argparse
from typing import Any

from kvjax.cli.args import (
    add_chip_args,
    add_model_args,
    emit,
    fraction,
    positive_float,
    positive_int,
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
    add_load_args(p)
    s = add_engine_args(p)
    s.add_argument(
        "--memory-utilization",
        type=positive_float,
        default=0.9,
        help="share of the chip's memory the engine takes (default 0.9)",
    )
    s.add_argument("--no-prefix-caching", action="store_true")
    s.add_argument("--replicas", type=positive_int, default=1,
                   help="copies of the deployment behind a router, each its own scheduler and "
                   "pool")  # fmt: skip
    s.add_argument("--route", choices=ROUTES, default="round-robin",
                   help="with --replicas: round-robin (the i-th arrival to copy i mod N) or "
                   "least-loaded (to the copy with the fewest unfinished requests)")  # fmt: skip
    s.add_argument("--admission", choices=("recompute", "reserve"), default="recompute",
                   help="recompute: pages as a request grows, the last admitted preempted when "
                   "they run out (vLLM; default); reserve: admitted only with pages for its "
                   "prompt and all its output (TensorRT-LLM's GUARANTEED_NO_EVICT)")  # fmt: skip
    s.add_argument("--tp", type=positive_int, default=None,
                   help="tensor-parallel chips serving as one (each step a device's shard, then "
                   "its all-reduces over the link); default: 1, or the fewest of 2, 4, 8 that "
                   "hold the model when one chip does not (said in the output)")  # fmt: skip
    s.add_argument(
        "--pp",
        type=positive_int,
        default=1,
        help="pipeline stages, pp micro-batches in flight (kvjax.serving.placed)",
    )
    s.add_argument(
        "--dp-attention",
        type=positive_int,
        default=1,
        metavar="D",
        help="data-parallel attention groups, each an engine copy; with --ep D",
    )
    s.add_argument(
        "--ep",
        type=positive_int,
        default=1,
        help="expert parallelism over the --dp-attention D devices (tp = 1)",
    )
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
    s.add_argument("--spec-tokens", type=positive_int, default=0, metavar="K",
                   help="speculative decoding (DeepSeek's MTP as the draft): each decode "
                   "verifies K drafted tokens in its step, keeping them up to the first "
                   "rejected")  # fmt: skip
    s.add_argument("--acceptance", type=fraction, default=None, metavar="A",
                   help="with --spec-tokens: each draft's acceptance probability")  # fmt: skip
    c = p.add_argument_group("cost and disaggregation")
    c.add_argument("--price-per-chip-hour", type=positive_float, default=None, metavar="USD",
                   help="cost per million output tokens at this price (energy: the chip's rated "
                   "power)")  # fmt: skip
    c.add_argument("--disaggregate", action="store_true", help="prefill on one chip, decode on "
                   "another, the prompt's KV over the link between")  # fmt: skip
    c.add_argument("--link-gb-per-s", type=positive_float, default=None, help="the KV "
                   "transfer's bandwidth, GB/s (default: the chip's interconnect)")  # fmt: skip
    c.add_argument("--link-latency-us", type=float, default=0.0, help="per transfer (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return emit(args, simulate_report(args), print_simulation)


def simulate_report(args: argparse.Namespace) -> dict[str, Any]:
    from kvjax.analytic.params import weight_bytes
    from kvjax.serving import placed as placed_step
    from kvjax.serving.cost import energy_and_cost
    from kvjax.serving.disagg import kv_transfer_s, simulate_disaggregated
    from kvjax.serving.memory import kv_pool, whole_prefill_reason
    from kvjax.serving.pages import PagePool
    from kvjax.serving.router import simulate_replicas
    from kvjax.serving.scheduler import Scheduler
    from kvjax.serving.simulate import report
    from kvjax.serving.step_time import STEP_MODELS

    cfg = resolve_model(args)
    if bool(args.spec_tokens) != (args.acceptance is not None):
        raise KvjaxError("speculative decoding needs --spec-tokens K and --acceptance A together")
    if args.spec_tokens and (args.disaggregate or args.steps is not None):
        raise KvjaxError("--spec-tokens runs on one colocated engine (not with --disaggregate or "
                         "--step-time fitted)")  # fmt: skip
    if (args.step_time == "fitted") != (args.steps is not None):
        raise KvjaxError("--step-time fitted and --steps JSON go together (one without the other)")
    placed = args.pp > 1 or args.ep > 1 or args.dp_attention > 1
    if args.steps is not None and (placed or args.tp or args.replicas > 1):
        raise KvjaxError("--step-time fitted runs the one engine that measured --steps (not "
                         "with --tp/--pp/--ep/--dp-attention/--replicas)")  # fmt: skip
    if args.tp and args.tp > 1 and args.ep > 1:
        raise KvjaxError(f"--tp {args.tp} with --ep {args.ep}: expert parallelism is modelled over "
                         "data-parallel attention groups of one chip each (tp = 1)")  # fmt: skip
    requests = load_requests(args)
    if args.steps is not None:
        return fitted_report(args, cfg, requests)
    chip = resolve_chip(args, cfg)
    longest = max(r.prompt_len + r.output_len for r in requests)
    # no closed-form extend for sliding-window or state layers: prompts prefilled whole (the
    # budget raised to the longest request, as an engine without chunked prefill runs)
    whole = whole_prefill_reason(cfg)
    budget = max(args.token_budget, longest - 1) if whole else args.token_budget
    if args.disaggregate and (args.tp or args.replicas > 1 or placed):
        raise KvjaxError("--tp/--pp/--ep/--dp-attention/--replicas and --disaggregate do not go "
                         "together (one chip an instance)")  # fmt: skip
    if args.ep != args.dp_attention or (args.pp > 1 and args.ep > 1):
        raise KvjaxError(
            f"--ep {args.ep} --dp-attention {args.dp_attention} --pp {args.pp}: "
            "experts spread over the data-parallel attention groups, --ep D "
            "--dp-attention D, without --pp (--dp-attention alone is --replicas)"
        )
    # no --tp and weights one chip cannot hold: the fewest of 2, 4, 8 that hold --max-batch
    # requests at once (else the fewest that hold any), as `kvjax frontier` chooses
    auto = not (args.tp or args.disaggregate or placed) and chip.memory_bytes is not None and (
        weight_bytes(cfg) >= args.memory_utilization * chip.memory_bytes)  # fmt: skip
    tp, tp_note, dev, fits = args.tp or 1, None, cfg, None
    for tp in [2, 4, 8] if auto else [args.tp or 1]:
        dev, held = placed_step.device_configs(cfg, tp, args.pp, args.ep)
        try:
            pool = kv_pool(held, chip, args.page_size, budget, longest,
                           args.memory_utilization, max_batch=args.max_batch)  # fmt: skip
        except KvjaxError:
            if not auto or (tp == 8 and fits is None):
                raise
            continue
        fits = fits or (tp, dev, pool)
        if not auto or pool.tokens >= args.max_batch * longest:
            break
    else:  # no placement holds --max-batch requests at once: the fewest that holds one
        tp, dev, pool = fits
    if auto:
        tp_note = (f"no --tp given and one {chip.name} cannot hold the weights: tp={tp}, the "
                   f"fewest of 2, 4, 8 whose pool holds --max-batch {args.max_batch} requests of "
                   f"{longest} tokens (or any)")  # fmt: skip

    def scheduler():  # an engine copy (a micro-batch of pp shares a stage's cache)
        return Scheduler(PagePool(pool.pages // args.pp, pool.page_size), args.max_batch, budget,
                         prefix_caching=not (args.no_prefix_caching or whole),
                         chunked_prefill=not whole, reserve=args.admission == "reserve",
                         spec_tokens=args.spec_tokens,
                         acceptance=args.acceptance or 0.0)  # fmt: skip

    sched = scheduler()
    step = STEP_MODELS[args.step_time](dev, chip)
    step = placed_step.placed_step(step, cfg, chip, tp, args.pp, args.ep,
                                   achieved=args.step_time != "bound")  # fmt: skip
    chips = tp
    if args.disaggregate:
        link = args.link_gb_per_s * 1e9 if args.link_gb_per_s else chip.interconnect_bytes_per_s
        if not link:
            raise KvjaxError(
                f"chip {chip.name!r} has no interconnect bandwidth; give --link-gb-per-s"
            )
        decode = Scheduler(PagePool(pool.pages, pool.page_size), args.max_batch, budget,
                           prefix_caching=False, chunked_prefill=not whole)  # fmt: skip
        move = kv_transfer_s(pool.bytes_per_token, link, args.link_latency_us * 1e-6)
        result = simulate_disaggregated(requests, sched, decode, step, step, move)
        chips = 2
    else:  # copies behind a router (kvjax.serving.router)
        n = args.replicas * args.pp * args.dp_attention
        copies = [sched] + [scheduler() for _ in range(n - 1)]
        result = simulate_replicas(requests, copies, step, args.route)
        chips = tp * args.pp * args.dp_attention * args.replicas
    out = report(result, args.slo_ttft, args.slo_itl)
    out.update(energy_and_cost(out["output_tokens"], out["duration_s"], chips, chip.power_watts,
                               args.price_per_chip_hour))  # fmt: skip
    out["disaggregated"] = bool(args.disaggregate)
    out.update(
        tp=tp,
        tp_note=tp_note,
        replicas=args.replicas,
        route=args.route,
        pp=args.pp,
        ep=args.ep,
        dp_attention=args.dp_attention,
        chips=chips,
    )
    out.update(
        model=cfg.name, chip=chip.name, rate_requests_per_s=args.rate if not args.trace else None,
        kv_pool_tokens=pool.tokens, kv_pool_pages=pool.pages, page_size=pool.page_size,
        kv_bytes_per_token=pool.bytes_per_token, weight_bytes=pool.weight_bytes,
        activation_bytes=pool.activation_bytes, reserve_bytes=pool.reserve_bytes,
        slot_bytes_per_request=pool.slot_bytes, token_budget=budget,
        chunked_prefill=not whole, whole_prefill_reason=whole,
        step_time=STEP_TIMES[args.step_time],
    )  # fmt: skip
    return out


def fitted_report(args: argparse.Namespace, cfg, requests) -> dict[str, Any]:
    """The simulator on the engine that measured `--steps`: its slots, token budget, pool and
    chunk buckets, no prefix caching (the engine has none); each step the mean of the fit to the
    calibration runs (their shape, at their median speed) times one of their measured/fitted
    ratios drawn (seeded by --seed). The served run is left out of the fit: its speed against
    the fit is reported (`fit.served_speed`), so a simulation of the served load is an out of
    sample prediction of it."""
    from kvjax.measured.engine import check_requests
    from kvjax.serving.fitted import FittedStepTime, load_steps
    from kvjax.serving.pages import PagePool
    from kvjax.serving.scheduler import Scheduler
    from kvjax.serving.simulate import report, simulate

    engine, runs = load_steps(args.steps)
    if engine["model"] != cfg.name:
        raise KvjaxError(f"--steps {args.steps} were measured on {engine['model']!r}, not "
                         f"{cfg.name!r}: give --model {engine['model']}")  # fmt: skip
    if args.disaggregate:
        raise KvjaxError("--disaggregate needs a chip (--step-time bound, predicted or kernels)")
    page = engine["page_size"]
    sched = Scheduler(PagePool(engine["kv_pool_tokens"] // page, page), engine["max_batch"],
                      engine["token_budget"], prefix_caching=False)  # fmt: skip
    check_requests(requests, engine["max_len"], sched)  # what the engine would refuse
    # one shape over the calibration runs (each at its own speed: the machine's moves between
    # runs), at their median speed; the served runs (after them) left out
    calib, served = runs[: engine["calibration_runs"]], runs[engine["calibration_runs"] :]
    try:
        mean, fit, _ = FittedStepTime.fit_runs(calib, engine["buckets"], names=engine["features"])
    except KvjaxError as exc:  # a hand-made file: named, with what its steps lack
        raise KvjaxError(f"--steps {args.steps}: its calibration runs: {exc}") from None
    step = mean.scaled(1.0, fit.spread, args.seed)
    out = report(simulate(requests, sched, step), args.slo_ttft, args.slo_itl)
    out.update(
        model=cfg.name, chip=engine["device"], disaggregated=False,
        rate_requests_per_s=args.rate if not args.trace else None,
        kv_pool_tokens=engine["kv_pool_tokens"] // page * page,
        kv_pool_pages=engine["kv_pool_tokens"] // page, page_size=page,
        max_batch=engine["max_batch"], token_budget=engine["token_budget"],
        chunked_prefill=True, whole_prefill_reason=None, step_time=STEP_TIMES["fitted"],
        fit={"steps": fit.steps, "coefficients_s": fit.coefficients_s,
             "median_relative_error": fit.median_relative_error,
             "calibration_runs": len(calib),
             # measured / fitted time of each served run left out of the fit (1: as fitted)
             "served_speed": [mean.speed(run) for run in served]},
    )  # fmt: skip
    return out


def print_simulation(r: dict[str, Any]) -> None:
    from rich.table import Table

    from kvjax.cli.render import console
    from kvjax.units import fmt_seconds

    con = console()
    on = f"{r['tp']} x {r['chip']} (tensor parallel)" if r.get("tp", 1) > 1 else r["chip"]
    con.print(
        f"[bold]{r['model']}[/bold] on {on} | KV cache: {r['kv_pool_tokens']:,} tokens "
        f"({r['kv_pool_pages']:,} pages of {r['page_size']}"
        + (", each device its share of the heads" if r.get("tp", 1) > 1 else "")
        + f") | step time: {r['step_time']}"
    )
    if r.get("tp_note"):
        con.print(f"  ({r['tp_note']})")
    if r.get("slot_bytes_per_request"):
        con.print(f"  each running request also holds {r['slot_bytes_per_request']:,} B of "
                  "sliding windows and states (reserved for --max-batch requests)")  # fmt: skip
    fit = r.get("fit")
    if fit:
        served = ", ".join(f"{v:.2f}x" for v in fit["served_speed"]) or "none saved"
        con.print(f"  fitted to {fit['steps']:,} steps of {fit['calibration_runs']} calibration "
                  f"run(s) (median step error {fit['median_relative_error']:.1%}); the served "
                  f"run, left out, ran at {served} the fit's time")  # fmt: skip
    if r.get("whole_prefill_reason"):
        con.print(f"  prompts prefilled whole (token budget {r['token_budget']:,}), no prefix "
                  f"cache: {r['whole_prefill_reason']}")  # fmt: skip
    t = Table(title=f"{r['requests_out']:,} of {r['requests_in']:,} requests served")
    for col in ("", "mean", "P50", "P90", "P99"):
        t.add_column(col, justify="left" if not col else "right")
    for name, key in (("time to first token", "ttft_s"), ("inter-token latency", "itl_s"),
                      ("end to end", "e2e_s")):  # fmt: skip
        s = r[key]
        t.add_row(name, *("-" if s[k] is None else fmt_seconds(s[k])
                          for k in ("mean", "p50", "p90", "p99")))  # fmt: skip
    con.print(t)
    if r.get("disaggregated"):
        con.print("  disaggregated: prefill on one chip, decode on another (2 chips)")
    if r.get("energy_j_per_output_token") is not None:
        price = r.get("cost_per_million_output_tokens")
        con.print(
            f"  energy {r['energy_j_per_output_token']:.3g} J/output token ({r['chips']} x "
            f"{r['power_watts']:g} W for the run)"
            + ("" if price is None else f"; ${price:.3g} per million output tokens")
        )
    slo = r["slo"]
    hit = "-" if r["prefix_hit_rate"] is None else f"{r['prefix_hit_rate']:.1%}"
    limits = [
        f"{name} <= {v} s"
        for name, v in (("TTFT", slo["ttft_s"]), ("ITL P99", slo["itl_p99_s"]))
        if v is not None
    ]
    met = f"{slo['met']} met " + ", ".join(limits) if limits else "no SLO given"
    con.print(
        f"  throughput {r['throughput_tokens_per_s']:,.0f} tokens/s; goodput "
        f"{r['goodput_requests_per_s']:.3g} requests/s ({met}); {r['preemptions']} preemptions; "
        f"peak {r['peak_pages_in_use']:,} pages; prefix hit rate {hit}"
    )
