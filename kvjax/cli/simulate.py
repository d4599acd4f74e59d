"""`kvjax simulate`: requests arriving at a rate, served by kvjax's scheduler on a chip whose step
times are the closed form's bounds (`kvjax.serving`): per-request TTFT, ITL and end-to-end times,
throughput, goodput under an SLO, preemptions, the KV pool in pages and tokens."""

from __future__ import annotations

import argparse
from typing import Any

from kvjax.cli.args import (
    add_chip_args,
    add_model_args,
    emit,
    positive_float,
    positive_int,
    resolve_chip,
    resolve_model,
)
from kvjax.errors import KvjaxError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="requests under load on a chip: TTFT, ITL, goodput (closed-form step times)",
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
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def add_load_args(p, requests: int = 200, prompt: str = "1024", output: str = "256") -> None:
    """The load both clocks serve (`kvjax simulate`, `kvjax serve`): arrivals and lengths."""
    g = p.add_argument_group("load")
    g.add_argument("--rate", type=positive_float, required=True, help="requests per second")
    g.add_argument(
        "--requests", type=positive_int, default=requests, help=f"how many (default {requests})"
    )
    g.add_argument(
        "--prompt-len",
        default=prompt,
        metavar="L",
        help=f"512, uniform:LO:HI or lognormal:MEDIAN:SIGMA (default {prompt})",
    )
    g.add_argument(
        "--output-len", default=output, metavar="L", help=f"as --prompt-len (default {output})"
    )
    g.add_argument(
        "--arrival-cv",
        type=positive_float,
        default=1.0,
        help="the gaps' coefficient of variation: 1 Poisson, > 1 burstier (gamma)",
    )
    g.add_argument(
        "--prefix-len",
        type=positive_int,
        default=None,
        help="a shared system prompt of N tokens ...",
    )
    g.add_argument(
        "--prefix-share",
        type=float,
        default=1.0,
        help="... that this fraction of the requests begins with (default 1)",
    )
    g.add_argument(
        "--trace",
        default=None,
        metavar="CSV",
        help="arrival_s,prompt_len,output_len per request, instead of the above",
    )
    g.add_argument("--seed", type=int, default=0)


def add_engine_args(p, max_batch: int = 256, token_budget: int = 2048):
    """The scheduler's limits and the SLO both clocks are judged by; returns the group."""
    s = p.add_argument_group("engine")
    s.add_argument(
        "--max-batch",
        type=positive_int,
        default=max_batch,
        help=f"running requests at most (default {max_batch})",
    )
    s.add_argument(
        "--token-budget",
        type=positive_int,
        default=token_budget,
        help=f"tokens a step computes at most (chunked prefill; default {token_budget})",
    )
    s.add_argument("--page-size", type=positive_int, default=16, help="tokens a page (default 16)")
    s.add_argument(
        "--slo-ttft",
        type=positive_float,
        default=None,
        metavar="S",
        help="goodput: time to first token at most S seconds",
    )
    s.add_argument(
        "--slo-itl",
        type=positive_float,
        default=None,
        metavar="S",
        help="goodput: a request's P99 inter-token latency at most S seconds",
    )
    return s


def load_requests(args: argparse.Namespace):
    """The requests of `add_load_args`' flags: the trace, or generated from the seed."""
    from kvjax.serving import load

    if args.trace:
        return load.read_trace(args.trace)
    if not 0 <= args.prefix_share <= 1:
        raise KvjaxError(f"--prefix-share {args.prefix_share} must lie in [0, 1]")
    return load.generate(
        args.requests, args.rate, args.prompt_len, args.output_len, args.seed,
        args.arrival_cv, args.prefix_len or 0, args.prefix_share if args.prefix_len else 0.0,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    return emit(args, simulate_report(args), print_simulation)


def simulate_report(args: argparse.Namespace) -> dict[str, Any]:
    from kvjax.serving.memory import kv_pool
    from kvjax.serving.pages import PagePool
    from kvjax.serving.scheduler import Scheduler
    from kvjax.serving.simulate import report, simulate
    from kvjax.serving.step_time import ClosedFormStepTime

    cfg = resolve_model(args)
    chip = resolve_chip(args, cfg)
    requests = load_requests(args)
    longest = max(r.prompt_len + r.output_len for r in requests)
    pool = kv_pool(cfg, chip, args.page_size, args.token_budget, longest, args.memory_utilization)
    sched = Scheduler(PagePool(pool.pages, pool.page_size), args.max_batch, args.token_budget,
                      prefix_caching=not args.no_prefix_caching)  # fmt: skip
    result = simulate(requests, sched, ClosedFormStepTime(cfg, chip))
    out = report(result, args.slo_ttft, args.slo_itl)
    out.update(
        model=cfg.name, chip=chip.name, rate_requests_per_s=args.rate if not args.trace else None,
        kv_pool_tokens=pool.tokens, kv_pool_pages=pool.pages, page_size=pool.page_size,
        kv_bytes_per_token=pool.bytes_per_token, weight_bytes=pool.weight_bytes,
        activation_bytes=pool.activation_bytes, step_time="closed form (sum of kernel bounds)",
    )  # fmt: skip
    return out


def print_simulation(r: dict[str, Any]) -> None:
    from rich.table import Table

    from kvjax.cli.render import console
    from kvjax.units import fmt_seconds

    con = console()
    con.print(
        f"[bold]{r['model']}[/bold] on {r['chip']} | KV cache: {r['kv_pool_tokens']:,} tokens "
        f"({r['kv_pool_pages']:,} pages of {r['page_size']}) | step time: {r['step_time']}"
    )
    t = Table(title=f"{r['requests_out']:,} of {r['requests_in']:,} requests served")
    for col in ("", "mean", "P50", "P90", "P99"):
        t.add_column(col, justify="left" if not col else "right")
    for name, key in (("time to first token", "ttft_s"), ("inter-token latency", "itl_s"),
                      ("end to end", "e2e_s")):  # fmt: skip
        s = r[key]
        t.add_row(name, *("-" if s[k] is None else fmt_seconds(s[k])
                          for k in ("mean", "p50", "p90", "p99")))  # fmt: skip
    con.print(t)
    slo = r["slo"]
    hit = "-" if r["prefix_hit_rate"] is None else f"{r['prefix_hit_rate']:.1%}"
    con.print(
        f"  throughput {r['throughput_tokens_per_s']:,.0f} tokens/s; goodput "
        f"{r['goodput_requests_per_s']:.3g} requests/s ({slo['met']} met TTFT <= "
        f"{slo['ttft_s']} s, ITL P99 <= {slo['itl_p99_s']} s); {r['preemptions']} preemptions; "
        f"peak {r['peak_pages_in_use']:,} pages; prefix hit rate {hit}"
    )
