"""The engine settings a published serving row ran with, keyed by the code that ran it (its
`implementation`), never by who published the row; the simulator runs them
(`kvjax.serving.system_predict`).

A row takes, in order: the settings its own source states (`ROW_ENGINES`, by source prefix);
for an MLPerf submission that ran TensorRT-LLM, the settings its configuration file states
(experiments/published/mlperf_engines.csv, extracted by `experiments/extract_mlperf_engines.py`);
for one that ran AMD's vLLM harness, its harness YAML's (mlperf_amd_engines.csv, extracted by
`experiments/extract_amd_engines.py`); else its implementation's defaults (`DEFAULTS`), said so
per row. Each setting: `max_batch` (the most requests running; None: the row's own prompts),
`token_budget` (tokens a step), `reserve` (a request's whole cache reserved at admission, else
admission without it and preemption by recompute), `free` (the share of the cache's pages the
engine uses), `util` (the share of the chip's memory the engine takes before sizing its cache)
and, where stated, `chunked` (prompts split over steps; default True) and `page_size` (tokens a
cache page; default 16).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from kvjax.hardware import get_chip
from kvjax.predict.groups import AMD_VLLM, SGLANG, SGLANG_JAX, TENSORRT_LLM, VLLM, VLLM_TPU
from kvjax.serving.engine_profiles import PROFILES, get_profile

# TensorRT-LLM as trtllm-bench runs it: max batch 4096, 8192 tokens a step (its max_num_tokens
# default), each request's cache reserved at admission (the GUARANTEED_NO_EVICT capacity policy)
# in 0.9 of the memory the weights and the largest step leave (kv_cache_free_gpu_mem_fraction).
TRTLLM_BENCH = dict(max_batch=4096, token_budget=8192, reserve=True, free=0.9, util=1.0)
DEFAULTS: dict[str, dict[str, Any]] = {TENSORRT_LLM: TRTLLM_BENCH}
# Engines whose defaults kvjax.serving.engine_profiles cites, by implementation: the profile an
# offline row runs (the engine's offline entry point) and the one a served row runs.
PROFILE_DEFAULTS: dict[str, tuple[str, str]] = {
    VLLM: ("vllm-llm", "vllm"),
    VLLM_TPU: ("vllm-llm", "vllm"),
    SGLANG: ("sglang", "sglang"),
    # SGLang-JAX runs SGLang's scheduler (sgl-project/sglang-jax@24f84739:
    # python/sgl_jax/srt/managers/scheduler.py: max_running_requests, chunked_prefill_size;
    # schedule_batch.py:386 `def reset_for_retract`): SGLang's defaults where a row states none
    SGLANG_JAX: ("sglang", "sglang"),
}
# What a row's own command line states over its engine's defaults, by source prefix.
ROW_OVERRIDES: dict[str, dict[str, Any]] = {
    # DataCrunch's DeepSeek-V3 runs in SGLang's repository (benchmark/benchmark_dsv3/README.md):
    # the BF16-labelled runs' `sglang.launch_server ... --mem-fraction-static 0.8` (the FP8
    # runs state no memory fraction)
    "sglang-bench-dsv3:deepseek-v3:8xh200:bf16:": dict(util=0.8),
    # tpu-recipes' Llama-3.3-70B on a v6e-8: `vllm serve ... --gpu-memory-utilization 0.98
    # --max-num-batched-tokens 512 --max-num-seqs 256 --no-enable-prefix-caching`
    "tpu-recipes:vllm-tpu:llama-3.3-70b:": dict(util=0.98, token_budget=512, max_batch=256),
    # sglang-jax's Qwen3-8B benchmark on a v6e-4 (docs/performance/qwen3_benchmark.md):
    # `sgl_jax.launch_server ... --mem-fraction-static=0.8 --chunked-prefill-size=2048
    # --max-running-requests 256 --page-size=128 --disable-radix-cache`
    "sglang-jax-qwen3-bench-2025-09:sgl-jax:": dict(
        util=0.8, token_budget=2048, max_batch=256, page_size=128
    ),
}
# Rows whose source states their own engine settings, by source prefix.
ROW_ENGINES: dict[str, dict[str, Any]] = {
    # TensorRT-LLM's DeepSeek-R1 best-practice H200 max-throughput run (its `convention`:
    # trtllm-bench, max_batch_size 128 a rank, max_num_tokens 1151,
    # kv_cache_free_gpu_mem_fraction 0.8, ADP)
    "trtllm-bestperf-r1:deepseek-r1:fp8:h200:1k/2k:tp8ep8-adp:max-tput": dict(
        max_batch=128, token_budget=1151, reserve=True, free=0.8, util=1.0
    ),
    # AMD's vLLM dev-docker table (ROCm/vllm docs/dev-docker/README.md, the rows' `convention`):
    # --max-num-seqs = the prompts (`concurrency`), --max-num-batched-tokens 131072, vLLM's
    # default gpu_memory_utilization 0.9 of the memory and preemption by recompute
    "amd-rocm-vllm-devdocker": dict(
        max_batch=None, token_budget=131072, reserve=False, free=1.0, util=0.9
    ),
    # RedHat's MLPerf v5.1 llama3.1-8b on one H100, vLLM 0.10.0 (the rows' `convention`:
    # mlcommons/inference_results_v5.1@965182b03376a00fcae415c54e560e1c83937932:
    # closed/RedHat/code/llama3.1-8b/README.md:146 offline, :97 server); vLLM's V1 scheduler
    # admits without reserving and preempts by recompute; offline at vLLM's default
    # gpu_memory_utilization 0.9, the server at its stated 0.91
    "mlperf-inference-v5.1:RedHat:XE8640_4xH100_vLLM:llama3.1-8b:Offline": dict(
        max_batch=1024, token_budget=4096, reserve=False, free=1.0, util=0.9
    ),
    "mlperf-inference-v5.1:RedHat:XE8640_4xH100_vLLM:llama3.1-8b:Server": dict(
        max_batch=512, token_budget=1024, reserve=False, free=1.0, util=0.91
    ),
}
ROW_STATED = "the row's stated settings"
STATED_MLPERF = "the submission's configuration file (experiments/published/mlperf_engines.csv)"
PUBLISHED = Path(__file__).parents[2] / "experiments" / "published"
MLPERF_ENGINES_CSV = PUBLISHED / "mlperf_engines.csv"
STATED_AMD = "the submission's harness configuration (experiments/published/mlperf_amd_engines.csv)"
FROM_AMD = (
    "AMD's own submission's harness configuration for the chip and scenario; the submitter's "
    "code states none (experiments/published/mlperf_amd_engines.csv)"
)
MLPERF_AMD_ENGINES_CSV = PUBLISHED / "mlperf_amd_engines.csv"
UNSTATED = "engine settings unstated: TensorRT-LLM's trtllm-bench defaults; lengths at the means"


def engine_of(row: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The engine settings the row ran (None: unknown) and where they come from."""
    for prefix, engine in ROW_ENGINES.items():
        if row["source"].startswith(prefix):
            return engine, ROW_STATED
    implementation = row.get("implementation") or ""
    if implementation == TENSORRT_LLM and row["source"].startswith("mlperf-"):
        stated = mlperf_engines().get(row["source"])
        return (stated, STATED_MLPERF) if stated else (TRTLLM_BENCH, UNSTATED)
    if implementation == AMD_VLLM and row["source"].startswith("mlperf-"):
        stated, borrowed = mlperf_amd_engines().get(row["source"], (None, False))
        if stated:
            return stated, FROM_AMD if borrowed else STATED_AMD
    if implementation in DEFAULTS:
        return DEFAULTS[implementation], f"{implementation}'s defaults (the row states none)"
    if implementation in PROFILE_DEFAULTS:
        offline, online = PROFILE_DEFAULTS[implementation]
        spec = offline if row["scenario"] == "offline" else online
        version = row.get("engine_version") or ""
        key = f"{spec}@{version}" if f"{spec}@{version}" in PROFILES else spec
        stated = next((v for k, v in ROW_OVERRIDES.items() if row["source"].startswith(k)), {})
        said = f"the row's stated {', '.join(stated)} over " if stated else ""
        return {**profile_engine(key, row["chip"]), **stated}, (
            f"{said}{implementation}'s defaults as {get_profile(key).entry} sets them "
            f"({key}, kvjax.serving.engine_profiles{'' if stated else '; the row states none'})"
        )
    return None, f"no engine settings known for implementation {implementation or 'unstated'!r}"


@cache
def mlperf_engines() -> dict[str, dict[str, Any]]:
    """MLPerf TensorRT-LLM rows' engine settings by source, as their configuration files state
    them: the max batch, the tokens a step, and TensorRT-LLM's scheduler policy:
    GUARANTEED_NO_EVICT reserves each request's cache at admission, MAX_UTILIZATION admits
    without and pauses a request when the cache runs out (kvjax: preemption by recompute); a
    file that turns chunked context off (`enable_chunked_context: False`) prefills each prompt
    whole."""
    if not MLPERF_ENGINES_CSV.exists():
        return {}
    out = {}
    for r in pd.read_csv(MLPERF_ENGINES_CSV, keep_default_na=False).to_dict("records"):
        out[r["source"]] = dict(
            max_batch=int(r["max_batch"]),
            token_budget=int(r["max_num_tokens"]),
            reserve=r["batch_scheduler_policy"] != "max_util",
            free=float(r["kvcache_free_gpu_mem_frac"] or 0.9),
            util=1.0,
        )
        if str(r["enable_chunked_context"]) == "False":
            out[r["source"]]["chunked"] = False
    return out


@cache
def mlperf_amd_engines() -> dict[str, tuple[dict[str, Any], bool]]:
    """MLPerf rows of AMD's vLLM harness: the vLLM engine settings their harness YAML states
    (max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, enable_chunked_prefill,
    block_size), by source, and whether the YAML is AMD's own, borrowed for a submitter whose
    code holds none. vLLM admits without reserving a request's cache and preempts by recompute;
    its cache takes every page the memory leaves."""
    if not MLPERF_AMD_ENGINES_CSV.exists():
        return {}
    read = pd.read_csv(MLPERF_AMD_ENGINES_CSV, keep_default_na=False).to_dict("records")
    return {
        r["source"]: (
            dict(
                max_batch=int(r["max_num_seqs"]),
                token_budget=int(r["max_num_batched_tokens"]),
                reserve=False,
                free=1.0,
                util=float(r["gpu_memory_utilization"]),
                chunked=str(r["enable_chunked_prefill"]) == "True",
                page_size=int(r["block_size"]),
            ),
            str(r["from_amd"]) == "True",
        )
        for r in read
    }


def profile_engine(spec: str, chip: str) -> dict[str, Any]:
    """An engine profile's defaults on `chip` as a published row's settings; its version as
    `spec` names it (`vllm@0.6.3`), else the latest profile here."""
    e, _ = get_profile(spec).settings(get_chip(chip))
    return dict(
        max_batch=e.max_batch,
        token_budget=e.token_budget,
        reserve=e.reserve,
        free=e.cache_fraction,
        util=e.memory_utilization,
        chunked=e.chunked_prefill,
        page_size=e.page_size,
    )
