"""MLPerf rows of AMD's vLLM harness run the engine their harness YAML states
(experiments/published/mlperf_amd_engines.csv, `python3 -m experiments.extract_amd_engines`)."""

import pandas as pd

from kvjax.serving import engines
from kvjax.serving import system_predict as sp
from kvjax.serving.systems import read_systems

AMD = "mlperf-inference-v5.1:AMD:8xMI300X_2xEPYC_9575F:llama2-70b-99:Offline"
ASUS = "mlperf-inference-v5.1:ASUSTeK:ESC_A8A_MI325X_256GBx8:llama2-70b-99:Offline"


def _rows():
    return {r["source"]: r for r in read_systems() if r["metric"] == "output_tokens_per_s"}


def test_amds_offline_llama2_runs_its_yaml_by_hand():
    """closed/AMD/code/llama2-70b-99/harness_llm/models/llama2-70b/offline_mi300x.yaml states
    max_num_seqs 1792, max_num_batched_tokens 40960, gpu_memory_utilization 0.98,
    enable_chunked_prefill False, block_size 32; vLLM preempts by recompute, no reservation."""
    engine, said = engines.engine_of(_rows()[AMD])
    assert said == engines.STATED_AMD
    assert engine == dict(
        max_batch=1792,
        token_budget=40960,
        reserve=False,
        free=1.0,
        util=0.98,
        chunked=False,
        page_size=32,
    )
    run = sp.deployment(_rows()[AMD], sp.held_fits(_rows()[AMD]["implementation"]))
    e = run.deployment.engine
    assert (e.max_batch, e.page_size, e.chunked_prefill) == (1792, 32, False)


def test_a_partner_without_its_own_yaml_borrows_amds_and_says_so():
    engine, said = engines.engine_of(_rows()[ASUS])
    assert said == engines.FROM_AMD and engine["max_batch"] == 2700  # offline_mi325x.yaml


def test_every_extracted_row_quotes_its_values_from_its_rows_repository():
    rows = _rows()
    stated = pd.read_csv(engines.MLPERF_AMD_ENGINES_CSV, keep_default_na=False)
    assert len(stated) >= 50
    for r in stated.to_dict("records"):
        row = rows[r["source"]]
        assert row["implementation"] == "AMD vLLM (ROCm)"
        assert r["file"].split(" @ ")[0] in row["file"]  # the same results repository
        assert r["file"].endswith(f"_{row['chip']}.yaml")
        for key in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "gpu_memory_utilization",
            "block_size",
        ):
            assert f"{key}: {r[key]}" in r["quote"]
