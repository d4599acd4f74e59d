"""`kvjax serve`: the same load as `kvjax simulate`, served for real on this machine by kvjax's
engine (`kvjax.measured.engine`: the simulator's scheduler on the wall clock, kvjax's Flax model
with random seeded weights, a slotted KV cache): per-request TTFT, ITL and end-to-end times,
throughput, goodput, preemptions, and the compilations after the warm-up (0 expected)."""

from __future__ import annotations

import argparse
from typing import Any

from kvjax.cli.args import add_model_args, emit, positive_int, resolve_model
from kvjax.cli.load_args import add_engine_args, add_load_args, load_requests
from kvjax.cli.render_simulation import print_simulation

DEFAULT_MODEL = "tiny-gqa"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="requests under load served by kvjax's engine on this machine: TTFT, ITL, goodput",
        description="Arrivals in wall time served by the scheduler of `kvjax simulate` running "
        "kvjax's model (random weights) on this machine: a slotted KV cache of --max-batch "
        "slots, chunked prefill padded to power-of-two buckets, greedy decoding, every shape "
        "compiled before the first arrival. Prefix caching is off (slots share no rows).",
    )
    add_model_args(p)
    p.set_defaults(model=DEFAULT_MODEL)
    add_load_args(p, requests=20, prompt="128", output="32")
    s = add_engine_args(p, max_batch=8, token_budget=256)
    s.add_argument(
        "--max-len",
        type=positive_int,
        default=None,
        help="positions a slot holds (default: the longest request's, in whole pages)",
    )
    s.add_argument(
        "--kv-pool-tokens",
        type=positive_int,
        default=None,
        help="the scheduler's pool, if smaller than the slots' --max-batch x --max-len",
    )
    p.add_argument(
        "--save-steps",
        default=None,
        metavar="JSON",
        help="write the measured steps (and the engine's limits) for `kvjax simulate "
        "--step-time fitted --steps JSON`",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return emit(args, serve_report(args), print_simulation)


def serve_report(args: argparse.Namespace) -> dict[str, Any]:
    import jax

    from kvjax.measured.engine import Engine, check_requests, pool_pages
    from kvjax.measured.timing import device_name
    from kvjax.serving.pages import PagePool
    from kvjax.serving.scheduler import Scheduler
    from kvjax.serving.simulate import report

    cfg = resolve_model(args)
    requests = load_requests(args)
    P = args.page_size
    longest = max(r.prompt_len + r.output_len - 1 for r in requests)
    max_len = args.max_len or -(-longest // P) * P
    # refused by name before the model is built or compiled: longer than a slot, then the pool
    check_requests(requests, max_len, None)
    pages = pool_pages(args.max_batch, max_len, P, args.kv_pool_tokens)
    check_requests(requests, max_len, Scheduler(PagePool(pages, P), args.max_batch, 1))
    engine = Engine(
        cfg, args.max_batch, max_len, args.token_budget, P, args.kv_pool_tokens, seed=args.seed
    )
    # with --save-steps, first the calibration (after one left out: the first serve after the
    # compile has outliers of 50 ms): on the step clock, so every coefficient of the step model
    # is determined by its batches, however fast or busy the machine (a served run alone rarely
    # holds them all, and which it holds depends on the machine's speed)
    calibration = None
    if args.save_steps:
        engine.calibrate()
        calibration = engine.calibrate()
    result = engine.serve(requests)
    if args.save_steps:
        from kvjax.serving.steps_file import save_steps

        save_steps(
            args.save_steps,
            {
                "model": cfg.name,
                "device": device_name(),
                "max_batch": args.max_batch,
                "max_len": max_len,
                "token_budget": args.token_budget,
                "page_size": P,
                "kv_pool_tokens": engine.pool_pages * P,
                "buckets": list(engine.buckets),
                "features": list(engine.features),
                "calibration_runs": 1,
            },
            [calibration.measured, result.measured],
        )
    out = report(result, args.slo_ttft, args.slo_itl)
    out.update(
        model=cfg.name,
        chip=device_name(),
        device=device_name(),
        backend=jax.default_backend(),
        jax_version=jax.__version__,
        rate_requests_per_s=args.rate if not args.trace else None,
        kv_pool_tokens=engine.pool_pages * P,
        kv_pool_pages=engine.pool_pages,
        page_size=P,
        max_batch=args.max_batch,
        max_len=max_len,
        token_budget=args.token_budget,
        buckets=list(engine.buckets),
        prefix_caching=False,
        compilations_at_warmup=engine.warm_compilations,
        compilations_after_warmup=result.compilations_after_warmup,
        warmup_s=engine.warmup_s,
        step_time="measured (this machine's wall clock)",
    )
    return out
