"""The scheduler and the simulator's clock (issue 41), by hand: pages held with a shared prefix,
preemption by recompute on a constructed trace, Little's law over a long run, no request lost or
served twice, and bad input refused by name."""

import json
from pathlib import Path

import numpy as np
import pytest

from kvjax import get_model_config, kernels
from kvjax.errors import KvjaxError
from kvjax.hardware import get_chip
from kvjax.serving.load import generate, read_trace
from kvjax.serving.pages import PagePool
from kvjax.serving.scheduler import Request, Scheduler
from kvjax.serving.simulate import report, simulate


def one_second(batch):
    return 1.0


def test_a_shared_prefix_is_held_once():
    """Pages of 16; a 64-token system prompt and 20 tokens each. A arrives first and prefills all
    84 (6 pages; its 5 full prompt pages enter the cache). B, arriving during that step, finds
    the 4 prefix pages (its 5th full page is its own), computes 20 tokens on 2 new pages: the pool
    holds 6 + 2 = 8 pages, not 12."""
    pool = PagePool(32, 16)
    sched = Scheduler(pool, max_batch=8, token_budget=512)
    a = Request(0, 0.0, 84, 3, prefix_id=7, prefix_len=64)
    b = Request(1, 0.5, 84, 3, prefix_id=7, prefix_len=64)
    sched.add(a)
    first = sched.schedule()
    assert [(s.request.id, s.tokens) for s in first] == [(0, 84)]
    sched.finish_step(first, 1.0)
    sched.add(b)
    second = sched.schedule()
    assert [(s.request.id, s.tokens) for s in second] == [(0, 1), (1, 20)]
    assert pool.used_pages == 8 and len(a.pages) == 6 and len(b.pages) == 6
    assert a.pages[:4] == b.pages[:4] and all(pool.refs[p] == 2 for p in a.pages[:4])
    assert b.cached_tokens == 64 and (pool.hits, pool.lookups) == (4, 10)
    sched.finish_step(second, 2.0)
    assert (a.generated, b.generated) == (2, 1)


def test_preemption_by_recompute_on_a_constructed_trace():
    """10 pages of 16; A and B each a 64-token prompt (4 pages) and 60 outputs (123 tokens of KV
    at the end: 8 pages). Both prefill in step 1 (8 pages) and take their 5th page in step 2
    (10). In step 18 A's 81st token needs a 6th page: B, admitted last, is preempted (5 pages
    freed, 17 tokens generated). Back at the queue's head it finds 3 of its prompt pages still
    cached but needs 3 more, 1 is free: it waits for A. A takes free pages in the order they were
    freed, evicting B's cached 4th and 3rd prompt pages; when A ends (step 60), B finds its first
    2 pages, recomputes the rest of its 81 tokens and finishes: one preemption, nothing lost."""
    pool = PagePool(10, 16)
    sched = Scheduler(pool, max_batch=8, token_budget=256)
    a, b = Request(0, 0.0, 64, 60), Request(1, 0.0, 64, 60)
    res = simulate([a, b], sched, one_second)
    assert res.preemptions == 1 and (a.preemptions, b.preemptions) == (0, 1)
    assert a.finish_s == 60.0  # one token a step, never held up
    assert b.token_times[:17] == [float(t) for t in range(1, 18)]
    assert b.token_times[17] > a.finish_s  # its 18th token after recomputing, once A is done
    assert b.cached_tokens == 2 * 16  # the failed attempt of step 18 kept none; then 2 pages
    assert a.generated == b.generated == 60 and pool.used_pages == 0 and set(pool.refs) == {0}


def test_a_step_that_preempts_admits_nothing_as_vllm_v1():
    """Pool of 6 pages of 4, budget 8; A (prompt 4, output 15: 18 tokens of KV, 5 pages) and B
    (prompt 15, output 10: 24 tokens, 6 pages) arrive together and cannot both finish in it. In
    step 5 B's 17th token needs a 5th page and none is free: B, admitted last, preempts itself
    (4 pages freed). vLLM v1's `schedule` admits no waiting request in a step that preempted
    (`if not preempted_reqs`), so B comes back in step 6 and recomputes 7 tokens beside A's
    decode, is preempted again the step after, ... until A ends: 5 preemptions in 25 steps. Had
    step 5 re-admitted B into the pages it freed (kvjax's scheduler did), every step from 5 to
    14 would preempt it: 10."""
    pool = PagePool(6, 4)
    sched = Scheduler(pool, max_batch=8, token_budget=8, prefix_caching=False)
    a, b = Request(0, 0.0, 4, 15), Request(1, 0.0, 15, 10)
    sched.add(a)
    sched.add(b)
    steps, t = [], 0
    while sched.running or sched.waiting:
        before = sched.preemptions
        batch = sched.schedule()
        t += 1
        sched.finish_step(batch, float(t))
        steps.append(([(s.request.id, s.tokens) for s in batch], sched.preemptions - before))
    assert sched.preemptions == b.preemptions == 5 and a.preemptions == 0 and t == 25
    assert steps[4] == ([(0, 1)], 1)  # step 5: A's decode only; B preempted, not re-admitted
    assert steps[5] == ([(0, 1), (1, 7)], 0)  # step 6: B back, 7 tokens of recompute
    for batch, preempted in steps:
        assert not (preempted and any(i == 1 and n > 1 for i, n in batch))  # no re-admission
    assert (a.generated, b.generated) == (15, 10) and a.finish_s == 15.0 and b.finish_s == 25.0
    assert pool.used_pages == 0


def test_prefix_lookups_count_once_per_admitted_request():
    """Pages of 4, a pool of 5. A (prompt 9 over an 8-token shared prefix, 8 outputs: 16 tokens
    of KV, 4 pages) looks up its 2 full prompt pages (no hit) and caches them. After 5 steps it
    holds 4 pages, 1 is free. B (prompt 16 over the same prefix, 2 outputs) finds the 2 prefix
    pages but needs 2 more for its other 8 prompt tokens: its admission fails in steps 6, 7 and
    8 (while A decodes) and holds in step 9, after A ended. vLLM v1 records a request's prefix
    lookups after `allocate_slots` succeeds, so B's 3 lookups (2 hits) count once, not 4 times
    (before, 14 lookups and 8 hits: a hit rate of 57% instead of 40%)."""
    pool = PagePool(5, 4)
    sched = Scheduler(pool, max_batch=8, token_budget=64)
    a = Request(0, 0.0, 9, 8, prefix_id=1, prefix_len=8)
    sched.add(a)
    t = 0
    for _ in range(5):
        t += 1
        sched.finish_step(sched.schedule(), float(t))
    assert len(a.pages) == 4 and pool.free_pages == 1 and (pool.lookups, pool.hits) == (2, 0)
    b = Request(1, float(t), 16, 2, prefix_id=1, prefix_len=8)
    sched.add(b)
    attempts = 0
    while b in sched.waiting:
        attempts += 1
        t += 1
        sched.finish_step(sched.schedule(), float(t))
    assert attempts == 4 and t == 9 and a.finish_s == 8.0  # failed in steps 6-8, in at 9
    assert (pool.lookups, pool.hits) == (2 + 3, 0 + 2) and b.cached_tokens == 8
    assert (pool.preempted_lookups, pool.preempted_hits) == (0, 0)
    while sched.running:
        t += 1
        sched.finish_step(sched.schedule(), float(t))
    assert b.generated == 2 and pool.used_pages == 0
    rep = report(simulate([Request(0, 0.0, 9, 8, prefix_id=1, prefix_len=8),
                           Request(1, 5.0, 16, 2, prefix_id=1, prefix_len=8)],
                          Scheduler(PagePool(5, 4), 8, 64), one_second))  # fmt: skip
    assert rep["prefix_hit_rate"] == pytest.approx(2 / 5)


def test_littles_law_over_a_long_run():
    """Mean requests in the system (the integral the clock keeps) = arrival rate x mean end-to-end
    time, within 2%, over 20,000 Poisson arrivals at the configured rate."""
    reqs = generate(20000, rate=50.0, prompt="uniform:16:48", output="uniform:4:12", seed=1)

    def step(batch):  # 2 ms a step plus 20 us a token
        return 2e-3 + 2e-5 * sum(s.tokens for s in batch)

    res = simulate(reqs, Scheduler(PagePool(4096, 16), 64, 512), step)
    out = report(res)
    assert out["requests_in"] == out["requests_out"] == 20000
    assert out["mean_requests_in_system"] == pytest.approx(50.0 * out["e2e_s"]["mean"], rel=0.02)


def test_one_server_queue_is_m_d_1():
    """One slot, requests of a 1-token prompt and 1 output: each is one step of D seconds, served
    first come first served: an M/D/1 queue. Its mean wait (Pollaczek-Khinchine) is
    lambda D^2 / (2 (1 - rho)), rho = lambda D, so the mean TTFT (wait, then its step) is
    D + that: at rho = 0.6, D = 10 ms, 17.5 ms. 40,000 Poisson arrivals: within 2%; the busy
    fraction is rho and the throughput lambda tokens a second, within 1%."""
    D, rate = 0.01, 60.0
    reqs = generate(40000, rate=rate, prompt="1", output="1", seed=5)
    res = simulate(reqs, Scheduler(PagePool(4, 16), 1, 16), lambda batch: D)
    out = report(res)
    rho = rate * D
    assert out["ttft_s"]["mean"] == pytest.approx(D + rate * D**2 / (2 * (1 - rho)), rel=0.02)
    assert out["busy_fraction"] == pytest.approx(rho, rel=0.01)
    assert out["throughput_tokens_per_s"] == pytest.approx(rate, rel=0.01)


def test_no_request_is_lost_or_served_twice():
    reqs = generate(300, rate=200.0, prompt="lognormal:60:0.8", output="uniform:1:30", seed=3,
                    prefix_len=32, prefix_share=0.5)  # fmt: skip
    res = simulate(reqs, Scheduler(PagePool(64, 16), 16, 128), lambda b: 1e-3 * len(b))
    out = report(res)
    assert out["requests_in"] == out["requests_out"] == 300
    assert all(len(r.token_times) == r.generated == r.output_len for r in reqs)
    assert all(np.all(np.diff(r.token_times) > 0) for r in reqs)
    assert res.pages_in_use[-1][1] == 0 and out["preemptions"] > 0  # a tight pool, reclaimed


def test_closed_form_step_time_splits_a_mixed_batch():
    """A decode of one request at S plus a prefill of another at T: the context-free kernels once
    over M = 1 + T tokens, the LM head over the 2 sampled rows, the attention of each at its own
    context."""
    from kvjax.analytic import Workload, roofline, step_kernels
    from kvjax.serving.scheduler import Scheduled
    from kvjax.serving.step_time import LOGITS, ClosedFormStepTime

    cfg, chip = get_model_config("llama-3-8b"), get_chip("h100-sxm")
    model = ClosedFormStepTime(cfg, chip)
    decode = step_kernels(cfg, Workload("decode", 1, 64), chip)
    assert set(decode) - model.shared == {kernels.SCORES, kernels.SOFTMAX, kernels.AV}
    r = Request(0, 0.0, 10, 2)
    batch = [Scheduled(r, 1, 4096), Scheduled(r, 512, 512)]
    peak, bw = chip.peak("bf16"), chip.bandwidth_bytes_per_s

    def bound(wl, keep):
        return sum(roofline.bound_time_s(k.flops, k.bytes, peak, bw)
                   for n, k in step_kernels(cfg, wl, chip).items() if keep(n))  # fmt: skip

    def attn(n):
        return n not in model.shared

    want = (bound(Workload("decode", 513, 1), lambda n: not attn(n) and n not in LOGITS)
            + bound(Workload("decode", 2, 1), lambda n: n in LOGITS)
            + bound(Workload("decode", 1, 4096), attn)
            + bound(Workload("prefill", 1, 512), attn))  # fmt: skip
    assert model(batch) == pytest.approx(want, rel=1e-12)


def test_a_fused_mla_chunk_is_its_own_attention_and_latent_expansion():
    """With fused attention on a chip, flash-decoding's combine and an MLA chunk's expansion of
    the cached latents (kv_b_proj over S positions) are the request's own kernels: a 512-token
    chunk at 8192 costs more than one at 1024, by its attention and its expansion alone."""
    from kvjax.serving.scheduler import Scheduled
    from kvjax.serving.step_time import ClosedFormStepTime

    chip = get_chip("h100-sxm")
    mla = get_model_config("tiny-mla", attention_kernel="flash")
    model = ClosedFormStepTime(mla, chip)
    assert kernels.KV_B_PROJ not in model.shared and kernels.Q_PROJ in model.shared
    flash = ClosedFormStepTime(get_model_config("llama-3-8b", attention_kernel="flash"), chip)
    assert kernels.ATTN_COMBINE not in flash.shared
    r = Request(0, 0.0, 10, 2)
    near, far = (model([Scheduled(r, 512, s)]) for s in (1024, 8192))
    assert far > near
    assert far - near == pytest.approx(
        model._request_s(512, 8192)[0] - model._request_s(512, 1024)[0], rel=1e-12
    )


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: Scheduler(PagePool(4, 16), 8, 64).add(Request(5, 0.0, 60, 10)),
         "request 5: 60 + 10 tokens need 5 pages of 16; the pool has 4: it can never be served"),
        (lambda: Request(1, 0.0, 0, 3), "request 1: prompt_len=0 must be an integer >= 1"),
        (lambda: generate(3, 1.0, "uniform:9:2", "8"), "prompt_len='uniform:9:2': give a length"),
        (lambda: generate(3, -1.0, "8", "8"), "rate=-1.0 must be a number > 0"),
    ],
)  # fmt: skip
def test_bad_input_is_named(make, message):
    with pytest.raises(KvjaxError, match=message.replace("(", r"\(").replace("+", r"\+")):
        make()


def test_a_malformed_trace_names_its_line(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("arrival_s,prompt_len,output_len\n0.0,100,20\n0.5,abc,20\n")
    with pytest.raises(KvjaxError, match=r"trace.csv:3: arrival_s >= 0"):
        read_trace(path)
    path.write_text("arrival_s,prompt_len,output_len\n0.0,100,20\n0.25,50,5\n")
    assert [(r.arrival_s, r.prompt_len, r.output_len) for r in read_trace(path)] == [
        (0.0, 100, 20), (0.25, 50, 5)]  # fmt: skip


def test_cli_simulate_json_and_errors(tmp_path, capsys):
    import json

    from kvjax.cli import main

    argv = ["simulate", "--model", "llama-3-8b", "--chip", "h100-sxm", "--rate", "2",
            "--requests", "30", "--prompt-len", "uniform:200:600", "--output-len", "32",
            "--slo-ttft", "1", "--slo-itl", "0.05"]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests_in"] == out["requests_out"] == 30
    for key in ("ttft_s", "itl_s", "e2e_s"):
        assert set(out[key]) == {"mean", "p50", "p90", "p99"}
    # the pool as engines count it: 0.9 x 80 GB less the weights, the largest step and the
    # engine's reserves, in pages of 16 tokens of 131,072 bytes (32 layers x 8 KV heads x 128
    # x 2 x 2 bytes)
    assert out["kv_bytes_per_token"] == 32 * 8 * 128 * 2 * 2
    free = 0.9 * 80e9 - out["weight_bytes"] - out["activation_bytes"] - out["reserve_bytes"]
    assert out["kv_pool_pages"] == int(free // (16 * 131072))
    assert out["kv_pool_tokens"] == 16 * out["kv_pool_pages"]
    assert out["goodput_requests_per_s"] <= out["requests_out"] / out["duration_s"]
    assert main([*argv, "--json", "--disaggregate", "--price-per-chip-hour", "2"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert two["chips"] == 2 and two["requests_out"] == 30 and two["disaggregated"]
    assert two["instances"] == {"prefill": 1, "decode": 1}
    assert main([*argv, "--json", "--disaggregate", "2p1d", "--tp", "2"]) == 0
    six = json.loads(capsys.readouterr().out)
    assert (six["chips"], six["tp"], six["requests_out"]) == (6, 2, 30)
    assert six["instances"] == {"prefill": 2, "decode": 1}
    held = 2 * two["duration_s"]  # chip-seconds
    assert two["energy_j_per_output_token"] == pytest.approx(700 * held / two["output_tokens"])
    assert two["cost_per_million_output_tokens"] == pytest.approx(
        2 * held / 3600 / two["output_tokens"] * 1e6
    )
    hybrid_argv = ["simulate", "--model", "tiny-falcon-h1", "--chip", "h100-sxm", "--rate",
                   "5", "--requests", "5", "--prompt-len", "64", "--output-len", "4",
                   "--json"]  # fmt: skip
    assert main(hybrid_argv) == 0
    hybrid = json.loads(capsys.readouterr().out)
    assert "state layers" in hybrid["whole_prefill_reason"] and not hybrid["chunked_prefill"]
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_len,output_len\n0,10,5\n1,-4,5\n")
    assert main([*argv, "--trace", str(path)]) == 2
    assert "t.csv:3:" in capsys.readouterr().err
    path.write_text("arrival_s,prompt_len,output_len\n0,10,5\n1,900000,5\n")
    flash = ["--attention-kernel", "flash"]  # unfused, its scores alone would not fit
    assert main([*argv, *flash, "--trace", str(path)]) == 2
    assert "request 1: 900000 + 5 tokens need" in capsys.readouterr().err
    assert main([*argv, "--trace", str(path)]) == 2  # the largest step's activations, named
    # 2048 tokens x 32 heads x 900,005 positions x (4 + 2) bytes + 2 x 2048 x 4096 x 2
    assert "the largest step's activations 353,929,920,512 B" in capsys.readouterr().err


def test_without_chunked_prefill_a_prompt_waits_for_a_budget_that_holds_it():
    """Budget 100: A's 60-token prompt runs; B's 50 do not fit beside it (40 left), so B waits a
    step instead of prefilling 40 now and 10 later; then B's prefill and A's decode share one."""
    sched = Scheduler(PagePool(64, 16), 8, 100, chunked_prefill=False)
    sched.add(Request(0, 0.0, 60, 4))
    sched.add(Request(1, 0.0, 50, 4))
    first = sched.schedule()
    assert [(s.request.id, s.tokens) for s in first] == [(0, 60)]
    sched.finish_step(first, 1.0)
    assert [(s.request.id, s.tokens) for s in sched.schedule()] == [(0, 1), (1, 50)]
    chunked = Scheduler(PagePool(64, 16), 8, 100)
    chunked.add(Request(0, 0.0, 60, 4))
    chunked.add(Request(1, 0.0, 50, 4))
    assert [(s.request.id, s.tokens) for s in chunked.schedule()] == [(0, 60), (1, 40)]


def test_goodput_experiment_orders_the_variants_and_finds_the_knee(tmp_path):
    """configs/serving_goodput.yaml's experiment on 40 requests of llama-3-8b shapes on an H100:
    each variant's knee holds the attainment and a rate 5% above it does not; MQA >= GQA >= MHA;
    energy per token is the rated 700 W over the output tokens per second; the quality costs are
    the committed CSV's; the figure draws."""
    import csv

    import pandas as pd

    from experiments.serving_goodput import QUALITY, _runner
    from kvjax.plotting import make_figures
    from kvjax.runs.launcher import run_config

    config = tmp_path / "g.yaml"
    config.write_text(
        "experiment: serving_goodput\nmodel:\n  preset: llama-3-8b\n  attention_kernel: flash\n"
        "chip:\n  preset: h100-sxm\noptions:\n  rates: [1, 4]\n  requests: 40\n"
        "  prompt_len: 8192\n  output_len: 64\n  knee_rtol: 0.05\n"
    )
    runs = run_config(config, runs_root=tmp_path / "runs", progress=False)
    df = pd.DataFrame([r for run in runs for r in run.records()])
    knees = df[df.knee.astype(bool)].set_index("variant")
    rate = knees.rate_requests_per_s
    assert rate["MQA"] >= rate["GQA"] >= rate["MHA"] > 0
    assert (knees.attainment >= 0.9).all()
    H100 = get_chip("h100-sxm")
    for variant, row in knees.iterrows():
        cfg = get_model_config("llama-3-8b", attention_kernel="flash",
                               num_kv_heads=int(row.num_kv_heads))  # fmt: skip
        if variant.startswith("MLA"):
            continue
        run = _runner(cfg, H100, {"requests": 40, "prompt_len": 8192, "output_len": 64,
                                  "page_size": 16, "token_budget": 2048, "max_batch": 256,
                                  "seed": 0, "slo_ttft_s": 2.0, "slo_itl_s": 0.05,
                                  "price_per_chip_hour": None})  # fmt: skip
        assert run(row.rate_requests_per_s * 1.05)["attainment"] < 0.9, variant
    assert knees.energy_j_per_output_token.to_numpy() == pytest.approx(
        700 / knees.throughput_tokens_per_s.to_numpy()
    )
    with open(QUALITY) as f:
        want = next(float(r["mean"]) for r in csv.DictReader(f)
                    if r["comparison"] == "h_kv=2 - MHA" and r["family"] == "stdlib")  # fmt: skip
    assert knees.quality_variant_delta["GQA"] == want  # GQA-8: 4 query heads a KV head
    assert knees.quality_variant_delta["MHA"] == 0
    # DeepSeek-V2's recipe holds 576 / 8192 = 0.070 of MHA's cache: the committed MLA nearest in
    # share (on a log scale) is the quality model's latent of 24, 1/8 of its MHA's
    mla = knees[knees.index.str.startswith("MLA")]
    assert mla.quality_variant.str.startswith("stdlib MLA-24 - MHA").all()
    with open(QUALITY) as f:
        want = next(float(r["mean"]) for r in csv.DictReader(f)
                    if r["comparison"] == "MLA-24 - MHA" and r["family"] == "stdlib")  # fmt: skip
    assert (mla.quality_variant_delta == want).all()
    written = make_figures(df.assign(experiment="serving_goodput"), tmp_path / "figs")
    assert "goodput.png" in {p.name for p in written}


def test_the_pool_keeps_reserves_windows_and_states_off_its_pages():
    """llama-3-8b on an H100: 0.9 x 80 GB less the weights, the largest step's activations and
    vLLM's logged 0.69 GiB of CUDA graphs and non-torch memory, in pages of 16 x 131,072 B; a TPU
    keeps no reserve. Mistral's sliding layers and Falcon-H1's states take a slot per request:
    W = 4096 positions capped at the longest request (32 layers x 2,304 x 4,096 B), the states'
    bytes of the closed form."""
    from kvjax.analytic import Workload
    from kvjax.analytic.hybrid import state_bytes
    from kvjax.analytic.sizes import activation_bytes, weight_bytes
    from kvjax.serving.memory import GIB, kv_pool

    cfg, chip = get_model_config("llama-3-8b"), get_chip("h100-sxm")
    pool = kv_pool(cfg, chip, 16, 2048, 8448)
    act = activation_bytes(cfg, Workload("extend", 1, 8448, new_tokens=2048))
    free = 0.9 * 80e9 - weight_bytes(cfg) - act - 0.69 * GIB
    assert pool.pages == int(free // (16 * 32 * 2 * 8 * 128 * 2))
    assert kv_pool(cfg, get_chip("tpu-v5p"), 16, 2048, 8448).reserve_bytes == 0
    mistral = kv_pool(get_model_config("mistral-7b"), chip, 16, 2304, 2304, max_batch=4)
    assert mistral.slot_bytes == 32 * 2304 * 2 * 8 * 128 * 2 and mistral.tokens == 4 * 2304
    falcon = get_model_config("falcon-h1-7b")
    assert kv_pool(falcon, chip, 16, 2304, 2304, max_batch=8).slot_bytes == state_bytes(falcon)
    with pytest.raises(KvjaxError, match="lower --max-batch"):
        kv_pool(get_model_config("mistral-7b"), chip, 16, 2304, 2304, max_batch=256)


def test_a_hybrid_is_served_with_whole_prefills_and_its_mixers_per_request():
    """Falcon-H1 (Mamba-2 heads beside attention): no closed-form extend for its state layers,
    so its prompts are prefilled whole (the scheduler refuses a budget below a whole prompt);
    each request's Mamba-2 scan is its own (prefill and decode forms differ), the projections
    run once over the step's tokens."""
    from kvjax.analytic import Workload, step_kernels
    from kvjax.serving.memory import whole_prefill_reason
    from kvjax.serving.scheduler import Scheduled
    from kvjax.serving.step_time import ClosedFormStepTime

    cfg, chip = get_model_config("tiny-falcon-h1"), get_chip("h100-sxm")
    assert "state layers" in whole_prefill_reason(cfg)
    assert whole_prefill_reason(get_model_config("llama-3-8b")) is None
    model = ClosedFormStepTime(cfg, chip)
    mixers = set(step_kernels(cfg, Workload("decode", 1, 64))) - model.shared
    assert {kernels.SCORES, kernels.AV} < mixers and any(n.startswith("ssm/") for n in mixers)
    r = Request(0, 0.0, 32, 4)
    both = model([Scheduled(r, 1, 64), Scheduled(r, 32, 32)])
    assert both == pytest.approx(
        model._shared(33, 2)[0] + model._request_s(1, 64)[0] + model._request_s(32, 32)[0],
        rel=1e-12,
    )
    with pytest.raises(KvjaxError, match="extend"):
        model([Scheduled(r, 16, 48)])
    with pytest.raises(KvjaxError, match="raise the budget to 35"):
        Scheduler(PagePool(64, 16), 4, 32, chunked_prefill=False).add(Request(7, 0.0, 32, 4))


def test_disaggregation_by_hand_and_against_colocation():
    """One request of 64 + 3 tokens, every step 1 s, its KV 0.5 s over the link: the prefill
    instance samples the first token at 1.0, the decode instance starts at 1.5 and samples at
    2.5 and 3.5. Under load (llama-3-8b on H100s, 8k prompts) no request is lost, the decode
    instance's ITL P99 is its own steps' (no prefill chunk inside them), and the transfer is
    prompt x 131,072 B over 450 GB/s."""
    from kvjax.serving.disagg import kv_transfer_s, simulate_disaggregated
    from kvjax.serving.memory import kv_pool
    from kvjax.serving.step_time import ClosedFormStepTime

    r = Request(0, 0.0, 64, 3)
    simulate_disaggregated([r], Scheduler(PagePool(16, 16), 4, 128),
                           Scheduler(PagePool(16, 16), 4, 128), lambda b: 1.0, lambda b: 1.0,
                           lambda r: 0.5)  # fmt: skip
    assert r.token_times == [1.0, 2.5, 3.5] and r.finish_s == 3.5
    chip = get_chip("h100-sxm")
    cfg = get_model_config("llama-3-8b", attention_kernel="flash")
    step, pool = ClosedFormStepTime(cfg, chip), kv_pool(cfg, chip, 16, 2048, 8448)
    move = kv_transfer_s(pool.bytes_per_token, chip.interconnect_bytes_per_s)
    assert move(Request(1, 0.0, 8192, 2)) == pytest.approx(8192 * 131072 / 450e9)

    def sched():
        return Scheduler(PagePool(pool.pages, 16), 256, 2048)

    apart = report(simulate_disaggregated(generate(100, 4.0, "8192", "64", 0), sched(), sched(),
                                          step, step, move), 2.0, 0.05)  # fmt: skip
    together = report(simulate(generate(100, 4.0, "8192", "64", 0), sched(), step), 2.0, 0.05)
    assert apart["requests_in"] == apart["requests_out"] == 100
    assert apart["itl_s"]["p99"] < 0.5 * together["itl_s"]["p99"]
    assert apart["slo"]["met"] >= together["slo"]["met"]


def test_disaggregation_over_several_instances_by_hand():
    """Two requests of 64 + 3 tokens at t = 0, a budget of 64 tokens a step (one prompt), 1 s
    steps, 0.5 s transfers. One prefill instance samples their first tokens at 1 and 2; two
    (2P1D) at 1 and 1, and the decode instance then steps both together (tokens at 2.5, 3.5).
    1P2D: each request on its own decode instance. Every step is counted once."""
    from kvjax.serving.disagg import simulate_disaggregated

    def run(x: int, y: int):
        reqs = [Request(i, 0.0, 64, 3) for i in range(2)]
        scheds = [Scheduler(PagePool(16, 16), 4, 64) for _ in range(x + y)]
        result = simulate_disaggregated(
            reqs, scheds[:x], scheds[x:], lambda b: 1.0, lambda b: 1.0, lambda r: 0.5
        )
        return [r.token_times for r in reqs], result.steps

    assert run(1, 1) == ([[1.0, 2.5, 3.5], [2.0, 3.5, 4.5]], 2 + 3)
    assert run(2, 1) == ([[1.0, 2.5, 3.5], [1.0, 2.5, 3.5]], 2 + 2)
    assert run(1, 2) == ([[1.0, 2.5, 3.5], [2.0, 3.5, 4.5]], 2 + 4)
    with pytest.raises(KvjaxError, match="one prefill and one decode"):
        simulate_disaggregated([], [], [Scheduler(PagePool(16, 16), 4, 64)], None, None, None)


def test_a_speed_trace_stretches_the_steps_that_start_inside_it():
    """One request, 1 s steps; the machine twice as slow from t = 1.5 on: the steps starting at
    0 and 1 take 1 s, those from 2 on 2 s (tokens at 1, 2, 4, 6). A trace built from measured
    steps gives each window its measured / fitted time."""
    from types import SimpleNamespace

    from kvjax.serving.fitted import FittedStepTime, SpeedTrace, buckets_for, feature_names

    r = Request(0, 0.0, 4, 4)
    trace = SpeedTrace((0.0, 1.5), (1.0, 2.0))
    simulate([r], Scheduler(PagePool(4, 16), 4, 64), one_second, trace)
    assert r.token_times == [1.0, 2.0, 4.0, 6.0]
    assert trace(-1.0) == 1.0 and trace(1.5) == 2.0
    buckets = buckets_for(4)
    model = FittedStepTime(dict.fromkeys(feature_names(buckets), 0.5), buckets)
    # a decode step is step + decode + decodes = 1.5 s fitted; measured 1.5 s three times,
    # then 3 s four times: windows of 3 (the last, of 1, joins the one before)
    starts = [0.0, 1.5, 3.0, 4.5, 7.5, 10.5, 13.5]
    steps = [SimpleNamespace(batch=((1, 9),), wall_s=1.5 if t < 4 else 3.0, start_s=t)
             for t in starts]  # fmt: skip
    assert model.speed_trace(steps, per_window=3) == SpeedTrace((0.0, 4.5), (1.0, 2.0))
    # within its windows every step is as fitted: no spread left (the run's own would be 0.6x-1.2x)
    assert model.window_spread([steps], per_window=3) == pytest.approx([1.0] * 7)
    with pytest.raises(KvjaxError, match="sorted"):
        SpeedTrace((1.0, 0.0), (1.0, 1.0))


def test_predicted_step_time_is_the_published_steps_fit():
    """`--step-time predicted`: a batch of B decodes at S is `frontier --predict`'s step (the
    corpus's `step` fit on `engine_step_cost`, fused attention), computed through
    `kvjax.predict.apply`; a prompt chunk's share adds its own FLOPs and bytes."""
    from types import SimpleNamespace

    from kvjax.analytic import Workload, flash, step_kernels
    from kvjax.predict.apply import engine_step_cost, predict_step_s
    from kvjax.serving.step_time import ClosedFormStepTime, PredictedStepTime

    chip = get_chip("h100-sxm")
    # windowed (mistral), sinks and windows (gpt-oss), a hybrid: fused decode all the same
    for name in ("mistral-7b", "gpt-oss-20b", "tiny-falcon-h1"):
        model = get_model_config(name)
        other = PredictedStepTime(model, chip)
        cost = engine_step_cost(model, Workload("decode", 32, 8192), chip)
        want = predict_step_s(cost.flops, cost.bytes, chip, model.compute_dtype, model.num_layers)[
            "predicted_s"
        ]
        got = other([SimpleNamespace(tokens=1, context=8192)] * 32)
        assert other.fused and got == pytest.approx(want, rel=1e-3), name
    # the decodes are planned together, as one batched kernel plans them: 128 heads of
    # deepseek-v3's latents, 32 decodes at 8k, take 4 flash-decoding splits each (132 SMs over
    # 32 programs), not the 128 a decode planned alone takes (its partials, 128 heads x 128
    # splits x (512 + 2) x 4 B = 34 MB a layer, spill out of half the 50 MB L2, and its step
    # came out 14% above the batched one, noted at stop 45)
    big = get_model_config("deepseek-v3")
    cost = engine_step_cost(big, Workload("decode", 32, 8192), chip)
    want = predict_step_s(cost.flops, cost.bytes, chip, big.compute_dtype, big.num_layers)[
        "predicted_s"
    ]
    step = PredictedStepTime(big, chip)
    assert step([SimpleNamespace(tokens=1, context=8192)] * 32) == pytest.approx(want, rel=1e-9)
    splits = [flash.plan_for_chip(step.cfg, Workload("decode", b, 8192), chip).splits
              for b in (1, 32)]  # fmt: skip
    assert splits == [128, 4]
    # a mixed batch: each decode's share is planned with the step's decodes, 1/D of D at its S
    mixed = [SimpleNamespace(tokens=1, context=s) for s in (1024, 8192)]
    two = [step_kernels(step.cfg, Workload("decode", 2, s), chip) for s in (1024, 8192)]
    assert step.step_cost(mixed)[2] == pytest.approx(
        step._shared(2, 2)[2]
        + sum(k.bytes for ks in two for n, k in ks.items() if n not in step.shared) / 2,
        rel=1e-12,
    )
    cfg = get_model_config("llama-3-8b")
    step = PredictedStepTime(cfg, chip)
    assert step.cfg.attention_kernel == "flash"
    for b, s in ((1, 1024), (32, 4096)):
        cost = engine_step_cost(cfg, Workload("decode", b, s), chip)
        want = predict_step_s(cost.flops, cost.bytes, chip, cfg.compute_dtype, cfg.num_layers)[
            "predicted_s"
        ]
        assert step([SimpleNamespace(tokens=1, context=s)] * b) == pytest.approx(want, rel=1e-9)
    bound = ClosedFormStepTime(cfg.replace(attention_kernel="flash"), chip)
    decode, mixed = (
        [SimpleNamespace(tokens=1, context=4096)],
        [SimpleNamespace(tokens=1, context=4096), SimpleNamespace(tokens=512, context=1024)],
    )
    assert bound.step_cost(mixed)[1] > bound.step_cost(decode)[1]
    assert step(mixed) > step(decode)  # the chunk's FLOPs and bytes, in the same fit
    # the README's: a 2,048-token chunk beside 16 decodes at 8k, just under the 50 ms ITL SLO. Its
    # FLOPs are the chunk's alone plus the 16 decodes' alone (every kernel's FLOPs are linear in
    # the tokens and rows, but RoPE's table, made once a step: 6,144 FLOPs of 3.2e13; each
    # request's attention is its own), and its time the fit's formula
    # L t0 + max(F / (e_c P), Q / (e_b BW)) on them (t0 paid once by each of its L layers), by
    # hand
    chunk = [SimpleNamespace(tokens=2048, context=4096)]
    decodes = [SimpleNamespace(tokens=1, context=8192)] * 16
    big = chunk + decodes
    _, flops, nbytes = step.step_cost(big)
    assert flops == pytest.approx(step.step_cost(chunk)[1] + step.step_cost(decodes)[1], rel=1e-9)
    f = step.fit
    peak, bw = chip.peak(cfg.compute_dtype), chip.bandwidth_bytes_per_s
    by_hand = cfg.num_layers * f.t0_s + max(flops / (f.compute_efficiency * peak),
                                            nbytes / (f.bandwidth_efficiency * bw))  # fmt: skip
    assert step(big) == pytest.approx(by_hand, rel=1e-12)
    # predicted under the SLO, and over the per-kernel sum that `--step-time bound` simulates
    assert 0.05 > step(big) > bound(big)
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    assert f"over the {1e3 * bound(big):.0f} ms that `--step-time bound` sums" in readme


@pytest.mark.parametrize(
    "case", ["full batch", "pages run out", "arrivals admitted", "predicted", "kernels"]
)
def test_the_fast_path_is_the_step_by_step_loop_to_the_bit(case, monkeypatch):
    """Steps of decodes alone advanced at once (`decode_run`, `decode_steps`) give every token
    the time the step-by-step loop gives it, the same pages in use after each step, the same
    request-seconds and preemptions: a full batch with a queue, a pool that runs out (so the
    loop preempts), arrivals that join a batch with room, the predicted step model under a
    moving speed."""
    import kvjax.serving.simulate as sim
    from kvjax.serving.step_time import ClosedFormStepTime, KernelStepTime, PredictedStepTime

    cfg = get_model_config("llama-3-8b", attention_kernel="flash")
    chip = get_chip("h100-sxm")
    rate, n, max_batch, pages = {"full batch": (1e4, 40, 8, 4096),
                                 "pages run out": (1e4, 40, 32, 160),
                                 "arrivals admitted": (20.0, 40, 64, 4096),
                                 "predicted": (50.0, 30, 16, 4096),
                                 "kernels": (50.0, 30, 16, 4096)}[case]  # fmt: skip
    kind = {"predicted": PredictedStepTime, "kernels": KernelStepTime}
    model = kind.get(case, ClosedFormStepTime)(cfg, chip)
    speed = (lambda t: 1.0 + 0.5 * (int(t * 100) % 2)) if case in kind else None

    taken, real = [], sim.decode_run

    def counted(sched):
        out = real(sched)
        taken.append(out is not None)
        return out

    def run(fast):
        monkeypatch.setattr(sim, "decode_run", counted if fast else (lambda sched: None))
        reqs = generate(n, rate=rate, prompt="uniform:40:200", output="uniform:20:90", seed=4)
        res = simulate(reqs, Scheduler(PagePool(pages, 16), max_batch, 256), model, speed)
        monkeypatch.undo()
        return res, reqs

    (a, ra), (b, rb) = run(True), run(False)
    assert [r.token_times for r in ra] == [r.token_times for r in rb]
    assert a.pages_in_use == b.pages_in_use and a.steps == b.steps
    assert (a.requests_in_system_s, a.busy_s, a.preemptions) == (
        b.requests_in_system_s, b.busy_s, b.preemptions)  # fmt: skip
    assert sum(taken) >= 3  # the fast path was taken (and the loop ran the other steps)
    if case == "pages run out":
        assert a.preemptions > 0


def test_simulate_places_a_model_one_chip_cannot_hold(capsys):
    """`kvjax simulate --rate 1` alone: the seed's 70B (141 GB of bf16 weights) on H100s takes
    the fewest of 2, 4, 8 chips whose pool holds --max-batch requests, and says so; each step
    is a device's shard plus its collectives, by hand for a decode of 3 at tp 4: 161 all-reduces
    of 3 x 8192 x 2 bytes, 2 (4 - 1) / 4 of it sent, and 3 rows of 128,256 f32 logits, 3/4 of
    them, over 450 GB/s."""
    from kvjax.analytic.parallel import device_config
    from kvjax.cli.main import main
    from kvjax.serving.scheduler import Scheduled
    from kvjax.serving.step_time import ClosedFormStepTime, PlacedStepTime

    assert main(["simulate", "--rate", "1", "--requests", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tp"] == 4 and "tp=4, the fewest of 2, 4, 8" in out["tp_note"]
    assert out["requests_out"] == 4 and out["chips"] == 4
    cfg, chip = get_model_config("seed-70b"), get_chip("h100-sxm")
    shard = ClosedFormStepTime(device_config(cfg, 4), chip)
    placed = PlacedStepTime(shard, cfg, chip, 4)
    batch = [Scheduled(Request(i, 0.0, 100, 5), 1, 101) for i in range(3)]
    link = (161 * 1.5 * 3 * 8192 * 2 + 0.75 * 3 * 128256 * 4) / 450e9
    assert placed(batch) == pytest.approx(shard(batch) + link, rel=1e-12)
    assert placed.decode_steps([100, 100, 100], 2)[0] == pytest.approx(placed(batch), rel=1e-12)


def test_replicas_behind_a_round_robin_router(tmp_path, capsys):
    """Arrivals every 10 ms on 3 replicas: each copy sees one every 30 ms, so the run is one
    replica's at 30 ms spacing, three times over (the same TTFT and ITL percentiles, within 1%:
    a copy shifted by 10 ms rounds its step times apart, and a few steps batch otherwise; three
    times the output), on 3 x the chips."""
    from kvjax.cli.main import main

    def trace(gap, n):
        path = tmp_path / f"t{gap}.csv"
        rows = [f"{i * gap:.6f},300,40" for i in range(n)]
        path.write_text("arrival_s,prompt_len,output_len\n" + "\n".join(rows) + "\n")
        return str(path)

    base = ["simulate", "--model", "llama-3-8b", "--chip", "h100-sxm", "--rate", "1", "--json"]
    assert main([*base, "--trace", trace(0.01, 60), "--replicas", "3"]) == 0
    three = json.loads(capsys.readouterr().out)
    assert main([*base, "--trace", trace(0.03, 20)]) == 0
    one = json.loads(capsys.readouterr().out)
    assert three["requests_out"] == 60 and three["chips"] == 3 and three["replicas"] == 3
    for key in ("ttft_s", "itl_s"):
        for q in ("p50", "p90", "p99"):
            assert three[key][q] == pytest.approx(one[key][q], rel=1e-2)
    span = lambda r: r["output_tokens"] / r["throughput_tokens_per_s"]  # noqa: E731
    assert three["output_tokens"] == 3 * one["output_tokens"]
    assert span(three) == pytest.approx(span(one) + 0.02, rel=1e-2)  # the last copy starts 20 ms in
    # least-loaded on alike requests 10 ms apart: the copies stay about balanced (ties among
    # them broken otherwise as requests finish), so its latencies are round-robin's within 5%
    # (kvjax.serving.router; tests/test_serving_router.py checks the routing by hand)
    assert main([*base, "--trace", trace(0.01, 60), "--replicas", "3", "--route",
                 "least-loaded"]) == 0  # fmt: skip
    least = json.loads(capsys.readouterr().out)
    assert least["route"] == "least-loaded" and three["route"] == "round-robin"
    assert least["requests_out"] == 60
    for key in ("ttft_s", "itl_s"):
        assert least[key] == pytest.approx(three[key], rel=0.05)


def test_lengths_drawn_from_a_datasets_samples(tmp_path):
    """`sample:FILE`: each length one of the file's (with replacement, seeded); a file with no
    lengths, a 0 or a non-number is refused by name."""
    from kvjax.serving.load import lengths

    path = tmp_path / "prompts.csv"
    path.write_text("input_len\n5\n7\n9\n")
    got = lengths(f"sample:{path}", 200, np.random.default_rng(0), "prompt_len")
    assert set(got) == {5, 7, 9}
    assert got == lengths(f"sample:{path}", 200, np.random.default_rng(0), "prompt_len")
    for text in ("input_len\n", "input_len\n0\n", "input_len\nmany\n"):
        bad = tmp_path / f"bad{len(text)}.csv"
        bad.write_text(text)
        with pytest.raises(KvjaxError, match=rf"prompt_len=sample:{bad}"):
            lengths(f"sample:{bad}", 3, np.random.default_rng(0), "prompt_len")


def test_a_pool_of_millions_of_pages_lists_none_until_used():
    """The never-used pages are handed out first, in order, and are not listed (a tiny model's
    pool on an 80 GB chip is ~10M pages a copy); freed pages follow, least recently freed first."""
    from kvjax.serving.pages import PagePool

    pool = PagePool(10_000_000, 16)
    assert len(pool.free) == 0 and pool.free_pages == 10_000_000
    a = pool.allocate(3)
    assert a == [0, 1, 2] and pool.used_pages == 3
    pool.release(a)  # in reverse: 2, 1, 0 join the freed list
    assert pool.allocate(2) == [3, 4] and list(pool.free) == [2, 1, 0]
    small = PagePool(4, 16)
    small.release(small.allocate(2))
    assert small.allocate(4) == [2, 3, 1, 0] and small.allocate(1) is None
