"""The serving engines' schedulers as each engine's own code sets their defaults, each default
with the line it comes from (`repo@commit:path:line` and the line, quoted): vLLM V1 (`vllm
serve`, and `vllm bench throughput`'s LLM class), SGLang and TensorRT-LLM (`trtllm-serve` and
`trtllm-bench`). `kvjax simulate --engine NAME[@VERSION]` runs one; flags given override it.

What kvjax's simulator takes from a profile (`EngineSettings`): the most requests running, the
tokens a step (a chunked prefill's chunk), whether prompts are chunked, the memory the engine
takes (`memory_utilization`: of the chip's memory for weights and cache, as vLLM's
gpu_memory_utilization and SGLang's mem_fraction_static count it; TensorRT-LLM's
kv_cache_free_gpu_mem_fraction is of what the weights leave: `cache_fraction`), the page, the
admission (TensorRT-LLM's GUARANTEED_NO_EVICT reserves a request's whole cache; vLLM and SGLang
admit without and preempt, or retract, by recompute), and prefix caching. Where a default
depends on the chip (vLLM's and SGLang's tables by device memory), the rule is the engine's, as
cited. Deviations: SGLang's admission charges a request its prompt and a decaying share of its
clipped output (new_token_ratio), which kvjax runs as admission without a reservation; its
max_running_requests (min(pool tokens // 2, a request pool of 2048 to 4096)) is taken at 2048
when the pool is unknown; TensorRT-LLM's trtllm-bench sizes its batch and budget from the
dataset's lengths (`tensorrt_llm/bench/build/tuning.py`), taken here at input = output (4096
requests, 8192 tokens), as the published rows' predictions run it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kvjax.errors import unknown_name_error
from kvjax.hardware import ChipSpec
from kvjax.predict.groups import SGLANG, TENSORRT_LLM, VLLM
from kvjax.serving.deployment import EngineSettings

GIB = 2**30
MIB = 2**20
VLLM_0112 = "vllm-project/vllm@275de34170654274616082721348b7edd9741d32"
VLLM_063 = "vllm-project/vllm@v0.6.3"  # a release tag: its commit was not resolved here
SGLANG_055 = "sgl-project/sglang@v0.5.5"  # a release tag: its commit was not resolved here
TRT_SERVE = "NVIDIA/TensorRT-LLM@4c05a74891e4df8066f08ed4ce14b0972abe4e25"
TRT_BUILD = "NVIDIA/TensorRT-LLM@008b2b8d23af95e4e19fa6f354f9c5f6349b2bfc"
TRT_ARGS = "NVIDIA/TensorRT-LLM@fcd3f31682808ae56118ae43c1d7864a3a945e6f"
TRT_BENCH = "NVIDIA/TensorRT-LLM@000a01de66f0eab4ab05640711f0253f50f5209c"
TRT_TUNING = "NVIDIA/TensorRT-LLM@04cba882084a25665e7f80f5bda71b35b9790b6f"


@dataclass(frozen=True)
class Default:
    """One default: its value, where it is set (`repo@commit-or-tag:path:line`), the line."""

    value: Any
    cite: str
    line: str


@dataclass(frozen=True)
class EngineProfile:
    """An engine at a version, as an entry point runs it; `defaults` by `EngineSettings` field
    (and `chunked_prefill`), a chip-dependent one computed by `rules`."""

    name: str
    version: str
    implementation: str
    entry: str
    defaults: dict[str, Default]
    rules: tuple[str, ...] = field(default=())

    def settings(self, chip: ChipSpec) -> tuple[EngineSettings, dict[str, Default]]:
        """The engine's settings on `chip` and each one's source."""
        used = dict(self.defaults)
        for rule in self.rules:
            used.update(RULES[rule](chip))
        kwargs = {k: d.value for k, d in used.items()}
        return EngineSettings(**kwargs), used


def _large_gpu(chip: ChipSpec) -> bool:
    """vLLM's test: device memory of 70 GiB or more and not an A100."""
    return (chip.memory_bytes or 0) >= 70 * GIB and "a100" not in chip.name


# vLLM V1's defaults by usage context and device (`get_batch_defaults`' table): the context's
# enum name, and per device class (line, value) of max_num_seqs and of max_num_batched_tokens
_VLLM_TABLE = {
    "vllm-serve": (
        "OPENAI_API_SERVER",
        {True: ((1900, 1024), (1896, 8192)), False: ((1910, 256), (1906, 2048))},
    ),
    "vllm-llm": (
        "LLM_CLASS",
        {True: ((1899, 1024), (1895, 16384)), False: ((1909, 256), (1905, 8192))},
    ),
}


def _vllm(context: str, chip: ChipSpec) -> dict[str, Default]:
    """vLLM V1's max running requests and tokens a step for a usage context on `chip`."""
    a = f"{VLLM_0112}:vllm/engine/arg_utils.py"
    name, table = _VLLM_TABLE[context]
    (seq_line, seqs), (tok_line, tokens) = table[_large_gpu(chip)]
    return {
        "max_batch": Default(seqs, f"{a}:{seq_line}", f"UsageContext.{name}: {seqs},"),
        "token_budget": Default(tokens, f"{a}:{tok_line}", f"UsageContext.{name}: {tokens},"),
    }


def _sglang_memory(chip: ChipSpec) -> dict[str, Default]:
    """SGLang's chunk by device memory (MiB) and its static memory fraction: (memory - reserved)
    / memory, reserved = 512 + max(chunk, 2048) x 1.5 + cuda_graph_max_bs x 2 + tp x pp / 8 x
    1024 MiB (cuda_graph_max_bs 256, tp = pp = 1), at least 10 GiB on a device over 60 GiB."""
    s = f"{SGLANG_055}:python/sglang/srt/server_args.py"
    mem = (chip.memory_bytes or 0) / MIB
    if mem < 60 * 1024:
        chunk = Default(4096, f"{s}:724", "self.chunked_prefill_size = 4096")
    elif mem < 160 * 1024:
        chunk = Default(8192, f"{s}:744", "self.chunked_prefill_size = 8192")
    else:
        chunk = Default(16384, f"{s}:764", "self.chunked_prefill_size = 16384")
    reserved = 512 + max(chunk.value, 2048) * 1.5 + 256 * 2 + 1 / 8 * 1024
    if mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    fraction = round((mem - reserved) / mem, 3) if mem else 0.88
    return {
        "token_budget": chunk,
        "memory_utilization": Default(
            fraction, f"{s}:820", "round((gpu_mem - reserved_mem) / gpu_mem, 3)"
        ),
    }


RULES = {
    "vllm-serve": lambda chip: _vllm("vllm-serve", chip),
    "vllm-llm": lambda chip: _vllm("vllm-llm", chip),
    "sglang": _sglang_memory,
}

_V = f"{VLLM_0112}:vllm"
_VLLM_COMMON = {
    "memory_utilization": Default(
        0.9,
        f"{_V}/config/cache.py:50",
        "gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)",
    ),
    "page_size": Default(16, f"{_V}/platforms/cuda.py:162", "cache_config.block_size = 16"),
    "chunked_prefill": Default(
        True, f"{_V}/engine/arg_utils.py:1843", "default_chunked_prefill = True"
    ),
    "prefix_caching": Default(
        True,
        f"{_V}/engine/arg_utils.py:1847",
        "default_prefix_caching = not model_config.is_hybrid",
    ),
    "reserve": Default(
        False, f"{_V}/v1/core/sched/scheduler.py:324", "preempted_req.num_computed_tokens = 0"
    ),
}
_S = f"{SGLANG_055}:python/sglang/srt"
_TS = f"{TRT_SERVE}:tensorrt_llm/commands/serve.py"
PROFILES: dict[str, EngineProfile] = {
    "vllm@0.11.2": EngineProfile(
        "vllm", "0.11.2", VLLM, "vllm serve", dict(_VLLM_COMMON), ("vllm-serve",)
    ),
    "vllm-llm@0.11.2": EngineProfile(
        "vllm-llm",
        "0.11.2",
        VLLM,
        "vllm bench throughput (the LLM class)",
        dict(_VLLM_COMMON),
        ("vllm-llm",),
    ),
    "vllm@0.6.3": EngineProfile(
        "vllm",
        "0.6.3",
        VLLM,
        "vllm serve (V0)",
        {
            "max_batch": Default(
                256, f"{VLLM_063}:vllm/engine/arg_utils.py:115", "max_num_seqs: int = 256"
            ),
            "token_budget": Default(
                2048,
                f"{VLLM_063}:vllm/config.py:987",
                "max_num_batched_tokens = max(max_model_len, 2048)",
            ),
            "chunked_prefill": Default(
                False,
                f"{VLLM_063}:vllm/engine/arg_utils.py:952",
                "use_long_context = max_model_len > 32768",
            ),
            "prefix_caching": Default(
                False,
                f"{VLLM_063}:vllm/engine/arg_utils.py:108",
                "enable_prefix_caching: bool = False",
            ),
            "memory_utilization": Default(
                0.9,
                f"{VLLM_063}:vllm/engine/arg_utils.py:113",
                "gpu_memory_utilization: float = 0.90",
            ),
            "page_size": Default(
                16, f"{VLLM_063}:vllm/engine/arg_utils.py:107", "block_size: int = 16"
            ),
            "reserve": Default(
                False,
                f"{VLLM_063}:vllm/core/scheduler.py:1474",
                "preemption_mode = PreemptionMode.RECOMPUTE",
            ),
        },
    ),
    "sglang@0.5.5": EngineProfile(
        "sglang",
        "0.5.5",
        SGLANG,
        "sglang.launch_server",
        {
            "max_batch": Default(2048, f"{_S}/model_executor/model_runner.py:1560", "2048,"),
            "page_size": Default(1, f"{_S}/server_args.py:1331", "self.page_size = 1"),
            "chunked_prefill": Default(
                True, f"{_S}/server_args.py:263", "chunked_prefill_size: Optional[int] = None"
            ),
            "prefix_caching": Default(
                True, f"{_S}/server_args.py:465", "disable_radix_cache: bool = False"
            ),
            "reserve": Default(
                False, f"{_S}/managers/schedule_batch.py:1543", "req.reset_for_retract()"
            ),
        },
        ("sglang",),
    ),
    "trtllm-serve": EngineProfile(
        "trtllm-serve",
        "",
        TENSORRT_LLM,
        "trtllm-serve (PyTorch backend)",
        {
            "max_batch": Default(
                2048, f"{TRT_BUILD}:tensorrt_llm/builder.py:483", "max_batch_size: int = 2048"
            ),
            "token_budget": Default(
                8192, f"{TRT_BUILD}:tensorrt_llm/builder.py:485", "max_num_tokens: int = 8192"
            ),
            "chunked_prefill": Default(False, f"{_TS}:94", "enable_chunked_prefill: bool = False,"),
            "memory_utilization": Default(
                1.0, f"{_TS}:89", "free_gpu_memory_fraction: float = 0.9,"
            ),
            "cache_fraction": Default(0.9, f"{_TS}:282", "default=0.9,"),
            "page_size": Default(32, "", "tokens_per_block: int = Field(default=32,"),
            "reserve": Default(
                True,
                f"{_TS}:113",
                "capacity_scheduler_policy=CapacitySchedulerPolicy.GUARANTEED_NO_EVICT,",
            ),
            "prefix_caching": Default(
                True, f"{TRT_ARGS}:tensorrt_llm/llmapi/llm_args.py:607", "default=True,"
            ),
        },
    ),
    "trtllm-bench": EngineProfile(
        "trtllm-bench",
        "",
        TENSORRT_LLM,
        "trtllm-bench throughput",
        {
            "max_batch": Default(
                4096,
                f"{TRT_TUNING}:tensorrt_llm/bench/build/tuning.py:174",
                "raw_bs = min(kv_cache_max_requests, 4096) / pp_size",
            ),
            "token_budget": Default(
                8192,
                f"{TRT_TUNING}:tensorrt_llm/bench/build/tuning.py:176",
                "raw_token = min(raw_bs * (1 + input_len / output_len), 32768)",
            ),
            "chunked_prefill": Default(
                False,
                f"{TRT_BENCH}:tensorrt_llm/bench/benchmark/throughput.py:236",
                '"--enable_chunked_context",',
            ),
            "memory_utilization": Default(
                1.0, f"{TRT_BENCH}:tensorrt_llm/bench/benchmark/throughput.py:83", "default=.90,"
            ),
            "cache_fraction": Default(
                0.9, f"{TRT_BENCH}:tensorrt_llm/bench/benchmark/throughput.py:83", "default=.90,"
            ),
            "page_size": Default(16, "", "kvjax's pages: TensorRT-LLM's 32-token blocks"),
            "reserve": Default(
                True,
                f"{TRT_BENCH}:tensorrt_llm/bench/benchmark/throughput.py:244",
                'default="guaranteed_no_evict",',
            ),
            "prefix_caching": Default(False, "", "kvjax: the predictions run no prefix cache"),
        },
    ),
}
LATEST = {
    "vllm": "vllm@0.11.2",
    "vllm-llm": "vllm-llm@0.11.2",
    "sglang": "sglang@0.5.5",
    "trtllm-serve": "trtllm-serve",
    "trtllm-bench": "trtllm-bench",
}


def get_profile(spec: str) -> EngineProfile:
    """`NAME` (its latest profile here) or `NAME@VERSION`; refused with the names allowed."""
    key = LATEST.get(spec, spec)
    if key not in PROFILES:
        raise unknown_name_error("engine", spec, [*LATEST, *PROFILES])
    return PROFILES[key]


def check_cited(p: EngineProfile) -> list[str]:
    """The defaults of `p` whose citation is not `owner/repo@commit-or-tag:path:line`."""
    bad = []
    for k, d in p.defaults.items():
        head, _, rest = d.cite.partition("@")
        parts = rest.split(":")
        if d.cite and ("/" not in head or len(parts) != 3 or not parts[2].isdigit()):
            bad.append(k)
    return bad


def resolve(
    spec: str | None, chip: ChipSpec, given: dict[str, Any]
) -> tuple[EngineSettings, dict[str, Any] | None]:
    """The settings an engine runs with: the profile `spec`'s defaults on `chip` (kvjax's own,
    `EngineSettings()`, without one) with the values `given` over them; and, with a profile, each
    setting's value and where it came from (its cited line, or given)."""
    profile = get_profile(spec) if spec else None
    base, cited = profile.settings(chip) if profile else (EngineSettings(), {})
    engine = replace(base, **given)
    if profile is None:
        return engine, None
    used = {
        k: {"value": getattr(engine, k), "from": "given"}
        if k in given
        else {"value": d.value, "from": d.cite or "kvjax (no cited line)", "line": d.line}
        for k, d in cited.items()
    }
    name = f"{profile.name}@{profile.version}" if profile.version else profile.name
    return engine, {
        "profile": name,
        "entry": profile.entry,
        "implementation": profile.implementation,
        "settings": used,
    }
