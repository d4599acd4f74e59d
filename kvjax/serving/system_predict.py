"""The prediction beside a published serving system's bound (issue 50): kvjax's simulator on the
row's deployment, each step predicted from its kernels (`kvjax.predict.steps`: GEMMs and fused
attention by the corpus's kernel classes, a fixed time per layer fitted on published engine
steps), the scheduler as the row's engine runs it where kvjax knows how. Held out: a row whose
source group also published kernels or engine steps (TensorRT-LLM: engine steps) is predicted by
fits that left that group out, so no number it is judged against went into it; its 80% interval
is the held-out steps' nested interval (a throughput's ends are the step time's, inverted).

Why not the `step` class (t0 + max(F / (e_c P), Q / (e_b BW)) on the step's totals): without
TensorRT-LLM's steps every published step is a memory-bound decode, e_c is unidentified (1), and
it predicted TensorRT-LLM's compute-bound rows up to 2.1x fast (34.5% median error, 44 rows).

What it covers: offline rows (every request at once), fixed-rate rows (Poisson arrivals at the
rate) and fixed-concurrency rows, their output tokens/s, mean TTFT or mean TPOT; MLPerf's Server
and Interactive rows' output tokens/s (the largest Poisson rate whose P99 TTFT and TPOT hold,
bisected); fixed lengths (`input_len`, `output_len`) or a dataset's mean prompt with the run's
own mean output; a replica's placement (tensor, pipeline, expert and data-parallel attention,
`kvjax.serving.placed`); dense and MoE models, NVFP4 weights at 4.5 bits; on the engines of
`ENGINES`. TensorRT-LLM's rows run as `trtllm-bench` does: the KV cache reserved whole at
admission (its GUARANTEED_NO_EVICT capacity policy) in 0.9 of the memory the weights and the
largest step leave (kv_cache_free_gpu_mem_fraction), at most 8192 tokens a step (its
max_num_tokens default) and a batch as large as the memory holds (max batch 4096); at most 3,000
requests simulated (the sources ran 500 to 30,000). Tensor-parallel steps add their all-reduces as
engines reach them (`kvjax.predict.collectives`). Slow to run for every
row, so `experiments/benchmarks/system_predictions.py` runs it and commits the results, which
`kvjax validate` reads beside the bounds."""

from __future__ import annotations

import math
import time
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvjax.dtypes import dtype_key
from kvjax.hardware import get_chip
from kvjax.model.config import get_model_config
from kvjax.predict.steps import kernel_fits
from kvjax.serving.load import generate
from kvjax.serving.memory import kv_pool
from kvjax.serving.pages import PagePool
from kvjax.serving.scheduler import Scheduler
from kvjax.serving.simulate import report
from kvjax.serving.step_time import KernelStepTime

# a row's source group -> the group of the engine steps it published (left out of its fit)
STEP_GROUPS = {"nvidia-trtllm": "NVIDIA/TensorRT-LLM", "nvidia-trtllm-blog": "NVIDIA/TensorRT-LLM"}
# Each group's engine as its rows ran it. TensorRT-LLM (trtllm-bench): max batch 4096, 8192 tokens
# a step, each request's cache reserved at admission (GUARANTEED_NO_EVICT) in 0.9 of the memory
# the weights and the largest step leave (kv_cache_free_gpu_mem_fraction). AMD's vLLM dev-docker
# table (ROCm/vllm docs/dev-docker/README.md, the rows' `convention`): --max-num-seqs = the
# prompts (`concurrency`), --max-num-batched-tokens 131072, vLLM's default
# gpu_memory_utilization 0.9 of the memory and preemption by recompute.
ENGINES = {
    "nvidia-trtllm": dict(max_batch=4096, token_budget=8192, reserve=True, free=0.9, util=1.0),
    "amd-rocm": dict(max_batch=None, token_budget=131072, reserve=False, free=1.0, util=0.9),
}
# Rows whose source states their own engine settings, by source prefix: TensorRT-LLM's
# DeepSeek-R1 best-practice H200 max-throughput run (its `convention`: trtllm-bench,
# max_batch_size 128 a rank, max_num_tokens 1151, kv_cache_free_gpu_mem_fraction 0.8, ADP).
ROW_ENGINES = {
    "trtllm-bestperf-r1:deepseek-r1:fp8:h200:1k/2k:tp8ep8-adp:max-tput": dict(
        max_batch=128, token_budget=1151, reserve=True, free=0.8, util=1.0
    ),
}
# MLPerf submissions that run TensorRT-LLM ('_TRT' in the system name): the settings their
# configuration files state (`mlperf_engines`: v5.1's and NVIDIA's v4.1), else trtllm-bench's
# defaults above, said per row; the prompt length at the dataset's mean
# (`experiments/published/lengths.csv`) and the output at the run's own mean.
STATED_MLPERF = "the submission's configuration file (experiments/published/mlperf_engines.csv)"
MLPERF_ENGINES_CSV = Path(__file__).parents[2] / "experiments" / "published" / "mlperf_engines.csv"
UNSTATED = "engine settings unstated: TensorRT-LLM's trtllm-bench defaults; lengths at the means"
MAX_REQUESTS = 3000
NVFP4_BITS = 4.5  # NVIDIA's NVFP4: 4-bit e2m1 elements, one fp8 e4m3 scale a block of 16
# a metric -> the simulator report's statistic (TensorRT-LLM's online table: TPOT = mean ITL)
METRICS = {"output_tokens_per_s": None, "ttft_mean_s": ("ttft_s", "mean"),
           "tpot_mean_s": ("itl_s", "mean")}  # fmt: skip
# MLPerf's Server and Interactive scenarios: Poisson arrivals at the largest rate whose TTFT and
# TPOT (a request's time after its first token over its other tokens) hold at the percentile
SLO_SCENARIOS = ("server", "interactive")
SLO_REQUESTS = 1000  # a server run's requests: its P99 is the 10th slowest
SLO_STEPS = 8  # bisections of the rate's 16x bracket on a log scale: within 1.1%


def engine_of(row: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The engine settings the row ran (None: unknown) and where they come from."""
    for prefix, engine in ROW_ENGINES.items():
        if row["source"].startswith(prefix):
            return engine, "the row's stated settings"
    if row["source_group"] in ENGINES:
        return ENGINES[row["source_group"]], "the group's engine"
    if row["source_group"].startswith("mlperf-") and "_TRT" in row["source"]:
        stated = mlperf_engines().get(row["source"])
        if stated:
            return stated, STATED_MLPERF
        return ENGINES["nvidia-trtllm"], UNSTATED
    return None, f"no engine settings known for source group {row['source_group']!r}"


@cache
def mlperf_engines() -> dict[str, dict[str, Any]]:
    """MLPerf TensorRT-LLM rows' engine settings by source, as their configuration files state
    them (experiments/published/mlperf_engines.csv, `experiments/extract_mlperf_engines.py`):
    the max batch, the tokens a step, and TensorRT-LLM's scheduler policy: GUARANTEED_NO_EVICT
    reserves each request's cache at admission, MAX_UTILIZATION admits without and pauses a
    request when the cache runs out (kvjax: preemption by recompute)."""
    if not MLPERF_ENGINES_CSV.exists():
        return {}
    return {
        r["source"]: dict(
            max_batch=int(r["max_batch"]), token_budget=int(r["max_num_tokens"]),
            reserve=r["batch_scheduler_policy"] != "max_util",
            free=float(r["kvcache_free_gpu_mem_frac"] or 0.9), util=1.0,
        )
        for r in pd.read_csv(MLPERF_ENGINES_CSV, keep_default_na=False).to_dict("records")
    }  # fmt: skip


def lengths_of(row: dict[str, Any]) -> tuple[int, int] | None:
    """The row's prompt and output lengths: fixed ones, or a dataset's means (the output the
    run's own mean where the row states it: MLPerf's tokens/s over samples/s)."""
    from kvjax.serving.systems import read_lengths

    dist = row["length_distribution"] or ""
    if dist.startswith("fixed") and row["input_len"] and row["output_len"]:
        return int(row["input_len"]), int(row["output_len"])
    stats = read_lengths().get(dist)
    output = row["output_len"] or (stats or {}).get("output_mean")
    if stats and stats["input_mean"] and output:
        return round(stats["input_mean"]), round(output)
    return None


def placement_of(row: dict[str, Any]) -> tuple[int, int, int]:
    """(tp, pp, ep) of one replica; data-parallel attention rows (TensorRT-LLM's ADP: tp ranks
    each its own attention group, experts over all of them) as ep groups of tp = 1."""
    if str(row["dp_attention"]).lower() == "true":
        return 1, row["pp"] or 1, row["ep"] or row["tp"] or 1
    return row["tp"] or 1, row["pp"] or 1, row["ep"] or 1


def why_not(row: dict[str, Any]) -> str | None:
    """Why the simulator cannot run this row (None: it can)."""
    engine, why = engine_of(row)
    if engine is None:
        return why
    if row["scenario"] in SLO_SCENARIOS:
        if row["metric"] != "output_tokens_per_s" or not (row["slo_ttft_s"] and row["slo_tpot_s"]):
            return "server and interactive rows: only output tokens/s under both stated SLOs"
        if row["chip"] not in kernel_chips():
            return (
                f"server and interactive rows are searched only on chips whose prefill, decode "
                f"and GEMM kernels are all in the corpus (not {row['chip']}: a search is 17 "
                f"simulations, and the chip's offline rows already show what its missing kernels "
                f"cost)"
            )
    elif row["scenario"] not in ("offline", "rate", "concurrency") or row["metric"] not in METRICS:
        return (
            "only offline, fixed-rate and fixed-concurrency rows of output tokens/s, mean TTFT "
            "or TPOT, and server rows' output tokens/s are simulated"
        )
    if row["scenario"] == "rate" and not row["rate_per_s"]:
        return "a rate row without its rate"
    if row["scope"] not in ("system", "per_chip"):
        return f"scope {row['scope']!r}: only system and per-chip values are simulated"
    if row["scenario"] == "concurrency" and not row["concurrency"]:
        return "a concurrency row without its concurrency"
    adp = str(row["dp_attention"]).lower() == "true"
    if adp and ((row["pp"] or 1) > 1 or not get_model_config(row["model"]).is_moe):
        return "data-parallel attention is simulated with the experts spread over it, without pp"
    if lengths_of(row) is None:
        return "lengths neither fixed nor a distribution with published means"
    if (row["ep"] or 1) > 1 and str(row["dp_attention"]).lower() != "true":
        return "expert parallelism inside tensor parallelism is not simulated"
    tp, pp, ep = placement_of(row)
    if not row["num_chips"] or row["num_chips"] % (tp * pp * ep):
        return "the chips are not whole replicas of the stated placement"
    if not (row["weight_dtype"] and row["compute_dtype"]):
        return "weight or compute dtype not stated"
    return None


@cache
def kernel_chips() -> frozenset[str]:
    """The chips whose fused prefill, decode attention and GEMMs the published kernel corpus all
    measured (experiments/published/*.csv): a server row's search turns on its TTFT, which is
    the prefill's (the B200 has GEMMs and decode in the corpus, not yet its prefill)."""
    from kvjax.predict.corpus import read_corpus

    rows = read_corpus()
    kinds = ("attention_prefill", "attention_decode", "matmul")
    return frozenset.intersection(*(frozenset(r.chip for r in rows if r.kernel == k)
                                    for k in kinds))  # fmt: skip


def predict_row(row: dict[str, Any], fits: dict[str, Any]) -> dict[str, Any]:
    """The simulated value of the row's metric at its scope, its interval, and how it was run."""
    from kvjax.serving import placed
    from kvjax.serving.router import simulate_replicas

    chip = get_chip(row["chip"])
    tp, pp, ep = placement_of(row)
    replicas = row["num_chips"] // (tp * pp * ep)
    # an unstated cache dtype is the weights' (TensorRT-LLM: "If you specify FP8 quantization,
    # the KV cache will automatically be set to FP8 as well", its performance overview)
    stated = {**row, "kv_dtype": row["kv_dtype"] or row["weight_dtype"]}
    dtype = {k: dtype_key(stated[k]) for k in ("weight_dtype", "kv_dtype", "compute_dtype")}
    # NVFP4 weights: an fp8 config whose weights take 4.5 of its 8 bits (e2m1 elements and one
    # e4m3 scale a block of 16); an unstated cache of FP4 weights is fp8 (NVFP4 rows' caches)
    scale = NVFP4_BITS / 8 if dtype["weight_dtype"] == "fp4" else 1.0
    weight = "fp8" if scale != 1 else dtype["weight_dtype"]
    kv = "fp8" if dtype["kv_dtype"] == "fp4" else dtype["kv_dtype"]
    cfg = get_model_config(row["model"], weight_dtype=weight, kv_dtype=kv, attention_kernel="flash",
                           matmul_dtype=dtype["compute_dtype"])  # fmt: skip
    dev, held = placed.device_configs(cfg, tp, pp, ep)
    engine, settings = engine_of(row)
    group = STEP_GROUPS.get(row["source_group"], row["source_group"])
    overhead = fits["held"].get(group) or fits["all"]  # no corpus row of the group: every fit
    step = KernelStepTime(dev, chip, kernel_fits(fits["classes"], group), overhead, scale)
    step = placed.placed_step(step, cfg, chip, tp, pp, ep, achieved=True)
    I, O = lengths_of(row)  # noqa: E741
    # every prompt at the mean: drawing MLPerf's from its dataset (`sample:` lengths,
    # experiments/published/lengths/) moved the v4.1 H200 llama2-70b Server row by 0.1% and
    # its Offline one by 0.2%, at 4-10x the time (cached step costs miss on varied shapes)
    prompts = str(I)
    cap = SLO_REQUESTS if row["scenario"] in SLO_SCENARIOS else MAX_REQUESTS
    n = min(row["requests"] or cap, cap)
    copies = pp * ep  # pp micro-batches in flight, or ep attention groups
    max_batch = engine["max_batch"] or int(row["concurrency"] or n)
    if row["scenario"] == "concurrency":  # at most `concurrency` in flight over the copies
        max_batch = min(max_batch, max(1, int(row["concurrency"]) // (copies * replicas)))
    pool = kv_pool(held, chip, 16, engine["token_budget"], I + O, engine["util"],
                   reserve_bytes=0, max_batch=max_batch, weight_scale=scale)  # fmt: skip
    pages = int(engine["free"] * pool.pages) // pp
    start = time.perf_counter()
    # a replica's share of a rate (the replicas serve the arrivals round-robin)
    rate = row["rate_per_s"] / replicas if row["scenario"] == "rate" else 1e9
    latency = METRICS[row["metric"]]

    def fresh_copies() -> list[Scheduler]:
        return [Scheduler(PagePool(pages, 16), max_batch, engine["token_budget"],
                          prefix_caching=False, reserve=engine["reserve"])
                for _ in range(copies)]  # fmt: skip

    def run(factor: float = 1.0) -> tuple[float, int]:
        """The metric's value and the preemptions, each step `factor` times as long."""
        timed = step if factor == 1 else placed.Scaled(step, factor)
        out = report(simulate_replicas(generate(n, rate, prompts, str(O), 0), fresh_copies(),
                                       timed, "round-robin"))  # fmt: skip
        if latency is not None:
            return out[latency[0]][latency[1]], out["preemptions"]
        value = out["throughput_tokens_per_s"] * replicas
        return (value / row["num_chips"] if row["scope"] == "per_chip" else value,
                out["preemptions"])  # fmt: skip

    if row["scenario"] in SLO_SCENARIOS:
        return {**_slo_prediction(row, step, overhead, fresh_copies, n, prompts, O, replicas),
                **_how(row, group, settings, tp, pp, ep, replicas, I, O, n, max_batch, engine, kv),
                "seconds": time.perf_counter() - start}  # fmt: skip
    value, preemptions = run()
    # the steps' 80% interval on log(measured / predicted) time: offline, every step scales and
    # a latency's ends are the step time's, a throughput's their inverse; at a fixed rate the
    # queue does not scale with the step, so the run is repeated at the interval's two ends
    ends = (math.exp(overhead.lo), math.exp(overhead.hi))
    if row["scenario"] == "rate":
        lo, hi = sorted((run(ends[0])[0], run(ends[1])[0]))
    elif latency:
        lo, hi = value * ends[0], value * ends[1]
    else:
        lo, hi = value / ends[1], value / ends[0]
    return {
        "source": row["source"], "metric": row["metric"], "predicted_value": value,
        "predicted_lo": lo, "predicted_hi": hi, "rate_per_s": rate, "preemptions": preemptions,
        **_how(row, group, settings, tp, pp, ep, replicas, I, O, n, max_batch, engine, kv),
        "seconds": time.perf_counter() - start,
    }  # fmt: skip


def _how(row, group, settings, tp, pp, ep, replicas, I, O, n, max_batch, engine, kv) -> dict:  # noqa: E741
    """How a row was simulated: the fit it used, its engine, placement and workload."""
    return {
        "step_fit": f"held out: kernels and step time without {group!r}",
        "engine": settings, "tp": tp, "pp": pp, "ep": ep, "replicas": replicas,
        "input_len": I, "output_len": O, "requests_simulated": n,
        "max_batch": max_batch, "token_budget": engine["token_budget"],
        "admission": "reserve" if engine["reserve"] else "recompute",
        "kv_dtype": kv + ("" if row["kv_dtype"] else " (unstated: the weights')"),
    }  # fmt: skip


def slo_percentiles(result, pct: float) -> tuple[float, float]:
    """(TTFT, TPOT) at percentile `pct` over a run's requests, as MLPerf's LoadGen reports them:
    TPOT a request's time from its first token to its last over its other tokens."""
    rs = result.requests
    ttft = [r.token_times[0] - r.arrival_s for r in rs]
    tpot = [(r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1)
            for r in rs if len(r.token_times) > 1]  # fmt: skip
    return float(np.percentile(ttft, pct)), float(np.percentile(tpot, pct)) if tpot else 0.0


def _slo_prediction(row, step, overhead, fresh_copies, n, prompts, O, replicas) -> dict:  # noqa: E741
    """A server row's output tokens/s: the largest Poisson rate (a replica's share, bisected on a
    log scale) whose TTFT and TPOT hold at the row's percentile, found again with every step at
    the steps' interval ends for the interval. Above the rate one replica's offline run
    sustains no SLO holds, so that rate brackets the search from above."""
    from kvjax.serving import placed
    from kvjax.serving.router import simulate_replicas

    pct = 100 * float(row["slo_percentile"] or 0.99)  # the column is a fraction (0.99)
    ttft, tpot = float(row["slo_ttft_s"]), float(row["slo_tpot_s"])

    def served(timed, rate: float):
        return simulate_replicas(generate(n, rate, prompts, str(O), 0), fresh_copies(), timed,
                                 "round-robin")  # fmt: skip

    def largest(factor: float, lo: float, hi: float, steps: int) -> tuple[float, float]:
        timed = step if factor == 1 else placed.Scaled(step, factor)
        ok = None
        for _ in range(steps):
            mid = math.sqrt(lo * hi)
            result = served(timed, mid)
            t, p = slo_percentiles(result, pct)
            if t <= ttft and p <= tpot:
                lo, ok = mid, report(result)["throughput_tokens_per_s"]
            else:
                hi = mid
        return lo, (ok or 0.0) * replicas

    top = report(served(step, 1e9))["throughput_tokens_per_s"] / O
    rate, value = largest(1.0, top / 16, top, SLO_STEPS)
    # at an end every step is f times as long: its rate near rate / f (within 1.25x, 2.8%)
    ends = []
    for f in (math.exp(overhead.lo), math.exp(overhead.hi)):
        end_rate, end = largest(f, rate / f / 1.25, rate / f * 1.25, 4)
        if not end:  # no rate in that bracket holds: the whole range below it
            end = largest(f, top / f / 16, rate / f / 1.25, SLO_STEPS)[1]
        ends.append(end)
    ends.sort()
    return {"source": row["source"], "metric": row["metric"], "predicted_value": value,
            "predicted_lo": ends[0], "predicted_hi": ends[1], "rate_per_s": rate,
            "preemptions": None}  # fmt: skip


def step_fits() -> dict[str, Any]:
    """The kernel classes (each with its fits that left one group out) and the steps' fixed
    time on every corpus group and without each (`kvjax.predict.steps`)."""
    from kvjax.predict.steps import corpus_steps
    from kvjax.predict.validate import corpus_classes

    steps = corpus_steps()
    return {"classes": corpus_classes(), "all": steps["all"], "held": steps["held"]}
