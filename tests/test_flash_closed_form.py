"""The fused attention's closed form (kvjax.analytic.flash) against hand counts and brute force."""

import dataclasses
import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvjax import hardware, kernels
from kvjax.analytic import compulsory, flash, keys, pairs, step
from kvjax.analytic.costs import Workload
from kvjax.errors import KvjaxError
from kvjax.model.config import get_model_config


def _brute(T, S, bq, bk, window=0, sinks=0):
    """Pairs allowed, pairs in tiles with any allowed pair, keys loaded per query block."""

    def allowed(i, j):
        return j <= S - T + i and (not window or S - T + i - j < window or j < sinks)

    exact = sum(allowed(i, j) for i in range(T) for j in range(S))
    computed = loaded = 0
    for q0 in range(0, T, bq):
        rows = range(q0, min(q0 + bq, T))
        for k0 in range(0, S, bk):
            cols = range(k0, min(k0 + bk, S))
            if any(allowed(i, j) for i, j in itertools.product(rows, cols)):
                computed += len(rows) * len(cols)
                loaded += len(cols)
    return exact, computed, loaded


@pytest.mark.parametrize(
    "T,S,bq,bk,window,sinks",
    [(4, 4, 2, 2, 0, 0), (7, 7, 2, 3, 0, 0), (9, 9, 4, 2, 3, 0), (1, 11, 4, 4, 0, 0),
     (3, 10, 2, 4, 5, 0), (16, 16, 16, 16, 0, 0), (13, 13, 4, 4, 20, 0), (17, 17, 4, 4, 5, 2),
     (12, 12, 2, 3, 3, 5), (1, 30, 4, 4, 6, 4)],
)  # fmt: skip
def test_pair_counts_equal_brute_force(T, S, bq, bk, window, sinks):
    exact, computed, loaded = _brute(T, S, bq, bk, window, sinks)
    assert pairs.exact_pairs(T, S, window, sinks) == exact
    assert pairs.block_pairs(T, S, bq, bk, window, sinks) == (computed, loaded)


def test_hand_counts():
    assert pairs.exact_pairs(4, 4) == 10  # T(T+1)/2
    assert pairs.exact_pairs(4, 4, window=2) == 1 + 2 + 2 + 2
    assert pairs.block_pairs(4, 4, 2, 2) == (4 + 8, 2 + 4)


def test_llama_prefill_8k_on_h100_is_the_exact_causal_count():
    cfg = get_model_config("llama-3-8b", attention_kernel="flash")
    wl, chip = Workload("prefill", 1, 8192), hardware.get_chip("h100-sxm")
    fused = step.step_kernels(cfg, wl, chip)
    unfused = step.step_kernels(cfg.replace(attention_kernel="xla"), wl)
    L, N, K, H, T = 32, 32, 8, 128, 8192
    exact = 4 * N * H * T * (T + 1) // 2 * L  # 17.59 TFLOP
    assert exact == pytest.approx(17.594e12, rel=1e-4)
    att = fused[kernels.ATTENTION]
    assert 1.0 <= att.flops / exact <= 1.03
    qkvo = L * (2 * T * N * H * 2 + 2 * T * K * H * 2)  # Q and O, K and V in bf16: 5.37 GB
    assert qkvo == pytest.approx(5.37e9, rel=1e-3)
    assert att.bytes >= qkvo
    parts = sum(unfused[n].bytes for n in kernels.ATTENTION_PARTS)
    assert att.bytes < 0.2 * parts
    # The H100's 50 MiB L2 holds the K/V of the two KV heads resident at once (4 MiB each):
    # HBM sees Q, K, V and O once, and the intensity is the seed's ~S: N*T / (2 (N + K))
    assert att.bytes == qkvo
    assert att.intensity == pytest.approx(N * T / (2 * (N + K)) * att.flops / exact, rel=1e-3)
    # without an L2 (Dao 2022's count) K and V are re-read once per 128-row query block and
    # query head: the intensity is the query tile, ~B_r = 128
    no_l2 = dataclasses.replace(chip, l2_bytes=None)
    assert step.step_kernels(cfg, wl, no_l2)[kernels.ATTENTION].intensity == pytest.approx(
        128, rel=0.05
    )
    assert kernels.SCORES not in fused and kernels.SOFTMAX not in fused
    # the rest of the step is unchanged
    for name in (kernels.Q_PROJ, kernels.O_PROJ, kernels.KV_WRITE, kernels.LM_HEAD):
        assert fused[name] == unfused[name]


def test_tiles_follow_the_chip():
    cfg = get_model_config("llama-3-8b", attention_kernel="flash")
    wl = Workload("prefill", 1, 8192)
    h100, v5e = hardware.get_chip("h100-sxm"), hardware.get_chip("tpu-v5e")
    # Dao 2022: B_c = M / 4H elements (228 KiB / 2 B / 512 = 228 -> 128), B_r = min(B_c, H)
    assert flash.plan(cfg, wl, h100.onchip_bytes_per_core) == flash.FlashPlan(128, 128)
    tiles = flash.plan(cfg, wl, v5e.onchip_bytes_per_core)  # 128 MiB of VMEM: K/V stay on chip
    assert tiles.kv_on_chip and tiles.block_q == 128
    att = flash.flash_attention_cost(cfg, wl, tiles).attention
    assert att.bytes == 2 * 8192 * 32 * 128 * 2 + 2 * 8192 * 8 * 128 * 2  # Q, O, K, V once
    with pytest.raises(KvjaxError, match="block_q=-1 must be an integer >= 0"):
        flash.plan(cfg, wl, block_q=-1)


@pytest.mark.parametrize("k", [1, 8, 32])
def test_decode_intensity_is_h_over_hkv(k):
    cfg = get_model_config("llama-3-8b", attention_kernel="flash", num_kv_heads=k)
    chip = hardware.get_chip("h100-sxm")
    wl = Workload("decode", 1, 1 << 20)
    att = step.layer_kernels(cfg, wl, chip=chip)[kernels.ATTENTION]
    assert att.intensity == pytest.approx(32 / k, rel=0.01)  # 2N / (K * 2 bytes)
    assert att.kv_bytes == 2 * (1 << 20) * k * 128 * 2  # the cache read once for all G heads


def test_a_fused_decode_reads_a_1_byte_caches_scales_with_it():
    """int8 with token_head scales: each cached K and V row of H = 128 one-byte elements and its
    f32 scale, per KV head, per position (what the unfused decode's scores read, and the
    cache's own size per token); fp8's per-tensor scales add nothing per position."""
    for kv, per_row in (("int8", 128 + 4), ("fp8", 128)):
        cfg = get_model_config("llama-3-8b", attention_kernel="flash", kv_dtype=kv)
        att = step.layer_kernels(cfg, Workload("decode", 2, 4096))[kernels.ATTENTION]
        assert att.kv_bytes == 2 * 4096 * 8 * 2 * per_row
        unfused = step.layer_kernels(cfg.replace(attention_kernel="xla"),
                                     Workload("decode", 2, 4097))[kernels.SCORES]  # fmt: skip
        assert unfused.kv_bytes == 2 * 4096 * 8 * per_row  # K only: the scores' half


def test_flash_decoding_splits_and_combine():
    cfg = get_model_config("llama-3-8b", attention_kernel="flash")
    wl = Workload("decode", 1, 8192)
    chip = hardware.get_chip("h100-sxm")
    tiles = flash.plan_for_chip(cfg, wl, chip)
    assert tiles.splits == 16  # ceil(132 SMs / (B=1 * K=8)) = 17 chunks, to a power of two
    cost = flash.flash_attention_cost(cfg, wl, tiles)
    partials = 32 * 16 * (128 + 2) * 4  # each split's f32 output, max and sum per query head
    # the partials (266 KB) pass to the combine through the H100's L2: not HBM traffic
    assert cost.combine.bytes == 32 * 128 * 2
    assert cost.attention.bytes == 32 * 128 * 2 + 2 * 8192 * 8 * 128 * 2
    spill = flash.flash_attention_cost(cfg, wl, dataclasses.replace(tiles, l2_bytes=None))
    assert spill.combine.bytes == partials + 32 * 128 * 2
    assert spill.attention.bytes == 32 * 128 * 2 + 2 * 8192 * 8 * 128 * 2 + partials
    one = flash.flash_attention_cost(cfg, wl, flash.plan(cfg, wl))  # no chip: one split
    assert one.combine is None and one.plan.splits == 1


def test_mla_absorbed_decode_reads_the_latent_once():
    cfg = get_model_config("deepseek-v3", attention_kernel="flash")
    wl = Workload("decode", 2, 4096)
    att = step.layer_kernels(cfg, wl)[kernels.ATTENTION]
    A, P, N = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.num_heads
    assert att.kv_bytes == 2 * 4096 * (A + P) * cfg.kv_bytes_per_element
    assert att.flops == N * 2 * 4096 * (2 * (A + P) + 2 * A)


def test_sliding_layer_computes_the_band():
    cfg = get_model_config("mistral-7b", attention_kernel="flash")
    wl = Workload("prefill", 1, 16384)
    W = cfg.sliding_window
    cost = flash.flash_attention_cost(cfg, wl, flash.FlashPlan(128, 128), sliding=True)
    assert cost.exact_pairs == pairs.exact_pairs(16384, 16384, W) < 16384 * W
    assert 1.0 <= cost.computed_pairs / cost.exact_pairs < 1.05


def test_bad_attention_kernel_is_named():
    with pytest.raises(KvjaxError, match="attention_kernel='cudnn' is not supported; allowed: xla"):
        get_model_config("llama-3-8b", attention_kernel="cudnn")


def test_calc_reports_both_forms(capsys):
    from kvjax.cli.main import main

    argv = ["calc", "--model", "llama-3-8b", "--phase", "prefill", "--context", "8192",
            "--attention-kernel", "flash", "--json"]  # fmt: skip
    assert main(argv) == 0
    att = json.loads(capsys.readouterr().out)["attention_kernel"]
    assert att["kernel"] == "flash"
    assert att["exact_causal_flops"] == 4 * 32 * 128 * 8192 * 8193 // 2 * 32
    assert 1.0 <= att["flash"]["flops"] / att["exact_causal_flops"] <= 1.03
    assert att["flash"]["bytes"] < 0.2 * att["xla"]["bytes"]
    assert main(argv[:-1]) == 0
    assert "x the exact causal pairs" in capsys.readouterr().out


def test_variants_carry_both_attention_forms(capsys):
    """`calc --variants`: each variant's decode attention unfused and fused, the fused one as the
    step of that variant counts it; the fused GQA-8 kernel at 8k stays near h/h_kv = 4."""
    from kvjax.cli.main import main

    argv = ["calc", "--model", "llama-3-8b", "--context", "8192", "--variants", "--json"]
    assert main(argv) == 0
    rows = {r["variant"]: r for r in json.loads(capsys.readouterr().out)["variants"]}
    assert set(rows) == {"MHA", "GQA", "MQA", "MLA A=512 P=64"}
    gqa = rows["GQA"]["attention_kernel"]
    assert gqa["flash"]["intensity"] == pytest.approx(4.0, rel=0.02)
    cfg = get_model_config("llama-3-8b", num_kv_heads=1, attention_kernel="flash")
    fused = step.step_kernels(cfg, Workload("decode", 1, 8192), hardware.get_chip("h100-sxm"))
    mqa = rows["MQA"]["attention_kernel"]["flash"]
    want = [fused[n] for n in (kernels.ATTENTION, kernels.ATTN_COMBINE)]
    assert mqa["flops"] == sum(k.flops for k in want) and mqa["bytes"] == sum(k.bytes for k in want)


def test_roofline_experiment_places_attention_both_ways(tmp_path):
    """experiments/roofline.py: per phase one unfused point (scores + softmax + av summed) and
    one fused point; the prefill fused point is the flash kernel tiled for the chip preset, and
    the figure draws both without error."""
    import pandas as pd

    from kvjax.plotting import make_figures
    from kvjax.runs.launcher import run_config

    config = tmp_path / "c.yaml"
    config.write_text(
        "experiment: roofline\nmodel:\n  preset: llama-3-8b\n  num_layers: 1\n"
        "workload:\n  batch: 1\n  context: 8192\nchip:\n  preset: h100-sxm\n"
        "options:\n  traced: false\n"
    )
    (run,) = run_config(config, runs_root=tmp_path / "runs", progress=False)
    records = pd.DataFrame(run.records()).assign(experiment="roofline")
    both = records[records.source.str.startswith("closed form,")].set_index(["phase", "source"])
    cfg = get_model_config("llama-3-8b", num_layers=1)
    wl = Workload("prefill", 1, 8192)
    layer = step.layer_kernels(cfg, wl)
    unfused = both.loc[("prefill", "closed form, unfused")]
    assert unfused.flops == sum(layer[n].flops for n in kernels.ATTENTION_PARTS)
    fused = both.loc[("prefill", "closed form, fused")]
    h100 = hardware.get_chip("h100-sxm")
    want = flash.flash_attention_cost(cfg, wl, flash.plan_for_chip(cfg, wl, h100))
    assert (fused.flops, fused.bytes) == (want.attention.flops, want.attention.bytes)
    assert fused.flops < 0.52 * unfused.flops and fused.intensity > 2 * unfused.intensity
    assert ("decode", "closed form, fused") in both.index
    assert "roofline.png" in {p.name for p in make_figures(records, tmp_path / "figs")}


def test_decode_latency_sweeps_the_attention_kernel(tmp_path):
    """configs/decode_latency.yaml's sweep over attention_kernel: the fused step is the closed
    form's with the chip's tiles, no slower than the unfused one, and the figure names both."""
    import pandas as pd
    from matplotlib.figure import Figure

    from kvjax.plotting.decode import decode_latency
    from kvjax.runs.launcher import run_config

    config = tmp_path / "c.yaml"
    config.write_text(
        "experiment: decode_latency\nmodel:\n  preset: seed-70b\n  num_kv_heads: 1\n"
        "workload:\n  context: 8192\nchip:\n  preset: h100-sxm\noptions:\n  batches: [1, 256]\n"
        "sweep:\n  model.attention_kernel: [xla, flash]\n"
    )
    runs = run_config(config, runs_root=tmp_path / "runs", progress=False)
    records = pd.DataFrame([r for run in runs for r in run.records()])
    floor = records.set_index(["attention_kernel", "batch"]).step_floor_s
    h100 = hardware.get_chip("h100-sxm")
    cfg = get_model_config("seed-70b", num_kv_heads=1, attention_kernel="flash")
    want = step.step_cost(cfg, Workload("decode", 256, 8192), h100)
    assert floor["flash", 256] == pytest.approx(
        max(want.flops / h100.peak("bf16"), want.bytes / h100.bandwidth_bytes_per_s)
    )
    assert floor["flash", 256] < 0.8 * floor["xla", 256]  # the scores no longer through HBM
    assert floor["flash", 1] == pytest.approx(floor["xla", 1], rel=0.01)  # weights dominate
    fig = Figure()
    decode_latency(records.assign(experiment="decode_latency"), fig)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert sorted(labels) == ["h_kv=1, fused attn", "h_kv=1, unfused attn"]


def _loop(T, S, bq, bk, window=0, sinks=0, chunk=0):
    """The block loop kvjax walked before the closed form: (pairs computed, keys loaded)."""
    pairs = loaded = 0
    offset = S - T
    sink_blocks = set(range((sinks - 1) // bk + 1)) if sinks and window else set()
    for q0 in range(0, T, bq):
        rows = min(bq, T - q0)
        hi = offset + q0 + rows - 1
        if chunk:
            lo = (offset + q0) // chunk * chunk
        else:
            lo = max(0, offset + q0 - window + 1) if window else 0
        blocks = set(range(lo // bk, hi // bk + 1)) | {b for b in sink_blocks if b * bk <= hi}
        keys = sum(min(bk, S - b * bk) for b in blocks)
        pairs += rows * keys
        loaded += keys
    return pairs, loaded


@settings(max_examples=300, deadline=None)
@given(
    S=st.integers(1, 3000), t=st.floats(0, 1), bq=st.sampled_from([1, 3, 16, 64, 128]),
    bk=st.sampled_from([1, 5, 32, 128]), window=st.sampled_from([0, 1, 7, 100, 1000, 5000]),
    sinks=st.sampled_from([0, 1, 4, 130]),
)  # fmt: skip
def test_closed_form_block_pairs_equal_the_loop(S, t, bq, bk, window, sinks):
    """The O(log S) counts equal the block loop wherever the loop can run (T, S, window, sinks)."""
    T = max(1, int(t * S))
    sinks = sinks if window else 0
    assert pairs.block_pairs(T, S, bq, bk, window, sinks) == _loop(T, S, bq, bk, window, sinks)
    if T <= 200 and S <= 400:
        exact = _brute(T, S, bq, bk, window, sinks)[0]
        assert pairs.exact_pairs(T, S, window, sinks) == exact


@pytest.mark.parametrize("S,C,bq,bk", [(1000, 64, 16, 32), (8192 * 3 + 77, 8192, 128, 128),
                                       (500, 30, 5, 3), (96, 96, 32, 32)])  # fmt: skip
def test_chunked_block_pairs_equal_the_loop(S, C, bq, bk):
    """Llama 4's chunked layers: each query block reaches back to its chunk's start."""
    for T in (S, S - (S // 3) // bq * bq):
        assert pairs.block_pairs(T, S, bq, bk, chunk=C) == _loop(T, S, bq, bk, chunk=C)
        want = sum(p % C + 1 for p in range(S - T, S))
        assert pairs.exact_pairs(T, S, chunk=C) == want
    with pytest.raises(KvjaxError, match="chunk=100 .* multiples of the tiles block_q=64"):
        pairs.block_pairs(1000, 1000, 64, 64, chunk=100)


def test_ten_million_tokens_in_closed_form():
    """T = S = 10M with 128 x 128 tiles: query block j computes (j + 1) key blocks, so the
    pairs are 128^2 n (n + 1) / 2 over n = 78,125 blocks; exact, T(T+1)/2."""
    n, T = 78125, 10_000_000
    assert pairs.block_pairs(T, T, 128, 128) == (
        128 * 128 * n * (n + 1) // 2,
        128 * n * (n + 1) // 2,
    )
    assert pairs.exact_pairs(T, T) == T * (T + 1) // 2
    cfg = get_model_config("llama-4-scout", attention_kernel="flash")
    cost = step.step_cost(cfg, Workload("prefill", 1, T), hardware.get_chip("h100-sxm"))
    assert cost.flops > 0  # chunked layers are modelled now, at any S


def test_waves_reread_what_the_l2_cannot_hold():
    """K/V of a head too big for the L2: each wave of cores // G query blocks (33 x 128 = 4224
    rows of llama-3-8b on 132 SMs) reads the band of its rows once. T = S = 3 x 4224: the waves
    load 4224, 8448 and 12672 keys: 6 x 4224 per KV head."""
    cfg = get_model_config("llama-3-8b", attention_kernel="flash", num_layers=1)
    chip = dataclasses.replace(hardware.get_chip("h100-sxm"), l2_bytes=1e6)
    S = 3 * 4224
    wl = Workload("prefill", 1, S)
    tiles = flash.plan_for_chip(cfg, wl, chip)
    assert flash.hbm_kv_positions(S, S, tiles, 4, 8, 512) == (6 * 4224, "per wave")
    att = flash.flash_attention_cost(cfg, wl, tiles).attention
    assert att.bytes == 2 * S * 32 * 128 * 2 + 8 * 6 * 4224 * 256 * 2  # Q, O once; K, V per wave
    roomy = flash.plan_for_chip(cfg, wl, hardware.get_chip("h100-sxm"))
    assert flash.hbm_kv_positions(S, S, roomy, 4, 8, 512) == (S, "L2 holds the heads' K/V")


def test_flashattention3_shape_is_bounded_by_its_measurement():
    """The issue's falsifier: FA3 forward, causal, H = 128, 16 heads, batch 2 at 8k runs at
    ~600 TFLOP/s by its own count 4 B S^2 N H / 2 (0.916 ms): the bound lies below it."""
    from kvjax.cli.main import main

    argv = ["calc", "--layers", "1", "--d-model", "2048", "--heads", "16", "--kv-heads", "16",
            "--head-dim", "128", "--d-ff", "8192", "--vocab", "32000", "--phase", "prefill",
            "--context", "8192", "--batch", "2", "--attention-kernel", "flash",
            "--json"]  # fmt: skip
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    att = json.loads(out.getvalue())["attention_kernel"]
    measured = 4 * 2 * 8192**2 * 16 * 128 / 2 / 600e12
    assert att["flash"]["bytes"] == att["qkvo_bytes"] == 4 * 2 * 8192 * 16 * 128 * 2
    assert att["flash"]["bound"] == "compute"
    assert att["flash"]["bound_s"] <= measured


def test_chunked_waves_read_each_chunk_once_when_a_wave_spans_chunks():
    """Llama 4's chunks of 8192 with a 1 MB L2: a wave of 132 // 5 = 26 query blocks (3,328
    rows) is counted in tiles of gcd(3328, 8192) = 256 rows, a divisor of the chunk, so no band
    reaches past its chunk's start; a wave taller than a chunk reads each chunk once."""
    cfg = get_model_config("llama-4-scout", attention_kernel="flash", num_layers=1)
    chip = dataclasses.replace(hardware.get_chip("h100-sxm"), l2_bytes=1e6)
    S = 4 * 8192
    tiles = flash.plan_for_chip(cfg, Workload("prefill", 1, S), chip)
    G = cfg.num_heads // cfg.num_kv_heads
    got, rule = flash.hbm_kv_positions(S, S, tiles, G, cfg.num_kv_heads, 512, chunk=8192)
    rows = 132 // G * 128
    assert rule == "per wave"
    assert got == 4 * pairs.block_pairs(8192, 8192, math.gcd(rows, 8192), 128)[1]
    big = dataclasses.replace(tiles, cores=1000)  # a wave of more rows than a chunk
    assert flash.hbm_kv_positions(S, S, big, G, cfg.num_kv_heads, 512, chunk=8192)[0] == S


def _brute_union(T, S, window=0, sinks=0, chunk=0):
    """Key positions some query attends, by enumeration."""

    def allowed(p, j):
        if chunk:
            return p // chunk * chunk <= j <= p
        return j <= p and (not window or p - j < window or j < sinks)

    return sum(any(allowed(S - T + i, j) for i in range(T)) for j in range(S))


def test_the_bound_of_a_causal_a_windowed_and_a_chunked_layer_by_hand():
    """Issue 49's bound, derived by hand: exact pairs at 4 H FLOPs a query head, Q, K, V, O once.
    Causal Llama-3-8B prefill at 8k; Mistral's 4096 window over a 16k prefill (the band from 0);
    a 1024-query chunk of a chunked prefill at 9k in a Llama 4 chunked layer (C = 8192: the
    chunk starts at 8192, so 9216 - 8192 keys)."""
    a, H = 2, 128
    cfg = get_model_config("llama-3-8b", attention_kernel="flash")
    N, K = cfg.num_heads, cfg.num_kv_heads
    c = compulsory.compulsory_cost(cfg, Workload("prefill", 2, 8192))
    assert c.flops == N * 2 * (8192 * 8193 // 2) * 4 * H
    assert c.bytes == 2 * 8192 * (2 * N * H + 2 * K * H) * a  # Q, O; K, V
    cfg = get_model_config("mistral-7b", attention_kernel="flash")
    W, N, K = cfg.sliding_window, cfg.num_heads, cfg.num_kv_heads
    c = compulsory.compulsory_cost(cfg, Workload("prefill", 1, 16384), sliding=True)
    pairs = sum(range(1, W + 1)) + (16384 - W) * W  # p + 1 keys up to W, then W each
    assert c.flops == N * pairs * 4 * H
    assert c.bytes == 16384 * (2 * N * H + 2 * K * H) * a
    cfg = get_model_config("llama-3-8b", attention_kernel="flash", sliding_window=8192,
                           layer_pattern="L", chunked_attention=True)  # fmt: skip
    wl = Workload("extend", 1, 9216, new_tokens=1024)
    c = compulsory.compulsory_cost(cfg, wl, sliding=True)
    pairs = sum(p - 8192 + 1 for p in range(8192, 9216))  # each query its own chunk's keys
    assert c.flops == cfg.num_heads * pairs * 4 * H
    assert c.kv_bytes == (9216 - 8192) * 2 * cfg.num_kv_heads * H * a  # the cache as stored
    assert c.bytes == c.kv_bytes + 1024 * 2 * cfg.num_heads * H * a


@settings(max_examples=300, deadline=None)
@given(
    S=st.integers(1, 40_000), t=st.floats(0, 1), batch=st.integers(1, 8),
    heads=st.sampled_from([(8, 8), (32, 8), (64, 1), (16, 2)]), H=st.sampled_from([64, 128, 256]),
    window=st.sampled_from([0, 1, 100, 4096]), sinks=st.sampled_from([0, 4]),
    chunked=st.booleans(), causal=st.booleans(), mla=st.sampled_from(["", "absorbed", "naive"]),
    kv=st.sampled_from(["bf16", "int8", "fp8"]), chip=st.sampled_from(["h100-sxm", "tpu-v5e",
                                                                       "a100-80gb"]),
)  # fmt: skip
def test_the_bound_never_exceeds_the_implementation_model(
    S, t, batch, heads, H, window, sinks, chunked, causal, mla, kv, chip
):
    """For random shapes (prefill, extend in either kernel form, decode; GQA or MLA; windows,
    sinks, chunks; causal or not; 1-byte caches) and chips: exact FLOPs <= the plan's FLOPs and
    compulsory bytes <= the plan's bytes, so the bound <= any time the model predicts; the key
    union equals enumeration on small shapes."""
    T = max(1, int(t * S))
    if mla:  # an MLA cache in bf16 or fp8 (no scales for the latent)
        kv = "fp8" if kv == "int8" else kv
        cfg = get_model_config("deepseek-v3", num_layers=1, first_dense_layers=0,
                               attention_kernel="flash", mla_decode=mla, kv_dtype=kv,
                               kv_scales="none")  # fmt: skip
        window = 0
    else:
        N, K = heads
        cfg = get_model_config("llama-3-8b", num_heads=N, num_kv_heads=K, head_dim=H,
                               d_model=N * H, attention_kernel="flash", kv_dtype=kv,
                               sliding_window=window,
            layer_pattern="L" if window else "G",
                               chunked_attention=bool(window and chunked),
                               sink_tokens=sinks if window and not chunked else 0)  # fmt: skip
    if window:
        causal = True  # a window (or chunk) is a causal mask
    wl = Workload("prefill", batch, S) if T == S else Workload("extend", batch, S, new_tokens=T)
    if T == 1 and S > 1:
        wl = Workload("decode", batch, S)
    plan = flash.plan_for_chip(cfg, wl, hardware.get_chip(chip))
    sliding = bool(window)
    if (
        sliding
        and cfg.chunked_attention
        and flash.attention_form(cfg, wl) == "prefill"
        and (window % plan.block_q or window % plan.block_k or (S - T) % plan.block_q)
    ):
        return  # no tiling of this chunk: the plan refuses it (tested above)
    model = flash.flash_attention_cost(cfg, wl, plan, sliding=sliding, causal=causal)
    bound = compulsory.compulsory_cost(cfg, wl, sliding=sliding, causal=causal)
    assert bound.flops <= sum(k.flops for k in model.kernels())
    assert bound.bytes <= sum(k.bytes for k in model.kernels()) * (1 + 1e-12)
    if flash.attention_form(cfg, wl) == "prefill":  # every program runs a key block or more:
        from kvjax.predict.plans import pipeline_fill  # the prediction's fill adds up to one

        assert 1 < pipeline_fill(model, batch, T) <= 2
    if T <= 60 and S <= 200:
        w = cfg.sliding_window if sliding else 0
        c = w if w and cfg.chunked_attention else 0
        w, s = (0, 0) if c else (w, cfg.sink_tokens if w else 0)
        want = _brute_union(T, S, w, s, c) if causal else S
        assert keys.key_union(T, S, w, s, c, causal) == want
