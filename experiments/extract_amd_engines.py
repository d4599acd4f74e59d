"""Each MLPerf row of AMD's vLLM harness (implementation `AMD vLLM (ROCm)`): the engine settings
its submission's harness configuration states, read into
experiments/published/mlperf_amd_engines.csv for `kvjax.serving.engines`:

    python3 -m experiments.extract_amd_engines --v5.1 GIT_DIR [--v4.1 GIT_DIR]

GIT_DIR: a clone of github.com/mlcommons/inference_results_v5.1 (or v4.1), read at its HEAD,
whose commit each row cites. AMD's harness (`harness_llm`) reads one YAML a model, scenario and
chip, `code/<benchmark>/harness_llm/models/<model>/<scenario>_<chip>.yaml` (MangoBoost's
partner submissions keep it under `amd/code/`), and passes its `vllm_engine_config` to vLLM's
engine: `max_num_seqs` (the most requests running), `max_num_batched_tokens` (tokens a step),
`gpu_memory_utilization`, `enable_chunked_prefill` and `block_size` (the page). A submitter
whose code holds no such file (ASUSTeK, Supermicro, MangoBoost's LLMBoost) gets AMD's own
submission's file for the same benchmark, scenario and chip, and the row says so
(`from_amd`). The harness's own scheduler (`VLLM_LLAMA2_MLPERF_SCHED`, a target decode batch)
and its multi-step decoding (`num_scheduler_steps`) are recorded, not simulated."""

from __future__ import annotations

import pandas as pd
import yaml

from experiments.mlperf_repos import parse_repos
from kvjax.files import write_text_atomic
from kvjax.serving.systems import read_systems

OUT = "experiments/published/mlperf_amd_engines.csv"
IMPLEMENTATION = "AMD vLLM (ROCm)"
# the harness's vllm_engine_config keys kvjax reads, and the recorded ones it does not simulate
READ = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "enable_chunked_prefill",
    "block_size",
)
RECORDED = ("num_scheduler_steps",)


def yaml_paths(submitter: str, benchmark: str, scenario: str, chip: str) -> list[str]:
    """Where a submitter's harness keeps the row's YAML, the likeliest first."""
    model = benchmark.removesuffix("-99.9").removesuffix("-99")
    name = f"{scenario.lower()}_{chip}.yaml"
    return [
        f"closed/{submitter}/code/{benchmark}/harness_llm/models/{model}/{name}",
        f"closed/{submitter}/code/{benchmark}/amd/code/harness_llm/models/{model}/{name}",
    ]


def engine_settings(text: str) -> dict | None:
    """The settings a harness YAML's `vllm_engine_config` states, each with its line."""
    config = (yaml.safe_load(text) or {}).get("vllm_engine_config") or {}
    if "max_num_seqs" not in config or "max_num_batched_tokens" not in config:
        return None
    lines = text.splitlines()

    def line_of(key: str) -> str:
        n = next(i for i, s in enumerate(lines, 1) if s.strip().startswith(f"{key}:"))
        return f"{n}: {lines[n - 1].strip()}"

    got = {k: config.get(k, "") for k in READ + RECORDED}
    got["quote"] = " | ".join(line_of(k) for k in READ + RECORDED if k in config)
    return got


def main() -> None:
    repos = parse_repos(__doc__)
    out, missing = [], []
    for r in read_systems():
        if r["implementation"] != IMPLEMENTATION or not r["source"].startswith("mlperf-"):
            continue
        _, submitter, _, benchmark, scenario = r["source"].split(":")
        version = repos.version_of(r["file"])
        if version is None or any(o["source"] == r["source"] for o in out):
            continue
        for who in (submitter, "AMD"):
            found = [
                (path, text)
                for path in yaml_paths(who, benchmark, scenario, r["chip"])
                if (text := repos.show(version, path)) is not None
            ]
            got = engine_settings(found[0][1]) if found else None
            if got:
                row = {"source": r["source"], **got, "from_amd": who != submitter}
                out.append({**row, "file": repos.cite(version, found[0][0])})
                break
        else:
            missing.append(r["source"])
    write_text_atomic(OUT, pd.DataFrame(out).to_csv(index=False))
    print(f"{len(out)} rows' engine settings written to {OUT}; none found for {len(missing)}:")
    for source in missing:
        print(f"  {source}")


if __name__ == "__main__":
    main()
