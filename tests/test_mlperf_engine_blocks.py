"""MLPerf v5.1 configuration files whose accuracy target maps to a dict defined by name
(`EXPORTS = {C.WorkloadSetting(...): base}`: deepseek-r1's and llama3.1-8b's) give that dict's
settings, as the inline form gives its own; NVIDIA's GB300 rows run what their files state."""

import pandas as pd

from experiments.extract_mlperf_engines import block, settings
from kvjax.serving import engines
from kvjax.serving import system_predict as sp
from kvjax.serving.systems import read_systems

NAMED = """import code.common.constants as C

base = {
    llm_fields.trtllm_build_flags: {
        'max_num_tokens': 4608,
    },
    llm_fields.trtllm_runtime_flags: {
        'max_num_tokens': 6656,
        'batch_scheduler_policy': 'max_util',
        'kvcache_free_gpu_mem_frac': 0.95,
        'enable_chunked_context': False,
    },
    model_fields.gpu_batch_size: {
        'deepseek-r1': 1536,
    },
}


EXPORTS = {
    C.WorkloadSetting(C.HarnessType.Custom, C.AccuracyTarget(0.99), C.PowerSetting.MaxP): base,
}
"""


def test_a_target_mapped_to_a_named_dict_reads_that_dict():
    got = settings(block(NAMED, "0.99"))
    # the runtime's token budget, not the engine build's
    assert (got["max_batch"], got["max_num_tokens"]) == (1536, 6656)
    assert (got["kvcache_free_gpu_mem_frac"], got["enable_chunked_context"]) == (0.95, "False")
    assert block(NAMED, "0.999") is None  # no block of that target: nothing read


def test_nvidias_gb300_rows_run_their_configuration_files_settings():
    rows = {(r["source"], r["metric"]): r for r in read_systems()}
    gb300 = "mlperf-inference-v5.1:NVIDIA:GB300-NVL72_GB300-288GB_aarch64x72_TRT:"
    r1 = rows[(gb300 + "deepseek-r1:Offline", "output_tokens_per_s")]
    engine, said = engines.engine_of(r1)
    assert said == engines.STATED_MLPERF
    assert (engine["max_batch"], engine["token_budget"], engine["free"]) == (1536, 6656, 0.95)
    assert engine["chunked"] is False  # 'enable_chunked_context': False: each prompt whole
    # 72 GPUs as 9 groups of 8 with data-parallel attention and the experts over each group
    assert (r1["chip"], r1["num_chips"], r1["replicas"], sp.placement_of(r1)) == (
        "gb300",
        72,
        9,
        (1, 1, 8),
    )
    stated = pd.read_csv(engines.MLPERF_ENGINES_CSV, keep_default_na=False).set_index("source")
    assert "'deepseek-r1': 1536" in stated.loc[r1["source"], "quote"]
    assert stated.loc[r1["source"], "file"].endswith("Offline/deepseek-r1.py")
