"""Goodput under load (issue 41): requests arriving at a rate, served by kvjax's scheduler
(`kvjax.serving`: token budget, chunked prefill, paged KV with prefix caching and preemption by
recompute) on a chip whose steps take the closed form's bound (or, with `options.step_time:
predicted`, what the published engine steps' fit predicts: `kvjax.serving.step_time`), for each
attention variant of the model (MHA, GQA, MQA, MLA) at the point's KV dtype.

`options.prefix_len` tokens of a shared system prompt begin a fraction `options.prefix_share` of
the prompts (their pages found in the prefix cache; the other prompts have as many tokens of their
own, so every prompt is prefix_len + prompt_len long), and `options.page_size` sets the pages.
Per variant, one record per arrival rate of `options.rates` (Poisson arrivals, the same seed: the
same requests, their gaps scaled) with TTFT/ITL percentiles, throughput, goodput, preemptions,
energy and cost per output token (`options.mla_ranks`: MLA curves at these latent widths too, e.g.
the width whose cache equals GQA's); and one record at the knee: the largest rate at which at least
`options.attainment` of the requests meet the SLO (TTFT <= slo_ttft_s and their own ITL P99 <=
slo_itl_s; DistServe's goodput, Zhong et al. 2024), found by bisection to `options.knee_rtol`.
Beside each, the quality the variant and the KV dtype cost in the committed quality results
(`experiments/results/quality_differences.csv`, the 8-head stdlib model, mapped by
`kvjax.quality.costs`: a variant to its h_kv of the same query heads per KV head, MLA to the
committed latent width of the nearest share of MHA's cache, fp8 to its "fp8 cache - f32"
difference).
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

from kvjax.analytic.variants import mla_variant, variant_configs
from kvjax.errors import KvjaxError
from kvjax.quality import costs
from kvjax.runs import options as o
from kvjax.runs.config import resolve
from kvjax.runs.options import Option
from kvjax.serving import load
from kvjax.serving.cost import energy_and_cost
from kvjax.serving.memory import kv_pool
from kvjax.serving.pages import PagePool
from kvjax.serving.scheduler import Scheduler
from kvjax.serving.simulate import report, simulate
from kvjax.serving.step_time import ClosedFormStepTime, PredictedStepTime

# each step as long as the closed form's bound, or as the published engine steps' fit predicts
STEP_TIMES = {
    "bound": (ClosedFormStepTime, "closed form (simulated)"),
    "predicted": (PredictedStepTime, "predicted from published measurements (simulated)"),
}

OPTIONS = {
    "rates": o.list_of(o.POSITIVE),
    "requests": o.POSITIVE_INT,
    "prompt_len": o.POSITIVE_INT,
    "output_len": o.POSITIVE_INT,
    "slo_ttft_s": o.POSITIVE,
    "slo_itl_s": o.POSITIVE,
    "attainment": o.FRACTION,
    "knee_rtol": o.FRACTION,
    "max_batch": o.POSITIVE_INT,
    "token_budget": o.POSITIVE_INT,
    "page_size": o.POSITIVE_INT,
    "prefix_len": o.NONNEGATIVE_INT,
    "prefix_share": Option(
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1,
        "a number in [0, 1]",
    ),
    "price_per_chip_hour": o.POSITIVE,
    "variants": o.BOOLEAN,
    "mla_ranks": o.list_of(o.POSITIVE_INT),
    "seed": o.NONNEGATIVE_INT,
    "figure": o.BOOLEAN,
    "step_time": Option(lambda v: v in STEP_TIMES, f"one of {sorted(STEP_TIMES)}"),
}
QUALITY = Path(__file__).resolve().parent / "results" / "quality_differences.csv"


def run_point(point) -> list[dict]:
    cfg, _, chip = resolve(point)
    opt = {"rates": [0.5, 1, 2, 4], "requests": 200, "prompt_len": 8192, "output_len": 256,
           "slo_ttft_s": 2.0, "slo_itl_s": 0.05, "attainment": 0.9, "knee_rtol": 0.02,
           "max_batch": 256, "token_budget": 2048, "page_size": 16, "price_per_chip_hour": None,
           "prefix_len": 0, "prefix_share": 0.0, "step_time": "bound", "figure": True,
           "variants": True, "seed": 0, **point.options}  # fmt: skip
    if opt["variants"]:
        curves = [(label, v) for label, _, v, _ in variant_configs(cfg) if v is not None]
    else:
        curves = [(cfg.attention_variant, cfg)]
    for A in opt.get("mla_ranks", []):  # MLA at other latent widths (e.g. another variant's bytes)
        mla = mla_variant(cfg).replace(kv_lora_rank=A)
        curves.append((f"MLA A={A} P={mla.qk_rope_head_dim}", mla))
    records = []
    for label, variant in curves:
        run = _runner(variant, chip, opt)
        common = {
            "model": cfg.name, "variant": label, "num_kv_heads": variant.num_kv_heads,
            "kv_dtype": variant.kv_dtype, "attention_kernel": variant.attention_kernel,
            "chip": chip.name, "prompt_len": opt["prompt_len"], "output_len": opt["output_len"],
            "requests": opt["requests"], "slo_ttft_s": opt["slo_ttft_s"],
            "slo_itl_s": opt["slo_itl_s"], "page_size": opt["page_size"],
            "token_budget": opt["token_budget"],
            "prefix_len": opt["prefix_len"], "prefix_share": opt["prefix_share"],
            "variants_compared": bool(opt["variants"]),
            "in_goodput_figure": bool(opt["figure"]),
            "source": STEP_TIMES[opt["step_time"]][1],
            **quality_cost(variant),
        }  # fmt: skip
        for rate in opt["rates"]:
            records.append({**common, **run(rate), "knee": False})
        knee = knee_rate(run, opt["attainment"], opt["knee_rtol"], max(opt["rates"]))
        records.append({**common, **knee, "knee": True})
    return records


def _runner(cfg, chip, opt):
    step = STEP_TIMES[opt.get("step_time", "bound")][0](cfg, chip)
    longest = opt["prompt_len"] + opt.get("prefix_len", 0) + opt["output_len"]
    pool = kv_pool(cfg, chip, opt["page_size"], opt["token_budget"], longest)

    @cache
    def run(rate: float) -> dict:
        reqs = load.generate(opt["requests"], rate, str(opt["prompt_len"]),
                             str(opt["output_len"]), opt["seed"], 1.0, opt.get("prefix_len", 0),
                             opt.get("prefix_share", 0.0))  # fmt: skip
        for r in reqs:  # every prompt equally long: the others' first tokens are their own
            if r.prefix_id is None:
                r.prompt_len += opt.get("prefix_len", 0)
        sched = Scheduler(PagePool(pool.pages, pool.page_size), opt["max_batch"],
                          opt["token_budget"])  # fmt: skip
        r = report(simulate(reqs, sched, step), opt["slo_ttft_s"], opt["slo_itl_s"])
        cost = energy_and_cost(r["output_tokens"], r["duration_s"], 1, chip.power_watts,
                               opt["price_per_chip_hour"])  # fmt: skip
        return {
            "rate_requests_per_s": rate, "attainment": r["slo"]["met"] / r["requests_in"],
            "goodput_requests_per_s": r["goodput_requests_per_s"],
            "throughput_tokens_per_s": r["throughput_tokens_per_s"],
            **{f"ttft_{k}_s": r["ttft_s"][k] for k in ("p50", "p90", "p99")},
            **{f"itl_{k}_s": r["itl_s"][k] for k in ("p50", "p90", "p99")},
            "preemptions": r["preemptions"], "kv_pool_tokens": pool.tokens,
            "requests_out": r["requests_out"], "prefix_hit_rate": r["prefix_hit_rate"],
            "energy_j_per_output_token": cost["energy_j_per_output_token"],
            "cost_per_million_output_tokens": cost["cost_per_million_output_tokens"],
        }  # fmt: skip

    return run


def knee_rate(run, attainment: float, rtol: float, start: float) -> dict:
    """The largest rate whose attainment is at least `attainment`: doubled (or halved) from
    `start` until it brackets the change, then bisected until the bracket is within rtol."""
    rate = start
    ok = run(rate)["attainment"] >= attainment
    lo, hi = (rate, None) if ok else (None, rate)
    for _ in range(30):  # up while the SLO holds, down while it fails, until both are seen
        if lo is not None and hi is not None:
            break
        rate = rate * 2 if ok else rate / 2
        ok = run(rate)["attainment"] >= attainment
        lo, hi = (rate, hi) if ok else (lo, rate)
    if lo is None:
        raise KvjaxError(f"no arrival rate down to {rate:g}/s meets the SLO for {attainment:.0%}")
    if hi is None:
        raise KvjaxError(f"every rate up to {rate:g}/s meets the SLO: raise options.rates")
    while hi - lo > rtol * lo:
        mid = math.sqrt(lo * hi)
        if run(mid)["attainment"] >= attainment:
            lo = mid
        else:
            hi = mid
    return run(lo)


def quality_cost(cfg) -> dict:
    """The committed quality difference of cfg's attention variant and of its cache dtype (mean
    and 95% interval, val loss in nats per byte; `kvjax.quality.costs`), None where none is
    committed."""
    out = {"quality_variant": None, "quality_variant_delta": None, "quality_variant_low": None,
           "quality_variant_high": None, "quality_kv_dtype": None, "quality_kv_dtype_delta": None,
           "quality_kv_dtype_low": None, "quality_kv_dtype_high": None}  # fmt: skip
    cost = costs.quality_cost(cfg, QUALITY)
    variant, cache = cost.part("variant"), cost.part("cache")
    if variant:
        out.update(quality_variant=f"stdlib {variant[1]}", **_delta("variant", variant))
    elif cost.missing and not cost.missing.startswith("kv_dtype="):
        out["quality_variant"] = cost.missing
    else:
        out.update(quality_variant="MHA (the baseline)", quality_variant_delta=0.0)
    if cache:
        out.update(quality_kv_dtype=f"stdlib {cache[1]}", **_delta("kv_dtype", cache))
    return out


def _delta(kind: str, part: tuple) -> dict:
    return {f"quality_{kind}_delta": part[2], f"quality_{kind}_low": part[3],
            f"quality_{kind}_high": part[4]}  # fmt: skip
