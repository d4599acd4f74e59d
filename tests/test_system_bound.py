"""The serving system's bound (issue 50): its memory side by the seed's cache formula, its sums
against term-by-term loops, and no simulated engine above it at any scheduler setting."""

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from kvjax import get_model_config
from kvjax.analytic import Workload
from kvjax.errors import KvjaxError
from kvjax.hardware import chip_from_numbers, get_chip
from kvjax.predict.bounds import step_floor
from kvjax.serving.load import generate
from kvjax.serving.memory import kv_pool
from kvjax.serving.pages import PagePool
from kvjax.serving.scheduler import Scheduler
from kvjax.serving.simulate import report, simulate
from kvjax.serving.step_time import ClosedFormStepTime
from kvjax.serving.system_bound import metric_bound, series_sum, step_weight_bytes, system_bound
from kvjax.serving.systems import read_systems, validate_systems


def test_the_memory_side_by_the_seeds_cache_formula():
    """llama-2-7b (L 32, h_kv 32, d_h 128, bf16) on one H100 at I = 512, O = 129: a decode at S
    reads R(S) = 2 L h_kv d_h S 2 bytes = 524,288 S; the 128 decodes read sum_{S=513}^{640} R(S)
    = 524,288 x 128 x (513 + 640) / 2; the weights W_step a step over D M - W of room, and the
    640 tokens' cache written once."""
    cfg = get_model_config("llama-2-7b")
    chip = get_chip("h100-sxm")
    b = system_bound(cfg, chip, 1, 512, 129)
    per_token = 2 * 32 * 32 * 128 * 2
    reads = per_token * 128 * (513 + 640) / 2
    w_step = step_weight_bytes(cfg)
    free = 80e9 - 6_738_415_616 * 2
    assert b.free_bytes == pytest.approx(free)
    assert b.bytes == pytest.approx(reads * (1 + w_step / free) + per_token * 640, rel=1e-12)
    assert b.memory_s == pytest.approx(b.bytes / 3.35e12)
    # the weights a decode reads: all but the embedding table (one row of it)
    assert w_step == pytest.approx(2 * (6_738_415_616 - 32000 * 4096 + 4096))
    assert b.output_tokens_per_s == pytest.approx(129 / max(b.compute_s, b.memory_s))
    assert metric_bound(b, "requests_per_s") == pytest.approx(b.output_tokens_per_s / 129)


def test_the_flops_are_the_exact_steps_summed_term_by_term():
    """The request's FLOPs: the prefill's (its logits at one row) and every decode's, against a
    loop over the decodes; a windowed model (mistral's 4096 window crossed at S = 4096) too."""
    chip = get_chip("h100-sxm")
    for name, I, O in (("llama-3-8b", 300, 40), ("mistral-7b", 4080, 30)):  # noqa: E741
        cfg = get_model_config(name)
        b = system_bound(cfg, chip, 1, I, O)
        loop = sum(step_floor(cfg, Workload("decode", 1, s), chip)[0] for s in range(I + 1, I + O))
        pre = step_floor(cfg, Workload("prefill", 1, I), chip)[0]
        lm = 2 * cfg.d_model * cfg.vocab_size  # one row's logits, not I
        assert b.flops == pytest.approx(pre - lm * (I - 1) + loop, rel=1e-12)


def test_series_sum_is_exact_with_and_without_its_kinks():
    f = lambda s: 3.0 * min(s, 100) + 1  # noqa: E731
    brute = sum(f(s) for s in range(40, 301))
    assert series_sum(f, 40, 300, (100,)) == pytest.approx(brute, rel=1e-15)
    assert series_sum(f, 40, 300) == pytest.approx(brute, rel=1e-15)  # found term by term
    assert series_sum(f, 5, 4) == 0.0


def test_fp8_compute_lifts_a_compute_bound_system():
    """MLPerf's llama2-70b FP8 case on one H200 is compute-bound: at the FP8 peak its bound is
    1979/989 x the one at bf16's peak (the issue's 3,913 tokens/s a GPU lies between them)."""
    chip = get_chip("h200")
    base = get_model_config("llama-2-70b", weight_dtype="fp8", kv_dtype="fp8")
    bf16 = system_bound(base, chip, 1, 294, 294)
    fp8 = system_bound(base.replace(matmul_dtype="fp8"), chip, 1, 294, 294)
    assert bf16.side == fp8.side == "compute"
    assert fp8.output_tokens_per_s / bf16.output_tokens_per_s == pytest.approx(1979 / 989)
    assert bf16.output_tokens_per_s < 3913 < fp8.output_tokens_per_s


@pytest.mark.parametrize("max_batch", [2, 16, 256])
def test_no_simulated_scheduler_beats_the_bound(max_batch):
    """tiny-gqa on a small chip (3 MB: the cache bounds the batch, a large max batch preempts)
    that is memory-bound: the simulator at the closed form's step times, at any max batch,
    serves below the system bound, and its first and later tokens take longer than theirs."""
    cfg = get_model_config("tiny-gqa")
    chip = chip_from_numbers(1e13, 1e10, memory_bytes=3e6, dtype="f32")
    b = system_bound(cfg, chip, 1, 96, 64)
    assert b.side == "memory"
    reqs = generate(60, rate=1e6, prompt="96", output="64", seed=0)
    pool = kv_pool(cfg, chip, 16, 128, 160, 1.0, reserve_bytes=0, max_batch=max_batch)
    out = report(simulate(reqs, Scheduler(PagePool(pool.pages, 16), max_batch, 128),
                          ClosedFormStepTime(cfg, chip)))  # fmt: skip
    assert out["requests_out"] == 60 and (out["preemptions"] > 0) == (max_batch > 2)
    assert out["throughput_tokens_per_s"] <= b.output_tokens_per_s
    assert out["ttft_s"]["p50"] >= b.ttft_s
    assert out["itl_s"]["p50"] >= b.tpot_s


def test_weights_that_do_not_fit_are_refused_with_the_bytes():
    with pytest.raises(KvjaxError, match=r"do not fit 1 x h100-sxm \(80,000,000,000 B\)"):
        system_bound(get_model_config("seed-70b"), get_chip("h100-sxm"), 1, 100, 100)
    with pytest.raises(KvjaxError, match="metric='goodput' is not supported; allowed"):
        metric_bound(system_bound(get_model_config("tiny-gqa"), get_chip("h100-sxm"), 1, 8, 8),
                     "goodput")  # fmt: skip


def test_the_published_systems_lie_under_their_bounds():
    """experiments/published/systems.csv (MLPerf Inference v4.1/v5.1, TensorRT-LLM's tables, the
    engines' reports): at least 40 rows from 6 source groups, none above its bound; TensorRT-LLM's
    15,244.78 tokens/s for Llama-3.1-8B FP8 on one H100 at 1000/1000 is the bound's own number
    (the FP8 peak, an fp8 cache) at fraction 0.494."""
    rows, summary = validate_systems(read_systems())
    assert summary["rows"] >= 40 and summary["sources"] >= 6
    assert summary["above_bound"] == 0 and all(not r["above_bound"] for r in rows)
    (row,) = [r for r in rows if r["source"] == "trtllm-perf-overview-v0.17:llama-3.1-8b:fp8:"
              "h100-sxm:1000/1000:tp1"]  # fmt: skip
    cfg = get_model_config("llama-3.1-8b", weight_dtype="fp8", kv_dtype="fp8", matmul_dtype="fp8")
    b = system_bound(cfg, get_chip("h100-sxm"), 1, 1000, 1000)
    assert row["bound_value"] == pytest.approx(b.output_tokens_per_s)
    assert row["fraction_of_bound"] == pytest.approx(15244.78 / b.output_tokens_per_s)
    assert 0.49 < row["fraction_of_bound"] < 0.5 and row["bound_assumes"] == []


def test_a_systems_csv_is_checked_and_validated_from_the_cli(tmp_path, capsys):
    from kvjax.cli.main import main
    from kvjax.serving.systems import COLUMNS

    path = tmp_path / "mine.csv"
    good = dict.fromkeys(COLUMNS, "")
    good.update(source="mine", source_group="me", chip="h200", num_chips="8", model="llama-2-70b",
                weight_dtype="fp8", compute_dtype="fp8", scenario="offline", output_len="294.45",
                metric="output_tokens_per_s", scope="per_chip", measured="3913")  # fmt: skip
    lines = [",".join(COLUMNS), ",".join(good[c] for c in COLUMNS)]
    path.write_text("\n".join(lines) + "\n")
    assert main(["validate", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (row,) = out["system_rows"]
    assert out["classes"]["system"]["rows"] == 1 and not row["above_bound"]
    assert row["bound_assumes"] == ["an fp8 cache (the lowest precision h200 computes)",
                                    "1-token prompts (no input length published)",
                                    "the 8 chips as one replica"]  # fmt: skip
    path.write_text("\n".join([*lines, lines[1].replace("output_tokens_per_s", "goodput")]) + "\n")
    with pytest.raises(KvjaxError, match=r"mine.csv:3: metric='goodput' is not one of: "):
        read_systems(path)


def test_a_published_row_is_predicted_by_fits_that_never_saw_its_implementation():
    """TensorRT-LLM's Llama-3.1-8B FP8 on one H100 at 128/128, cut to 60 requests: the simulator
    on trtllm-bench's settings, with kernel classes and a step overhead fitted without any of
    TensorRT-LLM's own rows (its engine steps, its trtllm-gen kernels), predicts below the
    row's bound; the committed predictions are each row's median error's inputs, and each
    interval is calibrated on the other implementations' rows (by hand below)."""
    from kvjax.predict.groups import implementation_of
    from kvjax.predict.validate import corpus_rows
    from kvjax.serving.system_predict import held_fits, predict_row, why_not
    from kvjax.serving.system_summary import MIN_CALIBRATION
    from kvjax.serving.systems import read_predictions

    rows = {r["source"]: r for r in read_systems()}
    row = dict(rows["trtllm-perf-overview-v0.17:llama-3.1-8b:fp8:h100-sxm:128/128:tp1"],
               requests=60)  # fmt: skip
    assert why_not(row) is None and row["implementation"] == "TensorRT-LLM"
    fits = held_fits("TensorRT-LLM")
    left = [r for r in corpus_rows() if r not in corpus_rows("TensorRT-LLM")]
    assert {implementation_of(r.values["implementation"]) for r in left} == {"TensorRT-LLM"}
    assert {r.group for r in left} == {"NVIDIA", "flashinfer-ai"}
    assert fits.overhead.rows < held_fits(None).overhead.rows
    p = predict_row(row)
    assert p["prediction_from"] == fits.source and p["prediction_from"].startswith(
        f"held out: kernel classes and the engine-step overhead fitted without TensorRT-LLM's "
        f"own rows ({len(left)} of"
    )
    assert p["predicted_lo"] < p["predicted_value"] < p["predicted_hi"]
    assert p["requests_simulated"] == 60 and p["preemptions"] == 0
    cfg = get_model_config("llama-3.1-8b", weight_dtype="fp8", kv_dtype="fp8", matmul_dtype="fp8")
    bound = system_bound(cfg, get_chip("h100-sxm"), 1, 128, 128)
    assert 0 < p["predicted_value"] < bound.output_tokens_per_s
    assert why_not({**row, "scenario": "server"}) == (
        "server and interactive rows: only output tokens/s under both stated SLOs")  # fmt: skip
    assert why_not({**row, "scenario": "prefill_only"}).startswith("only offline, fixed-rate")
    # a server row's rate search turns on its TTFT: only chips whose prefill is in the corpus
    # (the B200 has GEMMs and decode there, not yet its prefill)
    from kvjax.predict.corpus import read_corpus
    from kvjax.serving.system_predict import kernel_chips

    measured = {(r.kernel, r.chip) for r in read_corpus()}
    assert ("matmul", "b200") in measured and ("attention_prefill", "b200") not in measured
    assert {"h100-sxm", "h200"} <= kernel_chips() and "b200" not in kernel_chips()
    slo = {"scenario": "server", "chip": "b200", "slo_ttft_s": 2.0, "slo_tpot_s": 0.2}
    assert "whose prefill, decode and GEMM kernels are all in the corpus (not b200" in why_not(
        {**row, **slo}
    )
    committed = read_predictions()
    keyed = {(r["source"], r["metric"]): r for r in read_systems()}  # a server row has 3 metrics
    out, summary = validate_systems(list(keyed.values()))
    errors = [abs(v["predicted_value"] / keyed[k]["measured"] - 1) for k, v in committed.items()]
    assert summary["predicted_rows"] == len(committed) >= 150
    assert summary["loso_median_abs_error"] == pytest.approx(float(np.median(errors)))
    assert all(v["prediction_from"].startswith("held out") for v in committed.values())
    simulated = [v["predicted_lo"] <= keyed[k]["measured"] <= v["predicted_hi"]
                 for k, v in committed.items()]  # fmt: skip
    assert summary["simulated_coverage_80"] == pytest.approx(float(np.mean(simulated)))
    # the calibrated interval by hand: an implementation's ends are the order statistics
    # ceil(0.9 (n + 1)) from each side of the other implementations' n log(measured /
    # predicted) on the row's chip family, where n reaches MIN_CALIBRATION; else the simulated
    from kvjax.predict.groups import chip_family

    impl = {k: (keyed[k]["implementation"], chip_family(keyed[k]["chip"])) for k in committed}
    resid = {k: math.log(keyed[k]["measured"] / v["predicted_value"]) for k, v in committed.items()}
    inside = []
    for k, v in committed.items():
        others = sorted(
            r for j, r in resid.items() if impl[j][0] != impl[k][0] and impl[j][1] == impl[k][1]
        )
        if len(others) < MIN_CALIBRATION:
            inside.append(v["predicted_lo"] <= keyed[k]["measured"] <= v["predicted_hi"])
            continue
        m = math.ceil(0.9 * (len(others) + 1))
        inside.append(others[len(others) - m] <= resid[k] <= others[m - 1])
    assert summary["loso_coverage_80"] == pytest.approx(float(np.mean(inside)))
    by_impl = summary["by_implementation"]
    assert summary["median_of_implementation_medians"] == pytest.approx(
        float(np.median([e["median_abs_error"] for e in by_impl.values()]))
    )
    assert sum(e["rows"] for e in by_impl.values()) == summary["predicted_rows"]
    assert set(summary["by_chip_family"]) <= {"Hopper", "Blackwell", "Ampere", "AMD", "TPU"}


def test_a_mean_prompt_enters_the_prefill_flops_only_and_by_jensen():
    """A published mean prompt (prefill_len) over the shortest (input_len): the prefill's FLOPs
    at the mean are at most the mean of the prefills' (checked on spread lengths, a windowed model
    crossing its window too); the decodes' FLOPs and every byte stay at the shortest prompt."""
    chip = get_chip("h100-sxm")
    for name, lengths in (("llama-3-8b", [476, 900, 19_988]), ("mistral-7b", [100, 4000, 9000])):
        cfg = get_model_config(name)
        mean = sum(lengths) / len(lengths)
        each = [system_bound(cfg, chip, 1, n, 20) for n in lengths]
        at_mean = system_bound(cfg, chip, 1, min(lengths), 20, prefill_len=mean)
        shortest = system_bound(cfg, chip, 1, min(lengths), 20)
        lm = 2 * cfg.d_model * cfg.vocab_size  # one row's logits a prefill

        def prefill(n, cfg=cfg, lm=lm):
            return step_floor(cfg, Workload("prefill", 1, n), chip)[0] - lm * (n - 1)

        assert sum(prefill(n) for n in lengths) / len(lengths) >= prefill(int(mean))
        lo = int(mean)
        by_hand = prefill(lo) + (mean - lo) * (prefill(lo + 1) - prefill(lo))
        assert at_mean.flops - shortest.flops == pytest.approx(by_hand - prefill(min(lengths)))
        assert sum(b.flops for b in each) / len(each) >= at_mean.flops
        assert (at_mean.bytes, at_mean.ttft_s) == (shortest.bytes, shortest.ttft_s)
        assert at_mean.input_tokens_per_s == pytest.approx(
            mean / max(at_mean.compute_s, at_mean.memory_s)
        )
    with pytest.raises(KvjaxError, match="prefill_len=10 .* is below input_len=20"):
        system_bound(get_model_config("tiny-gqa"), chip, 1, 20, 8, prefill_len=10)


def test_mlperfs_length_distributions_are_committed_with_their_sources():
    """Every MLPerf distribution a row names is in experiments/published/lengths.csv with its
    source; llama3.1-405b's stated shortest (476) and mean (9,428) prompt enter its rows' bound."""
    from kvjax.serving.systems import LENGTHS_CSV, read_lengths

    lengths = read_lengths()
    named = {r["length_distribution"] for r in read_systems()}
    assert {n for n in named if n and n.startswith("mlperf-")} <= set(lengths)
    for d in lengths.values():
        assert d["source"] and d["file"] and d["quote"] and d["samples"] > 0
    # the other MLPerf datasets' prompts: per-sample counts from MLCommons' preprocessed files
    # (the same extraction reproduces 405B's published 476/9428/19988 and mixtral's 144.84)
    prompts = {"mlperf-llama2-70b-openorca": (48, 222.33, 1021),
               "mlperf-mixtral-8x7b-orca-gsm8k-mbxp-15000": (35, 427.39, 1948),
               "mlperf-deepseek-r1-4388": (52, 803.79, 3140),
               "mlperf-llama3.1-8b-cnndm-13368": (79, 870.73, 2540)}  # fmt: skip
    for name, (lo, mean, hi) in prompts.items():
        d = lengths[name]
        assert (d["input_min"], d["input_mean"], d["input_max"]) == (lo, mean, hi)
        assert "openshift-psap/performance-dashboard" in d["file"]
        # the stated cap holds but for llama3.1-8b's and deepseek-r1's longest prompts, which
        # are NVIDIA's pad widths (2540, 3140; said in their sources)
        assert (hi <= d["input_cap"]) == ("openorca" in name or "mixtral" in name)
        assert (hi <= d["input_cap"]) or f"below the longest prompt, {hi}" in d["source"]
    assert "TOKENS_PER_SAMPLE" in lengths["mlperf-mixtral-8x7b-orca-gsm8k-mbxp-15000"]["source"]
    # the per-sample prompts committed beside (experiments/published/lengths/, `sample:FILE` for
    # kvjax simulate --prompt-len) give each MLPerf dataset's stated count, shortest, mean and
    # longest (a run that printed only its totals has no file: its means are the totals')
    for name, d in lengths.items():
        if not name.startswith("mlperf-"):
            assert not (LENGTHS_CSV.parent / "lengths" / f"{name}.csv").exists()
            continue
        each = np.loadtxt(LENGTHS_CSV.parent / "lengths" / f"{name}.csv", skiprows=1)
        assert (len(each), each.min(), each.max()) == (d["samples"], d["input_min"], d["input_max"])
        assert abs(each.mean() - d["input_mean"]) < 1  # 405B's published mean: 9,428 (9,428.64)
    llama = lengths["mlperf-llama3.1-405b-8313"]
    assert (llama["input_min"], llama["input_mean"]) == (476, 9428)
    assert "476 to 19988 tokens with an average of 9428" in llama["quote"]
    llama_rows = [r for r in read_systems() if r["length_distribution"] == llama["name"]]
    rows, _ = validate_systems(llama_rows)
    assert rows and all(any("prompts of 476 tokens" in a for a in r["bound_assumes"])
                        for r in rows)  # fmt: skip
    assert not any(r["above_bound"] for r in rows)


def test_the_rows_the_simulator_runs_and_how():
    """MLPerf's llama3.1-405b Offline on 8 H200s (TP4 PP2, TensorRT-LLM): its configuration
    file's engine settings, said, at the dataset's published mean prompt (9,428 tokens:
    experiments/published/lengths.csv) and the run's own mean output; TensorRT-LLM's DeepSeek-R1
    H200 ADP run: 8 attention groups with the experts over them (tp 1, ep 8) on its stated
    settings; EP inside tensor parallelism and a dataset without published means are refused by
    reason; llama2-70b's OpenOrca runs, its rows' server scenario (output tokens/s) too."""
    from kvjax.serving import engines
    from kvjax.serving import system_predict as sp

    rows = {r["source"]: r for r in read_systems()}
    mlperf = rows["mlperf-inference-v5.1:Nebius:H200-SXM-141GBx8_TRT:llama3.1-405b:Offline"]
    assert sp.why_not(mlperf) is None
    engine, said = engines.engine_of(mlperf)  # its configuration file's batch 512, 1,536 tokens
    assert (engine["max_batch"], engine["token_budget"], said) == (
        512, 1536, engines.STATED_MLPERF)  # fmt: skip
    assert sp.lengths_of(mlperf) == (9428, round(mlperf["output_len"]))  # the run's own output
    assert sp.placement_of(mlperf) == (4, 2, 1) and 640 < mlperf["output_len"] < 660
    adp = rows["trtllm-bestperf-r1:deepseek-r1:fp8:h200:1k/2k:tp8ep8-adp:max-tput:total"]
    assert sp.why_not(adp) is None and sp.placement_of(adp) == (1, 1, 8)
    engine, said = engines.engine_of(adp)
    assert (engine["max_batch"], engine["token_budget"], said) == (128, 1151, engines.ROW_STATED)
    assert sp.why_not({**adp, "dp_attention": "False"}) == (
        "expert parallelism inside tensor parallelism is not simulated")  # fmt: skip
    orca = next(r for r in rows.values() if r["length_distribution"] == "mlperf-llama2-70b-openorca"
                and r["scenario"] == "offline" and "_TRT" in r["source"])  # fmt: skip
    assert sp.why_not(orca) is None and sp.lengths_of(orca) == (222, round(orca["output_len"]))
    assert sp.why_not({**orca, "length_distribution": "mlperf-unknown", "output_len": None}) == (
        "lengths neither fixed nor a distribution with published means")  # fmt: skip
    server = {**orca, "scenario": "server", "slo_ttft_s": 2.0, "slo_tpot_s": 0.2}
    assert sp.why_not(server) is None
    assert sp.why_not({**server, "metric": "ttft_p99_s"}).startswith("server and interactive")
    trt = rows["trtllm-perf-overview-v0.17:llama-3.1-8b:fp8:h100-sxm:128/128:tp1"]
    assert sp.why_not({**trt, "scope": "per_node"}).startswith("scope 'per_node'")
    assert sp.why_not({**trt, "dp_attention": "True"}).startswith("data-parallel attention")
    # at a fixed rate the queue does not scale with the step: the interval is two more runs,
    # each step at the interval's ends (here 20 requests of the published 500)
    ttft = rows["trtllm-perf-overview-online-v0.14:llama-3.1-8b:bf16:h100-sxm:467/256:tp1:qps16:"
                "ttft_mean_s"]  # fmt: skip
    p = sp.predict_row({**ttft, "requests": 20})
    assert p["predicted_lo"] < p["predicted_value"] < p["predicted_hi"] and p["rate_per_s"] == 16


def test_a_servers_slo_percentiles_are_mlperfs():
    """TTFT from arrival to the first token; TPOT a request's first-to-last token time over its
    other tokens (LoadGen's), each at the percentile over requests; a 1-token request has none."""
    from types import SimpleNamespace

    from kvjax.serving.slo_search import slo_percentiles

    reqs = [SimpleNamespace(arrival_s=a, token_times=t) for a, t in
            ((0.0, [1.0, 1.5, 2.0]), (1.0, [1.5, 3.5]), (2.0, [2.25]))]  # fmt: skip
    ttft, tpot = slo_percentiles(SimpleNamespace(requests=reqs), 100)
    assert (ttft, tpot) == (1.0, 2.0)  # the slowest: 1 s to a first token, 2 s a token after
    ttft50, tpot50 = slo_percentiles(SimpleNamespace(requests=reqs), 50)
    assert (ttft50, tpot50) == (0.5, 1.25)  # medians of (1, 0.5, 0.25) and of (0.5, 2)


def test_mlperf_rows_run_the_engine_their_configuration_file_states():
    """Cisco's C885 H200 llama2-70b (MLPerf v5.1): Offline at batch 2048 and 1,536 tokens a step,
    Interactive at 512 and 256, both MAX_UTILIZATION (no reservation) in 0.9 of free memory, as
    closed/Cisco/configs/C885_H200x8/*/llama2-70b.py states; NVIDIA's v4.1 H200 x 8 Offline at
    806 and 4,096 tokens, its class's settings through its bases; each extracted row cites the
    file the row's own quote names and quotes its numbers; rows without a configuration file
    read keep trtllm-bench's defaults, said; Blackwell server rows are not searched, said."""
    from kvjax.serving import engines
    from kvjax.serving import system_predict as sp

    rows = {(r["source"], r["metric"]): r for r in read_systems()}
    cisco = "mlperf-inference-v5.1:Cisco:C885_H200x8_TRT:llama2-70b-99:"
    for scenario, batch, tokens in (("Offline", 2048, 1536), ("Interactive", 512, 256)):
        engine, said = engines.engine_of(rows[(cisco + scenario, "output_tokens_per_s")])
        assert said == engines.STATED_MLPERF
        assert engine == dict(max_batch=batch, token_budget=tokens, reserve=False, free=0.9,
                              util=1.0)  # fmt: skip
    stated = pd.read_csv(engines.MLPERF_ENGINES_CSV, keep_default_na=False)
    assert len(stated) >= 100
    for r in stated.to_dict("records"):
        row = rows[(r["source"], "output_tokens_per_s")]
        assert "_TRT" in r["source"] and r["file"].endswith(row["quote"].split("config: ")[1]
                                                            .split()[0])  # fmt: skip
        # a config's batch ({'llama2-70b': 2048}), or Cisco's multi-node resolver's BATCH_SIZE=
        assert re.search(rf"(': |BATCH_SIZE=){r['max_batch']}\b", r["quote"])
        assert re.search(rf"'?max_num_tokens'?( =|:) ?{r['max_num_tokens']}\b", r["quote"])
        batch = re.search(r"gpu_batch_size: \{ '[^']+': (\d+)", row["quote"])
        assert batch is None or int(batch.group(1)) == r["max_batch"]  # the row's own quote
    v41 = rows[("mlperf-inference-v4.1:NVIDIA:H200-SXM-141GBx8_TRT:llama2-70b-99:Offline",
                "output_tokens_per_s")]  # fmt: skip
    assert engines.engine_of(v41) == (dict(max_batch=806, token_budget=4096, reserve=False,
                                           free=0.9, util=1.0), engines.STATED_MLPERF)  # fmt: skip
    quoted = stated.set_index("source").loc[v41["source"], "quote"]
    assert "H200_SXM_141GBx8: gpu_batch_size = {'llama2-70b': 806} (H200_SXM_141GBx1)" in quoted
    asus = rows[("mlperf-inference-v4.1:ASUSTeK:ESC_N8_E11_H100x8_TRT:llama2-70b-99:Offline",
                 "output_tokens_per_s")]  # fmt: skip
    engine, said = engines.engine_of(asus)  # its custom.py class: batch 896, 4,096 tokens
    assert (engine["max_batch"], engine["token_budget"], said) == (896, 4096, engines.STATED_MLPERF)
    assert (asus["tp"], asus["pp"], asus["compute_dtype"], asus["kv_dtype"]) == (2, 1, "fp8", "fp8")
    # Cisco's configs/C885_H200x8/ holds no llama3_1-8b.py: trtllm-bench's defaults, said
    cisco8b = rows[
        ("mlperf-inference-v5.1:Cisco:C885_H200x8_TRT:llama3.1-8b:Offline", "output_tokens_per_s")
    ]
    assert engines.engine_of(cisco8b) == (engines.TRTLLM_BENCH, engines.UNSTATED)
    b200 = rows[("mlperf-inference-v5.1:Broadcom_Supermicro:vSYS-422GA-NBRT-B200-SXM-180GBx8_TRT:"
                 "llama3.1-405b:Server", "output_tokens_per_s")]  # fmt: skip
    assert "b200" not in sp.kernel_chips() and "h200" in sp.kernel_chips()
    assert sp.why_not(b200).startswith("server and interactive rows are searched only on chips")


def test_the_readmes_table_of_published_systems_is_validates_and_the_committed_predictions():
    """Each row of the README's table: the measured value, the bound and its side, the fraction
    and the held-out prediction with its 80% interval, as `kvjax validate` and the committed
    predictions give them."""
    from pathlib import Path

    rows = {(r["source"], r["metric"]): r for r in validate_systems(read_systems())[0]}
    v41 = "mlperf-inference-v4.1:NVIDIA:H200-SXM-141GBx8_TRT:llama2-70b-99:"
    table = {
        "TensorRT-LLM v0.17, Llama-3.1-8B FP8, one H100, 1000/1000 tokens": (
            "trtllm-perf-overview-v0.17:llama-3.1-8b:fp8:h100-sxm:1000/1000:tp1",
            "output_tokens_per_s"),
        "MLPerf v4.1 NVIDIA, llama2-70b Offline, 8 x H200 (TP1 x 8, FP8)": (
            v41 + "Offline", "output_tokens_per_s"),
        "the same, Server (TTFT P99 <= 2 s, TPOT P99 <= 200 ms)": (
            v41 + "Server", "output_tokens_per_s"),
        "the same, Server TPOT P99": (v41 + "Server", "tpot_p99_s"),
        "MLPerf v5.1 Nebius, llama3.1-405b Offline, 8 x H200 (TP4 x PP2, FP8)": (
            "mlperf-inference-v5.1:Nebius:H200-SXM-141GBx8_TRT:llama3.1-405b:Offline",
            "output_tokens_per_s"),
    }  # fmt: skip
    readme = (Path(__file__).parents[1] / "README.md").read_text().splitlines()
    for label, key in table.items():
        r = rows[key]
        if key[1] == "tpot_p99_s":
            cells = [f"{r['measured'] * 1e3:.0f} ms", f">= {r['bound_value'] * 1e3:.1f} ms"]
        else:
            side = f"{r['bound_value']:,.0f} ({r['bound_side']})"
            cells = [f"{r['measured']:,.0f} tokens/s", side]
        cells.append(f"{r['fraction_of_bound']:.2f}")
        p = r.get("held_out_predicted_value")
        cells.append("-" if p is None else f"{p:,.0f} ({p / r['measured'] - 1:+.1%}) "
                     f"[{r['predicted_lo']:,.0f}, {r['predicted_hi']:,.0f}]")  # fmt: skip
        assert f"| {label} | {' | '.join(cells)} |" in readme, label


def test_the_readmes_held_out_by_implementation_table_is_validates():
    """The README's and VALIDATE.md's rows per implementation and chip family: each count,
    median error and coverage as `classes.system` gives them."""
    from pathlib import Path

    _, s = validate_systems(read_systems())
    root = Path(__file__).parents[1]
    readme = (root / "README.md").read_text().splitlines()
    validate_md = (root / "experiments/published/VALIDATE.md").read_text()
    assert len(s["by_implementation"]) >= 5  # every implementation predicted, each a row
    for name, e in s["by_implementation"].items():
        cells = f"| {e['rows']} | {e['median_abs_error']:.1%} | {e['coverage_80']:.0%} |"
        assert f"| {name} {cells}" in readme, name
        assert f"| {e['rows']} | {e['median_abs_error']:.1%} | {e['median_ratio']:.2f} |" in (
            validate_md
        )
    fams = ("Hopper", "Blackwell", "Ampere", "AMD", "TPU")
    got = [s["by_chip_family"][f] for f in fams]
    rows = " / ".join(str(e["rows"]) for e in got)
    errors = " / ".join(format(e["median_abs_error"], ".1%") for e in got)
    covered = " / ".join(format(e["coverage_80"], ".0%") for e in got)
    assert f"| {' / '.join(fams)} | {rows} | {errors} | {covered} |" in readme
    pooled = s["median_of_implementation_medians"]
    assert f"| median of the implementations' medians | | {pooled:.1%} | | |" in validate_md
    assert (f"| all predicted rows | {s['predicted_rows']} | {s['loso_median_abs_error']:.1%} | "
            f"| {s['loso_coverage_80']:.0%} |") in validate_md  # fmt: skip
    pooled_row = (
        f"| all predicted rows | {s['predicted_rows']} | {s['loso_median_abs_error']:.1%} | "
        f"{s['loso_coverage_80']:.0%} |"
    )
    assert pooled_row in readme


def test_a_concurrency_row_runs_its_closed_loop():
    """NIM's Llama-3.3-70B at concurrency 1 (5000/500 tokens, 2 H100 at TP2): one client, so each
    request is sent when the last finishes and its TTFT is one 5,000-token prefill (well under a
    second on two H100s), not the wait behind the requests before it (which an open run at an
    unbounded rate would charge: seconds a request)."""
    from kvjax.serving import system_predict as sp

    rows = {r["source"]: r for r in read_systems()}
    nim = "nim-bench-1.0.0:llama-3.3-70b:nim-1.8.0:2xh100:fp8-tp2:in5000-out500:c1:ttft"
    row = dict(rows[nim], requests=3)
    run = sp.deployment(row, sp.held_fits(row["implementation"]))
    assert (run.concurrency, run.replicas, run.deployment.placement.tp) == (1, 1, 2)
    ttft = sp.predict_row(row)["predicted_value"]
    assert 0.05 < ttft < 1.0
