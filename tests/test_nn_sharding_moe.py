"""DeepSeek-style models sharded as deployed (issue 40), on 8 simulated CPU devices: MLA and
mixture-of-experts under tensor parallelism (heads and each expert's width split, the latent
whole on every device) and under data-parallel attention with expert parallelism (whole experts
spread, all-to-all dispatch): logits equal to the unsharded model's, and the real arrays'
bytes per device equal to the closed form (`kvjax.analytic.parallel`)."""

import numpy as np
import pytest
from flax import nnx
from test_nn_sharding import bytes_per_device, run_both

from kvjax import KvjaxError, get_model_config
from kvjax.analytic.parallel import Placement, placed_weight_bytes
from kvjax.analytic.sizes import kv_cache_bytes
from kvjax.nn import Transformer
from kvjax.nn import sharding as sh

F32 = dict(weight_dtype="f32", kv_dtype="f32")
# every size divisible by 8 and distinct: D=40, N=16, F=56, V=104, experts of 24
DEEPSEEK = dict(
    num_layers=2, d_model=40, num_heads=16, num_kv_heads=16, d_ff=56, vocab_size=104,
    q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=4, head_dim=10, v_head_dim=7,
    num_experts=16, experts_per_token=4, moe_d_ff=24, num_shared_experts=1,
    first_dense_layers=1, expert_groups=4, topk_groups=2, **F32,
)  # fmt: skip
MIXTRAL = dict(num_layers=2, d_model=40, num_heads=16, num_kv_heads=8, head_dim=6, d_ff=56,
               vocab_size=104, moe_d_ff=24, **F32)  # fmt: skip
QWEN3_NEXT = dict(num_experts=8, experts_per_token=2, moe_d_ff=24, num_shared_experts=1,
                  shared_expert_gate=True, d_ff=24, vocab_size=104)  # fmt: skip

MODELS = {
    "deepseek-v3": lambda: get_model_config("deepseek-v3", **DEEPSEEK),
    "mixtral": lambda: get_model_config("mixtral-8x7b", **MIXTRAL),
    "qwen3-next": lambda: get_model_config("tiny-qwen3-next", **QWEN3_NEXT),
}


def assert_logits_equal(ref, got):
    for r, g in zip(ref, got, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5, rtol=1e-5)


def test_tensor_parallel_mla_and_experts(devices):
    """deepseek-v3 at tp 8: MLA by head with the latent whole, each expert's width in blocks (a
    shared expert and a dense layer beside them); mixtral's experts at tp are the same rules."""
    cfg = MODELS["deepseek-v3"]()
    ref, got, cache, sharded = run_both(cfg, tp=8)
    assert_logits_equal(ref, got)
    w = bytes_per_device(nnx.state(sharded, nnx.Param))
    assert set(w.values()) == {placed_weight_bytes(cfg, Placement(tp=8))}
    if cfg.is_mla:  # the latent has no heads: every device holds all of it
        kv = bytes_per_device((cache.latent, cache.k_rope))
        assert set(kv.values()) == {kv_cache_bytes(cfg, cache.max_len, cache.batch_size)}


def test_gated_deltanet_heads_split_over_tp(devices):
    """qwen3-next (Gated DeltaNet + gated attention + MoE with a gated shared expert) at tp 2 x
    dp 4: DeltaNet's q/k heads with their value heads, gates and conv channels split (the conv's
    rows in tp blocks), its states split by head; the closed form's per-device weights."""
    cfg = MODELS["qwen3-next"]()
    ref, got, cache, sharded = run_both(cfg, tp=2, dp=4, B=8)
    assert_logits_equal(ref, got)
    w = bytes_per_device(nnx.state(sharded, nnx.Param))
    assert set(w.values()) == {placed_weight_bytes(cfg, Placement(tp=2, dp_attention=4))}
    states = bytes_per_device([x for x in cache.state if x is not None])
    per_sequence = cfg.state_heads * cfg.state_key_dim * cfg.state_value_dim * 4  # f32, a layer
    layers = cfg.layer_kinds.count("D")
    assert set(states.values()) == {per_sequence * layers * (8 // 4) // 2}


@pytest.mark.parametrize("name", ["deepseek-v3", "mixtral", "qwen3-next"])
def test_data_parallel_attention_with_expert_parallelism(devices, name):
    cfg = MODELS[name]()
    ref, got, cache, sharded = run_both(cfg, tp=1, dp=8, B=8, expert_parallel=True)
    assert_logits_equal(ref, got)
    w = bytes_per_device(nnx.state(sharded, nnx.Param))
    assert set(w.values()) == {placed_weight_bytes(cfg, Placement(ep=8, dp_attention=8))}
    if cfg.is_mla:  # each device: its one sequence's latent, 1/8 of the batch's
        kv = bytes_per_device((cache.latent, cache.k_rope))
        assert set(kv.values()) == {kv_cache_bytes(cfg, cache.max_len, cache.batch_size) // 8}


def test_expert_parallel_placements_refused_by_name(devices):
    model = Transformer(get_model_config("tiny-gqa"), rngs=nnx.Rngs(0))
    with pytest.raises(KvjaxError, match="has no experts"):
        sh.shard_model(model, sh.make_mesh(model.cfg, 1, 2), expert_parallel=True)
    cfg = MODELS["mixtral"]()
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(KvjaxError, match="expert_parallel with tp=2"):
        sh.shard_model(model, sh.make_mesh(cfg, 2, 2), expert_parallel=True)
    with pytest.raises(KvjaxError, match="tp=8 does not divide moe_d_ff=20; the sharded model "
                       "allows tp in {1, 2, 4}"):  # fmt: skip
        sh.mesh_shape(cfg.replace(moe_d_ff=20), 8)
    with pytest.raises(KvjaxError, match="tp=2: splitting Mamba-2's or LFM2's layers"):
        sh.mesh_shape(get_model_config("tiny-falcon-h1"), 2)


@pytest.mark.parametrize("tp,dp,ep", [(8, 1, False), (1, 8, True)])
def test_traced_collectives_of_deepseek_v3_equal_the_closed_form(devices, tp, dp, ep):
    """The whole deepseek-v3 (61 layers, from one and two layers of each kind: dense and MoE)
    compiled for 8 simulated devices: per kind, the collectives' count and the bytes a device
    sends equal the closed form (tp 8: 2 all-reduces a layer + the embedding's, the logits'
    all-gather; dp 8 x ep 8: a dispatch and a combine all-to-all per MoE layer, E x C rows with
    C the device's tokens), but for what XLA's SPMD partitioner adds: the shared experts'
    partial sums reduced apart from the routed ones, one more [M, D] message in each MoE layer's
    all-reduce (engines add the two first; the closed form counts their one message); its
    weights and latent cache per device equal `placement_point`'s."""
    from kvjax import get_chip
    from kvjax.analytic import Workload
    from kvjax.analytic.parallel import shared_expert_message
    from kvjax.analytic.placement_point import placement_point
    from kvjax.traced.sharded import trace_sharded_step
    from kvjax.traced.step import cache_len

    cfg = get_model_config("deepseek-v3", **F32)
    tr = trace_sharded_step(cfg, "decode", 16, 256, tp, dp, expert_parallel=ep, layers="one")
    assert tr.layers_traced == (2, 3, 3)  # [dense, MoE], then each kind twice
    assert set(tr.collectives) == set(tr.closed_collectives)
    # by hand: at tp 8 a device's 16 tokens x 7168 f32 all-reduced, 2 (n - 1) / n of it, once
    # more in each of the 58 MoE layers
    extra = 0 if ep else 58 * 2 * 7 / 8 * 16 * 7168 * 4
    pl = Placement(tp, 8 if ep else 1, dp)
    assert shared_expert_message(cfg, pl, Workload("decode", 16, 256)) == extra
    for kind, closed in tr.closed_collectives.items():
        assert tr.collectives[kind]["count"] == closed["count"]
        more = extra if kind == "all-reduce" else 0
        assert tr.collectives[kind]["bytes_per_device"] == pytest.approx(
            closed["bytes_per_device"] + more, rel=0.02
        )
    counts = {k: c["count"] for k, c in tr.closed_collectives.items()}
    assert counts == ({"all-to-all": 2 * 58} if ep else {"all-reduce": 2 * 61 + 1, "all-gather": 1})
    point = placement_point(cfg, pl, Workload("decode", 16, 256), get_chip("h200"))
    assert tr.weight_bytes_per_device == point.weight_bytes_per_device
    rows = cache_len("decode", 256)  # the cache a decode step at S reads: S - 1 rows and its own
    assert tr.kv_cache_bytes_per_device == kv_cache_bytes(cfg, rows, 16 // dp)


def test_cli_trace_expert_parallel(devices, capsys):
    import json

    from kvjax.cli import main

    argv = ["trace", "--model", "mixtral-8x7b", "--layers", "2", "--d-model", "64", "--d-ff",
            "64", "--heads", "8", "--kv-heads", "8", "--head-dim", "8", "--vocab", "128",
            "--weight-dtype", "f32", "--kv-dtype", "f32", "--batch", "8",
            "--context", "32"]  # fmt: skip
    assert main([*argv, "--dp-attention", "8", "--ep", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # 2 MoE layers: dispatch and combine each; 8 experts x 1 row (a device's one token) x 64
    assert out["collectives"]["all-to-all"]["count"] == 4 == out["closed_form"]["collectives"][
        "all-to-all"]["count"]  # fmt: skip
    assert out["collective_ratio"] == pytest.approx(1.0)
    assert out["closed_collective_bytes"] == 4 * 7 / 8 * 8 * 1 * 64 * 4
    assert main([*argv, "--dp-attention", "2", "--ep", "8"]) == 2
    assert "pass --dp-attention 8" in capsys.readouterr().err
