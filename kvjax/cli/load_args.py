"""The flags both clocks share (`kvjax simulate`, `kvjax serve`): the load (arrivals and
lengths, or a trace) and the engine's limits and SLO; the requests they describe."""

from __future__ import annotations

import argparse

from kvjax.cli.arg_types import positive_float, positive_int
from kvjax.cli.args import add_serving_args
from kvjax.errors import KvjaxError


def add_load_args(
    p, requests: int = 200, prompt: str = "1024", output: str = "256", closed_loop: bool = False
) -> None:
    """The load both clocks serve (`kvjax simulate`, `kvjax serve`): arrivals and lengths;
    `closed_loop`: or --concurrency clients, each sending its next request when one finishes."""
    g = p.add_argument_group("load")
    if not closed_loop:
        g.add_argument("--rate", type=positive_float, required=True, help="requests per second")
    else:
        one = g.add_mutually_exclusive_group(required=True)
        one.add_argument("--rate", type=positive_float, help="requests per second (open loop)")
        one.add_argument(
            "--concurrency",
            type=positive_int,
            metavar="C",
            help="a closed loop of C clients: the first C requests sent at once, each later one "
            "when one finishes (vllm bench serve --max-concurrency, genai-perf, trtllm-bench "
            "--concurrency)",
        )
    g.add_argument(
        "--requests", type=positive_int, default=requests, help=f"how many (default {requests})"
    )
    g.add_argument(
        "--prompt-len",
        default=prompt,
        metavar="L",
        help=f"512, uniform:LO:HI, lognormal:MEDIAN:SIGMA or sample:FILE (default {prompt})",
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


def add_engine_args(
    p,
    max_batch: int = 256,
    token_budget: int = 2048,
    speculative: bool = False,
    profiles: bool = False,
):
    """The scheduler's limits (pages of 16 tokens; `speculative`: drafted tokens a step) and the
    SLO both clocks are judged by; returns the group. `profiles`: the limits default to None, an
    --engine's defaults (`kvjax.serving.engine_profiles`) or else these, resolved by the
    command."""
    s = p.add_argument_group("engine")
    said = "the --engine's, else " if profiles else ""
    s.add_argument(
        "--max-batch",
        type=positive_int,
        default=None if profiles else max_batch,
        help=f"running requests at most (default {said}{max_batch})",
    )
    s.add_argument(
        "--token-budget",
        type=positive_int,
        default=None if profiles else token_budget,
        help=f"tokens a step computes at most (chunked prefill; default {said}{token_budget})",
    )
    add_serving_args(s, page_size=None if profiles else 16, speculative=speculative, draft=False)
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
        if getattr(args, "concurrency", None):
            raise KvjaxError("--trace gives each request's arrival: not with --concurrency")
        return load.read_trace(args.trace)
    if not 0 <= args.prefix_share <= 1:
        raise KvjaxError(f"--prefix-share {args.prefix_share} must lie in [0, 1]")
    return load.generate(
        args.requests,
        args.rate or 1.0,  # a closed loop sets the arrivals itself
        args.prompt_len,
        args.output_len,
        args.seed,
        args.arrival_cv,
        args.prefix_len or 0,
        args.prefix_share if args.prefix_len else 0.0,
    )
