"""The prediction beside a published serving system's bound: kvjax's simulator on the row's
deployment, each step predicted from its kernels (`kvjax.predict.steps`: GEMMs and fused
attention by the corpus's kernel classes, a fixed time per layer fitted on published engine
steps), the scheduler as the row's engine runs it (`kvjax.serving.engines`).

Held out by implementation: a row is predicted by kernel classes and a step overhead fitted
without any row of its implementation's own code (`kvjax.predict.groups`: TensorRT-LLM's
trtllm-gen kernels and engine steps for a TensorRT-LLM row, whoever published it), so no number
it is judged against, and no measurement of the code that ran it, went into it; its 80%
interval is the held-out steps' nested interval (a throughput's ends are the step time's,
inverted), recalibrated on other implementations' systems in `kvjax.serving.system_summary`.
`prediction_from` says what fed each row. A row that names no implementation is predicted from
every corpus row, and says so.

Why not the `step` class (t0 + max(F / (e_c P), Q / (e_b BW)) on the step's totals): without
TensorRT-LLM's steps every published step is a memory-bound decode, e_c is unidentified (1), and
it predicted TensorRT-LLM's compute-bound rows up to 2.1x fast.

What it covers: offline rows (every request at once), fixed-rate rows (Poisson arrivals at the
rate) and fixed-concurrency rows, their output tokens/s, mean TTFT or mean TPOT; MLPerf's Server
and Interactive rows' output tokens/s (`kvjax.serving.slo_search`); fixed lengths (`input_len`,
`output_len`) or a dataset's mean prompt with the run's own mean output; a replica's placement
(tensor, pipeline, expert and data-parallel attention, `kvjax.serving.placed`); dense and MoE
models, NVFP4 weights at 4.5 bits; at most 3,000 requests simulated (the sources ran 500 to
30,000). Tensor-parallel steps add their all-reduces as engines reach them
(`kvjax.predict.collectives`). `predict_rows` runs every row it can, with a progress bar and
the seconds a row, writing its results atomically after each (`kvjax validate --predict`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from kvjax.dtypes import dtype_key
from kvjax.errors import KvjaxError
from kvjax.files import write_text_atomic
from kvjax.hardware import get_chip
from kvjax.model.config import get_model_config
from kvjax.predict.steps import Overhead, corpus_steps, kernel_fits
from kvjax.serving.deployment import Deployment, EngineSettings, Placement
from kvjax.serving.engines import engine_of
from kvjax.serving.load import generate
from kvjax.serving.simulate import report
from kvjax.serving.slo_search import SLO_REQUESTS, SLO_SCENARIOS, slo_prediction
from kvjax.serving.step_time import KernelStepTime

MAX_REQUESTS = 3000
NVFP4_BITS = 4.5  # NVIDIA's NVFP4: 4-bit e2m1 elements, one fp8 e4m3 scale a block of 16
# a metric -> the simulator report's statistic (TensorRT-LLM's online table: TPOT = mean ITL)
METRICS = {
    "output_tokens_per_s": None,
    "ttft_mean_s": ("ttft_s", "mean"),
    "tpot_mean_s": ("itl_s", "mean"),
}


@dataclass(frozen=True)
class HeldFits:
    """The fits a row of `implementation` is predicted with: the kernel classes' and the step
    overhead (with its nested interval), each fitted without that implementation's rows."""

    implementation: str
    kernels: dict[str, Any]
    overhead: Overhead
    source: str  # what fed them, in words (`prediction_from`)


@cache
def held_fits(implementation: str | None) -> HeldFits:
    """The fits that never saw `implementation`'s kernel, step or system rows (None or empty:
    a row that names none, predicted from every corpus row)."""
    from kvjax.predict.validate import corpus_classes, corpus_rows

    name = implementation or None
    steps = corpus_steps(name)
    if name is None:
        source = "every corpus row (the row names no implementation: not held out)"
    else:
        left = len(corpus_rows()) - len(corpus_rows(name))
        source = (
            f"held out: kernel classes and the engine-step overhead fitted without "
            f"{name}'s own rows ({left} of the corpus's left out)"
        )
    return HeldFits(name or "", kernel_fits(corpus_classes(name), None), steps["all"], source)


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


def _why_not_scenario(row: dict[str, Any]) -> str | None:
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
    return None


def why_not(row: dict[str, Any]) -> str | None:
    """Why the simulator cannot run this row (None: it can)."""
    engine, why = engine_of(row)
    if engine is None:
        return why
    scenario = _why_not_scenario(row)
    if scenario:
        return scenario
    adp = str(row["dp_attention"]).lower() == "true"
    if adp and ((row["pp"] or 1) > 1 or not get_model_config(row["model"]).is_moe):
        return "data-parallel attention is simulated with the experts spread over it, without pp"
    if lengths_of(row) is None:
        return "lengths neither fixed nor a distribution with published means"
    if (row["ep"] or 1) > 1 and not adp:
        return "expert parallelism inside tensor parallelism is not simulated"
    tp, pp, ep = placement_of(row)
    if not row["num_chips"] or row["num_chips"] % (tp * pp * ep):
        return "the chips are not whole replicas of the stated placement"
    if not (row["weight_dtype"] and row["compute_dtype"]):
        return "weight or compute dtype not stated"
    if row.get("spec_tokens"):
        return "speculative decoding is bounded, not yet simulated for a published row"
    return None


@cache
def kernel_chips() -> frozenset[str]:
    """The chips whose fused prefill, decode attention and GEMMs the published kernel corpus all
    measured (experiments/published/*.csv): a server row's search turns on its TTFT, which is
    the prefill's (the B200 has GEMMs and decode in the corpus, not yet its prefill)."""
    from kvjax.predict.corpus import read_corpus

    rows = read_corpus()
    kinds = ("attention_prefill", "attention_decode", "matmul")
    return frozenset.intersection(
        *(frozenset(r.chip for r in rows if r.kernel == k) for k in kinds)
    )


def _dtypes(row: dict[str, Any]) -> tuple[str, str, str, float]:
    """(weights, cache, compute, the weights' byte scale): an unstated cache is the weights'
    (TensorRT-LLM: "If you specify FP8 quantization, the KV cache will automatically be set to
    FP8 as well", its performance overview); NVFP4 weights an fp8 config whose weights take 4.5
    of its 8 bits; an FP4 cache fp8 (NVFP4 rows' caches)."""
    stated = {**row, "kv_dtype": row["kv_dtype"] or row["weight_dtype"]}
    d = {k: dtype_key(stated[k]) for k in ("weight_dtype", "kv_dtype", "compute_dtype")}
    scale = NVFP4_BITS / 8 if d["weight_dtype"] == "fp4" else 1.0
    weight = "fp8" if scale != 1 else d["weight_dtype"]
    kv = "fp8" if d["kv_dtype"] == "fp4" else d["kv_dtype"]
    return weight, kv, d["compute_dtype"], scale


@dataclass(frozen=True)
class RowRun:
    """A row's deployment (one replica: the row's throughput is its replicas' times theirs) and
    the workload it serves: `requests` of `input_len` and `output_len` tokens."""

    deployment: Deployment
    replicas: int
    requests: int
    input_len: int
    output_len: int
    concurrency: int | None = None  # a closed loop's clients a replica (None: arrivals)

    def serve(self, rate: float, factor: float = 1.0):
        """One replica's run at `rate` (Poisson arrivals), or by its closed loop of clients
        (a finished request replaced at once, as `vllm bench serve --max-concurrency`,
        genai-perf and NIM's benchmarks send them, each TTFT from its own send), each step
        `factor` times as long."""
        prompts = generate(self.requests, rate, str(self.input_len), str(self.output_len), 0)
        return self.deployment.run(prompts, factor, concurrency=self.concurrency)


def deployment(row: dict[str, Any], fits: HeldFits) -> RowRun:
    """The row's deployment: its model in its dtypes on one replica's placement, each step from
    the held-out kernels, its engine's scheduler over the cache its memory leaves."""
    tp, pp, ep = placement_of(row)
    weight, kv, compute, scale = _dtypes(row)
    cfg = get_model_config(
        row["model"],
        weight_dtype=weight,
        kv_dtype=kv,
        attention_kernel="flash",
        matmul_dtype=compute,
    )
    engine, _ = engine_of(row)
    I, O = lengths_of(row)  # noqa: E741
    # every prompt at the mean: drawing MLPerf's from its dataset (`sample:` lengths,
    # experiments/published/lengths/) moved the v4.1 H200 llama2-70b Server row by 0.1% and
    # its Offline one by 0.2%, at 4-10x the time (cached step costs miss on varied shapes)
    cap = SLO_REQUESTS if row["scenario"] in SLO_SCENARIOS else MAX_REQUESTS
    n = min(row["requests"] or cap, cap)
    placement = Placement(tp=tp, pp=pp, ep=ep, dp_attention=ep)  # ADP: a group an ep rank
    replicas = row["num_chips"] // (tp * pp * ep)
    max_batch = engine["max_batch"] or int(row["concurrency"] or n)
    if row["scenario"] == "concurrency":  # at most `concurrency` in flight over the copies
        max_batch = min(max_batch, max(1, int(row["concurrency"]) // (placement.copies * replicas)))
    settings = EngineSettings(
        max_batch=max_batch,
        token_budget=engine["token_budget"],
        page_size=engine.get("page_size", 16),
        memory_utilization=engine["util"],
        cache_fraction=engine["free"],
        reserve_bytes=0,
        reserve=engine["reserve"],
        prefix_caching=False,
        chunked_prefill=engine.get("chunked", True),
    )

    def step_model(dev, chip):
        return KernelStepTime(dev, chip, fits.kernels, fits.overhead, scale)

    d = Deployment(
        cfg,
        get_chip(row["chip"]),
        I + O,
        placement,
        settings,
        step_model,
        achieved=True,
        weight_scale=scale,
    )
    clients = None
    if row["scenario"] == "concurrency":  # the clients spread over the replicas
        clients = max(1, int(row["concurrency"]) // replicas)
    return RowRun(d, replicas, n, I, O, clients)


def _value(row: dict[str, Any], run: RowRun, rate: float, factor: float = 1.0):
    """The row's metric at its scope from one replica's run, and the preemptions."""
    out = report(run.serve(rate, factor))
    latency = METRICS[row["metric"]]
    if latency is not None:
        return out[latency[0]][latency[1]], out["preemptions"]
    value = out["throughput_tokens_per_s"] * run.replicas
    per_chip = row["scope"] == "per_chip"
    return (value / row["num_chips"] if per_chip else value), out["preemptions"]


def predict_row(row: dict[str, Any], fits: HeldFits | None = None) -> dict[str, Any]:
    """The simulated value of the row's metric at its scope, its interval, and how it was run
    (`fits`: default, the ones held out from the row's implementation)."""
    fits = fits or held_fits(row.get("implementation"))
    start = time.perf_counter()
    run = deployment(row, fits)
    ends = (math.exp(fits.overhead.lo), math.exp(fits.overhead.hi))
    if row["scenario"] in SLO_SCENARIOS:
        value = slo_prediction(row, run.serve, ends, run.output_len, run.replicas)
    else:
        # a replica's share of a rate (the replicas serve the arrivals round-robin)
        rate = row["rate_per_s"] / run.replicas if row["scenario"] == "rate" else 1e9
        v, preemptions = _value(row, run, rate)
        # the steps' 80% interval on log(measured / predicted) time: offline, every step
        # scales and a latency's ends are the step time's, a throughput's their inverse; at a
        # fixed rate the queue does not scale with the step, so the run is repeated at the ends
        if row["scenario"] == "rate":
            lo, hi = sorted(_value(row, run, rate, end)[0] for end in ends)
        elif METRICS[row["metric"]]:
            lo, hi = v * ends[0], v * ends[1]
        else:
            lo, hi = v / ends[1], v / ends[0]
        value = {
            "predicted_value": v,
            "predicted_lo": lo,
            "predicted_hi": hi,
            "rate_per_s": rate,
            "preemptions": preemptions,
        }
    return {
        "source": row["source"],
        "metric": row["metric"],
        **value,
        **_how(row, run, fits),
        "seconds": time.perf_counter() - start,
    }


def _how(row: dict[str, Any], run: RowRun, fits: HeldFits) -> dict[str, Any]:
    """How a row was simulated: what fed it, its engine, placement and workload."""
    tp, pp, ep = placement_of(row)
    e = run.deployment.engine
    return {
        "implementation": fits.implementation,
        "prediction_from": fits.source,
        "engine": engine_of(row)[1],
        "tp": tp,
        "pp": pp,
        "ep": ep,
        "replicas": run.replicas,
        "input_len": run.input_len,
        "output_len": run.output_len,
        "requests_simulated": run.requests,
        "max_batch": e.max_batch,
        "token_budget": e.token_budget,
        "admission": "reserve" if e.reserve else "recompute",
        "kv_dtype": _dtypes(row)[1] + ("" if row["kv_dtype"] else " (unstated: the weights')"),
    }


def runnable(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows the simulator can run, the quick ones first: offline and fixed-rate runs, then
    the servers' rate searches (each a bisection of simulations)."""
    return sorted(
        (r for r in rows if why_not(r) is None), key=lambda r: r["scenario"] in SLO_SCENARIOS
    )


def predict_rows(
    rows: list[dict[str, Any]],
    out: str | Path | None = None,
    resume: bool = False,
    on_row: Callable[[dict[str, Any], dict[str, Any] | str], None] | None = None,
) -> list[dict[str, Any]]:
    """Every runnable row's prediction (`runnable`), each written to `out` (a CSV, atomically)
    as it finishes; `resume`: the rows `out` already holds are kept, not run again. `on_row`
    is called with each row and its prediction, or why it is not predicted (first, for the rows
    the simulator cannot run; then as a run fails)."""
    done: list[dict[str, Any]] = []
    if resume and out and Path(out).exists():
        done = pd.read_csv(out).to_dict("records")
    have = {(o["source"], o["metric"]) for o in done}
    for r in rows:
        reason = why_not(r)
        if reason is not None and on_row:
            on_row(r, f"not predicted: {reason}")
    for r in runnable(rows):
        if (r["source"], r["metric"]) in have:
            continue
        try:
            pred = predict_row(r)
        except KvjaxError as exc:  # a deployment kvjax's memory model cannot hold: said
            if on_row:
                on_row(r, f"not simulated: {exc}")
            continue
        pred.update(measured=r["measured"], ratio=pred["predicted_value"] / r["measured"])
        done.append(pred)
        if out:
            write_text_atomic(out, pd.DataFrame(done).to_csv(index=False))
        if on_row:
            on_row(r, pred)
    return done
