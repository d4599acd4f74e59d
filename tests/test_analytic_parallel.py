"""Tensor-parallel closed forms (issue 8's analytic part): per-device weights, KV cache with
replication, collectives, and the floor with a link term."""

import json

import pytest

from kvjax import KvjaxError, analytic, get_chip, get_model_config, kernels
from kvjax.analytic import Workload
from kvjax.analytic.parallel import (
    allreduce_bytes_per_device,
    collective_bytes_per_step,
    device_config,
    kv_cache_bytes_per_device,
    kv_heads_per_device,
    kv_replication,
    weight_bytes_per_device,
)
from kvjax.analytic.placement_point import tensor_parallel_point
from kvjax.cli import main


@pytest.mark.parametrize(
    "k,tp,expected",
    [(8, 1, 8), (8, 2, 4), (8, 4, 2), (8, 8, 1), (8, 16, 1), (8, 64, 1), (64, 8, 8), (1, 8, 1)],
)
def test_kv_heads_per_device_llama2_70b(k, tp, expected):
    cfg = get_model_config("llama-2-70b", num_kv_heads=k)
    assert kv_heads_per_device(cfg, tp) == expected
    assert kv_replication(cfg, tp) == max(1, tp / k)


def test_uneven_groups_replicate_the_shared_head():
    # 12 query heads, 3 KV heads (G=4), tp=2: device 0 reads KV heads {0, 1}, device 1 {1, 2}.
    cfg = get_model_config("tiny-gqa")
    assert kv_heads_per_device(cfg, 2) == 2
    assert kv_replication(cfg, 2) == pytest.approx(4 / 3)


def test_kv_cache_splits_exactly_until_tp_exceeds_kv_heads():
    cfg = get_model_config("llama-2-70b")  # K = 8
    total = analytic.kv_cache_bytes(cfg, 32768, 4)
    for tp in (1, 2, 4, 8):
        assert kv_cache_bytes_per_device(cfg, tp, 32768, 4) * tp == total
    # beyond K the per-device cache stops shrinking: each device keeps one KV head
    assert kv_cache_bytes_per_device(cfg, 16, 32768, 4) == kv_cache_bytes_per_device(
        cfg, 8, 32768, 4
    )


def test_weights_split_with_norms_and_replicated_kv_counted_by_hand():
    cfg = get_model_config("llama-2-70b")
    L, D, H, w = cfg.num_layers, cfg.d_model, cfg.head_dim, 2
    total = analytic.weight_bytes(cfg)
    for tp in (2, 8):  # vocab 32000 divides 2 and 8; no KV replication
        norms = (2 * L + 1) * D * w  # replicated on every device
        assert weight_bytes_per_device(cfg, tp) * tp == total + (tp - 1) * norms
    tp = 16  # each KV head on 2 devices: 2 * L * D * H extra K/V weights per device pair
    dev = device_config(cfg, tp)
    assert dev.num_heads == 4 and dev.num_kv_heads == 1 and dev.d_ff == 28672 // 16
    kv_proj = 2 * L * D * H * w  # one KV head's k and v projections, all layers
    sharded = total - 2 * L * D * 8 * H * w - (2 * L + 1) * D * w
    expected = sharded / tp + kv_proj + (2 * L + 1) * D * w
    assert weight_bytes_per_device(cfg, tp) == pytest.approx(expected, rel=1e-12)


def test_collective_bytes_by_hand():
    cfg = get_model_config("tiny-gqa")  # L=2, D=40, V=97, f32
    wl = Workload("decode", 3, 16)
    tp = 4
    act = 3 * 40 * 4
    logits = 3 * 25 * 4 * 4  # ceil(97/4)=25 rows per device, gathered from 4 devices, f32
    expected = 5 * 2 * 3 / 4 * act + 3 / 4 * logits  # (2L+1) all-reduces + the logits gather
    assert collective_bytes_per_step(cfg, tp, wl) == pytest.approx(expected)
    assert collective_bytes_per_step(cfg, 1, wl) == 0
    assert allreduce_bytes_per_device(100, 2) == 100


def test_floor_overlaps_the_link_term():
    """Issue 49: the bound overlaps the collectives with compute (the larger of the two: an
    engine that overlaps can reach it, none beats it); the serial schedule, collectives after
    compute, is printed beside it, never as the bound."""
    cfg, chip = get_model_config("llama-2-70b"), get_chip("h100-sxm")
    wl = Workload("decode", 1, 32768)
    p1, p8 = (tensor_parallel_point(cfg, t, wl, chip) for t in (1, 8))
    assert p1.link_s == 0 and p1.step_floor_s == p1.compute_memory_floor_s == p1.serial_step_s
    assert p8.link_s == pytest.approx(p8.collective_bytes_per_step / 450e9)
    assert p8.step_floor_s == max(p8.compute_memory_floor_s, p8.link_s)
    assert p8.serial_step_s == pytest.approx(p8.compute_memory_floor_s + p8.link_s)
    assert p8.step_floor_s < p8.serial_step_s
    assert p8.compute_memory_floor_s < p1.compute_memory_floor_s / 7  # bytes split ~8 ways
    assert not p1.fits_in_memory and p8.fits_in_memory  # 138 GB of weights on one 80 GB chip


def test_link_latency_counts_ring_messages_by_hand():
    cfg, chip = get_model_config("llama-2-70b"), get_chip("h100-sxm")  # L = 80
    wl = Workload("decode", 1, 32768)
    bw_only = tensor_parallel_point(cfg, 8, wl, chip)
    with_lat = tensor_parallel_point(cfg, 8, wl, chip, link_latency_s=2e-6)
    hops = 161 * 2 * 7 + 7  # 161 all-reduces of 2(tp-1) ring steps, one all-gather of tp-1
    assert with_lat.collective_hops_per_step == hops == 2261
    assert with_lat.link_s == pytest.approx(bw_only.link_s + hops * 2e-6)
    assert tensor_parallel_point(cfg, 1, wl, chip, 2e-6).link_s == 0
    with pytest.raises(KvjaxError, match="link_latency_s=-1 must be a number >= 0"):
        tensor_parallel_point(cfg, 8, wl, chip, -1)


def test_calc_link_latency_flag(capsys):
    base = ["calc", "--json", "--model", "llama-2-70b", "--tp", "64"]
    assert main([*base, "--link-latency", "1e-6"]) == 0
    p = json.loads(capsys.readouterr().out)["tensor_parallel"][0]
    assert p["link_latency_s"] == 1e-6 and p["collective_hops_per_step"] == 161 * 126 + 63
    assert p["link_s"] > p["compute_memory_floor_s"]  # at tp=64 latency outweighs the HBM floor
    assert main(["calc", "--link-latency", "1e-6"]) == 2
    assert "--link-latency applies to the link term of --tp/--ep" in capsys.readouterr().err
    assert main([*base, "--link-latency", "-1"]) == 2
    assert "--link-latency -1.0 must be >= 0 seconds" in capsys.readouterr().err


def test_bad_tp():
    cfg = get_model_config("llama-2-70b")
    with pytest.raises(KvjaxError, match="tp=3 does not divide num_heads=64; allowed tp: 1, 2, 4"):
        kv_heads_per_device(cfg, 3)
    with pytest.raises(KvjaxError, match="tp=0 must be a positive integer"):
        kv_heads_per_device(cfg, 0)


def test_calc_tp_json(capsys):
    argv = ["calc", "--json", "--model", "llama-2-70b", "--context", "32k", "--tp", "8"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tp"] == 8
    assert out["kv_cache_bytes_per_device"] * 8 == out["kv_cache_bytes"]
    assert out["weight_bytes_per_device"] < out["weight_bytes"] / 7
    assert out["collective_bytes_per_token"] > 0


def test_calc_tp_kernels_per_device(capsys):
    argv = ["calc", "--json", "--model", "llama-2-70b", "--context", "4k", "--tp", "1,8,16"]
    assert main(argv) == 0
    points = json.loads(capsys.readouterr().out)["tensor_parallel"]
    k = [{r["name"]: r for r in p["kernels_per_device"]} for p in points]
    for name in (kernels.Q_PROJ, kernels.O_PROJ, kernels.GATE_UP, kernels.DOWN, kernels.SCORES):
        assert k[1][name]["flops"] * 8 == k[0][name]["flops"]  # split 8 ways
        assert k[2][name]["flops"] * 16 == k[0][name]["flops"]
    # k_proj: 8 KV heads over 8 devices, then one (copied) head per device at tp=16
    assert k[1][kernels.K_PROJ]["flops"] * 8 == k[0][kernels.K_PROJ]["flops"]
    assert k[2][kernels.K_PROJ]["flops"] == k[1][kernels.K_PROJ]["flops"]
    assert k[2][kernels.NORM_ATTN]["flops"] == k[0][kernels.NORM_ATTN]["flops"]  # replicated


def test_mla_under_tensor_parallelism_replicates_the_latent(capsys):
    """DeepSeek-V3 at tp = 8 (issue 40's first number): the latent cache has no heads to split,
    so each device holds all of it, 70,272 bytes a token over the 61 layers in bf16 ((512 + 64)
    x 2 bytes x 61), the unsharded cache; the query/KV up-projections and o_proj split by head,
    the latent down-projection whole on every device."""
    from kvjax import analytic
    from kvjax.analytic.parallel import device_config, kv_replication

    cfg = get_model_config("deepseek-v3")
    argv = ["calc", "--json", "--model", "deepseek-v3", "--context", "32768", "--tp", "8"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_token"] == (512 + 64) * 2 * 61 == 70272
    assert out["kv_cache_bytes_per_device"] == out["kv_cache_bytes"] == 70272 * 32768
    assert kv_replication(cfg, 8) == 8.0
    dev = device_config(cfg, 8)
    assert (dev.num_heads, dev.kv_lora_rank, dev.qk_rope_head_dim) == (16, 512, 64)
    full, part = analytic.param_counts(cfg), analytic.param_counts(dev)
    D, A, P, N, U, W = 7168, 512, 64, 128, 128, 128
    kv_a, absorb, v_up, o = kernels.KV_A_PROJ, kernels.Q_ABSORB, kernels.V_UP, kernels.O_PROJ
    assert full[kv_a] == part[kv_a] == 61 * D * (A + P)  # replicated
    up = full[absorb] + full[v_up]  # kv_b_proj, absorbed into q and o
    assert up == 8 * (part[absorb] + part[v_up]) == 61 * A * N * (U + W)
    assert full[o] == 8 * part[o]
    with pytest.raises(KvjaxError, match="tp=3 does not divide num_heads=128"):
        device_config(cfg, 3)


def _calc_json(capsys, *argv):
    assert main(["calc", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_dp_attention_with_expert_parallelism_by_hand(capsys):
    """DeepSeek-V3, dp-attention 8 x ep 8 at B=64, S=32k (issue 40): each device's latent cache
    is 1/8 of the batch's (8 sequences), its weights all but the 224 of 256 routed experts of
    each of the 58 MoE layers held elsewhere, and each of the 116 all-to-alls (dispatch and
    combine) carries its 8 tokens' 8 routed rows of 7168 bf16, 7/8 of them off the device."""
    cfg = get_model_config("deepseek-v3")
    argv = ["--model", "deepseek-v3", "--context", "32768", "--batch", "64"]
    out = _calc_json(capsys, *argv, "--dp-attention", "8", "--ep", "8")
    assert (out["devices"], out["tp"], out["ep"], out["dp_attention"]) == (8, 1, 8, 8)
    assert out["per_device"]["kv_cache_bytes"] * 8 == out["kv_cache_bytes"] == 70272 * 32768 * 64
    expert = 3 * 7168 * 2048 * 2  # gate, up, down of one expert in bf16
    assert out["per_device"]["weight_bytes"] == analytic.weight_bytes(cfg) - 58 * 224 * expert
    x = 8 * 8 * 7168 * 2
    assert out["collectives"] == {"all-to-all": {"count": 116, "bytes_per_device": 116 * x * 7 / 8}}
    # activations of 8 tokens: residual in and out, the largest intermediate (unfused attention:
    # a layer's f32 scores and bf16 probabilities over 128 heads and 32k positions)
    assert out["per_device"]["activation_bytes"] == 2 * 8 * 7168 * 2 + 8 * 128 * 32768 * (4 + 2)
    tp8 = _calc_json(capsys, *argv, "--tp", "8")  # the latent whole on each device: 8x as much
    assert tp8["per_device"]["kv_cache_bytes"] == 8 * out["per_device"]["kv_cache_bytes"]
    assert set(tp8["collectives"]) == {"all-reduce", "all-gather"}
    assert tp8["collectives"]["all-reduce"]["count"] == 2 * 61 + 1


def test_fixed_shape_all_to_all_counts_its_capacity():
    """GShard's buffers: E experts x C rows, C = ceil(cf * M_l * k / E), never above M_l."""
    from kvjax.analytic.parallel import Placement, all_to_all_bytes, placed_collectives

    cfg = get_model_config("mixtral-8x7b")  # E=8, k=2, D=4096, 32 MoE layers
    assert all_to_all_bytes(cfg, 8, 16) == 16 * 2 * 4096 * 2  # ragged: the routed rows
    assert all_to_all_bytes(cfg, 8, 16, capacity_factor=1.0) == 8 * 4 * 4096 * 2  # C = 4
    assert all_to_all_bytes(cfg, 8, 16, capacity_factor=1.25) == 8 * 5 * 4096 * 2
    assert all_to_all_bytes(cfg, 8, 16, capacity_factor=4.0) == 8 * 16 * 4096 * 2  # E/k: C = M_l
    assert all_to_all_bytes(cfg, 8, 16, capacity_factor=100) == 8 * 16 * 4096 * 2
    colls = placed_collectives(cfg, Placement(ep=8, dp_attention=8), Workload("decode", 128, 64))
    assert colls["all-to-all"] == {"count": 64, "bytes_per_device": 64 * 7 / 8 * 16 * 2 * 4096 * 2}


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--model", "deepseek-v3", "--tp", "8", "--ep", "8"], "ep = dp_attention and tp = 1"),
        (["--model", "mixtral-8x7b", "--ep", "3", "--batch", "3"], "ep=3 does not divide "
         "num_experts=8; allowed ep: 1, 2, 4, 8"),
        (["--model", "deepseek-v3", "--ep", "8", "--batch", "4"], "batch=4 is not divisible by "
         "dp_attention=8"),
        (["--model", "llama-3-8b", "--ep", "2", "--batch", "2"], "ep=2: llama-3-8b has no experts"),
        (["--model", "llama-3-8b", "--capacity-factor", "1"], "--capacity-factor sizes the --ep"),
    ],
)  # fmt: skip
def test_placements_that_do_not_divide_are_refused_by_name(capsys, argv, message):
    assert main(["calc", *argv]) == 2
    assert message in capsys.readouterr().err


def test_placed_frontier_ends_where_one_device_is_full():
    """dp 8 x ep 8: the largest batch is 8 x the most sequences a group holds, each device's
    weights (its 32 of 256 experts), its sequences' latents and its step's activations within
    the chip; tokens/s is per chip (B / step / 8)."""
    from kvjax.analytic import serving
    from kvjax.analytic.parallel import Placement, placed_weight_bytes
    from kvjax.analytic.sizes import activation_bytes

    cfg = get_model_config("deepseek-v3", weight_dtype="fp8", attention_kernel="flash")
    chip = get_chip("h200")
    curve = serving.frontier(cfg, chip, 32768, ep=8, dp_attention=8)
    B = curve["max_batch"]
    assert B % 8 == 0 and curve["devices"] == 8

    def held(b):  # one device, b sequences of its own
        wl = Workload("decode", b, 32768)
        return placed_weight_bytes(cfg, Placement(ep=8, dp_attention=8)) + 70272 * 32768 * b + (
            activation_bytes(cfg, wl))  # fmt: skip

    assert held(B // 8) <= chip.memory_bytes < held(B // 8 + 1)
    last = curve["points"][-1]
    assert last["tokens_per_s"] == pytest.approx(B / last["step_s"] / 8)
    with pytest.raises(KvjaxError, match="ep = dp_attention and tp = 1"):
        serving.frontier(cfg, chip, 32768, tp=8, ep=8)


def test_frontier_predict_is_one_chip(capsys):
    assert main(["frontier", "--model", "llama-3-8b", "--tp", "2", "--predict"]) == 2
    assert "--predict fits one chip's steps" in capsys.readouterr().err


def test_frontier_default_runs_and_an_empty_curve_says_why(capsys):
    """Issue 50: `kvjax frontier` with no flag (the seed's 70B on one H100: 141 GB of bf16
    weights in 80 GB) takes the fewest chips that hold a batch and says so; with --tp 1 the
    empty curve names the bytes a device holds against its memory."""
    assert main(["frontier", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tp"] == 2 and report["max_batch"]["GQA"] > 0
    assert "tp=2, the fewest of 1, 2, 4, 8" in report["tp_note"]
    assert main(["frontier", "--tp", "1", "--json"]) == 0
    (curve,) = json.loads(capsys.readouterr().out)["variants"]
    weights = analytic.weight_bytes(get_model_config("seed-70b"))
    assert curve["max_batch"] == 0 and weights > 80e9
    assert f"weights {weights:,} B a device of 80,000,000,000 B" in curve["no_batch_fits"]
    assert main(["frontier", "--model", "llama-3-8b", "--json"]) == 0  # one chip holds it
    assert json.loads(capsys.readouterr().out)["tp"] == 1


def test_expert_parallel_weights_move_mxfp4_experts_and_their_biases():
    """gpt-oss-120b over ep 4: each of the 36 MoE layers' 96 experts held elsewhere leaves with
    its MXFP4 matrices (3 x 2880 x 2880 elements at 17 bytes a block of 32) and its bf16 biases
    (2F + D)."""
    from kvjax.analytic.parallel import Placement, placed_weight_bytes

    cfg = get_model_config("gpt-oss-120b")
    expert = 3 * 2880 * 2880 * 17 / 32 + (2 * 2880 + 2880) * 2
    held = placed_weight_bytes(cfg, Placement(ep=4, dp_attention=4))
    assert held == round(analytic.weight_bytes(cfg) - 36 * 96 * expert)


def test_hybrid_state_heads_split_over_tp():
    """Qwen3-Next's DeltaNet layers (32 value heads over 16 q/k heads) at tp 4: 8 and 4 a device,
    so each sequence's recurrent state (J x 128 x 128 f32 a layer) and conv cache split 4 ways;
    Falcon-H1's one B/C group is copied to every device (as a KV head past tp = h_kv); LFM2's
    short convolutions are refused by name."""
    from kvjax.analytic.hybrid import state_bytes

    q3n = get_model_config("qwen3-next-80b-a3b")
    dev = device_config(q3n, 4)
    assert (dev.state_heads, dev.state_groups) == (8, 4)
    assert state_bytes(dev) * 4 == state_bytes(q3n)
    from kvjax.analytic.hybrid import state_layer_bytes

    # conv channels X = 2 Y dk + J dv: 2 x 16 x 128 + 32 x 128 = 8192, a device 2048 (3 rows, bf16)
    assert state_layer_bytes(q3n, "D") == {"recurrent": 32 * 128 * 128 * 4, "conv": 3 * 8192 * 2}
    assert state_layer_bytes(dev, "D") == {"recurrent": 8 * 128 * 128 * 4, "conv": 3 * 2048 * 2}
    falcon = get_model_config("falcon-h1-7b")
    assert (device_config(falcon, 4).state_heads, device_config(falcon, 4).state_groups) == (6, 1)
    with pytest.raises(KvjaxError, match="splitting LFM2's short-convolution layers"):
        device_config(get_model_config("lfm2-1.2b"), 2)
    with pytest.raises(KvjaxError, match="tp=64 does not divide state_heads=32"):
        device_config(q3n.replace(num_heads=64, num_kv_heads=2, d_ff=64 * 96), 64)


def test_pipeline_stages_of_llama_2_70b_by_hand(capsys):
    """`kvjax calc --model llama-2-70b --pp 2 --json` (decode, B 1, S 8192 by default): 40 layers
    a stage of 150,994,944 attention (2 x 8192^2 + 2 x 8192 x 1024), 704,643,072 MLP (3 x 8192
    x 28672) and 16,384 norm parameters; the first stage also the 32000 x 8192 embedding, the
    last the final norm (8192) and the LM head (32000 x 8192): in bf16, half the layers' bytes
    each plus its end. Between stages a decode of B sends B x 8192 x 2 bytes; at tp 2 inside,
    each device half of the row."""
    from kvjax.cli.main import main

    layer = 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    assert main(["calc", "--model", "llama-2-70b", "--pp", "2", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)["pipeline"]
    first, last = p["stages"]
    assert (first["layers"], last["layers"], p["devices"]) == (40, 40, 2)
    assert first["weight_bytes"] == 2 * (40 * layer + 32000 * 8192)
    assert last["weight_bytes"] == 2 * (40 * layer + 8192 + 32000 * 8192)
    whole = analytic.weight_bytes(get_model_config("llama-2-70b"))
    assert first["weight_bytes"] + last["weight_bytes"] == whole
    assert first["kv_cache_bytes"] == 2 * 40 * 8 * 128 * 8192 * 2  # the seed's, for 40 layers
    assert p["stage_message_bytes"] == 8192 * 2
    assert p["period_s"] == max(s["bound_s"] for s in p["stages"])
    assert main(["calc", "--model", "llama-2-70b", "--pp", "2", "--tp", "2", "--batch", "4",
                 "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["pipeline"]["stage_message_bytes"] == 4 * 8192
    assert main(["calc", "--model", "gemma-2-9b", "--pp", "2"]) == 2
    assert "pp=2 needs layers of one kind" in capsys.readouterr().err


def test_deepseek_v3_all_reduces_one_message_per_moe_layer(capsys):
    """Issue 49: at tp = 8 an engine adds the shared experts' and the routed experts' partial
    outputs before one all-reduce, so DeepSeek-V3's decode of one token sends 61 (attention's
    o_proj) + 61 (its 3 dense and 58 MoE layers' MLP: one each) + 1 (the vocabulary-parallel
    embedding) = 123 all-reduces of 7168 bf16 values, each a ring's 2 x 7/8 of the message a
    device, and one all-gather of the f32 logits (129,280 / 8 a device, 7/8 of them received)."""
    out = _calc_json(capsys, "--model", "deepseek-v3", "--tp", "8")
    ring = 2 * 7 / 8 * 7168 * 2
    assert out["collectives"]["all-reduce"] == {"count": 123, "bytes_per_device": 123 * ring}
    assert out["collectives"]["all-gather"] == {"count": 1, "bytes_per_device": 129280 * 4 * 7 / 8}
