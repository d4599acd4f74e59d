"""Mixtures of experts in the closed form and the trace: the presets against the Hugging Face
models built on the meta device from the published configs, the expected experts a batch touches
against a simulation of random routing, active weights as the B = 1 floor, and every MoE kernel's
traced cost."""

import json

import numpy as np
import pytest
from support import require_module
from test_traced_step import check_against_closed_form

from kvjax import KvjaxError, analytic, get_model_config, kernels
from kvjax.analytic import Workload
from kvjax.analytic.moe import (
    active_params,
    expected_experts_touched,
    experts_touched_bounds,
    moe_layer_param_counts,
)
from kvjax.model.hf import from_hf_config
from kvjax.traced.step import trace_step

# Published config.json values (mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen3-30B-A3B,
# deepseek-ai/DeepSeek-V2-Lite, deepseek-ai/DeepSeek-V3).
CARDS = {
    "mixtral-8x7b": ("mixtral", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
        rope_theta=1e6, rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False)),
    "qwen3-30b-a3b": ("qwen3_moe", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    "deepseek-v2-lite": ("deepseek_v2", dict(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512,
        q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=1,
        moe_layer_freq=1, topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False,
        routed_scaling_factor=1.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_scaling=dict(type="yarn", factor=40, beta_fast=32, beta_slow=1, mscale=0.707,
                          mscale_all_dim=0.707, original_max_position_embeddings=4096))),
    "deepseek-v3": ("deepseek_v3", dict(
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, kv_lora_rank=512,
        q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=3,
        moe_layer_freq=1, n_group=8, topk_group=4, norm_topk_prob=True,
        routed_scaling_factor=2.5, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_scaling=dict(type="yarn", factor=40, beta_fast=32, beta_slow=1, mscale=1.0,
                          mscale_all_dim=1.0, original_max_position_embeddings=4096))),
}  # fmt: skip
HF = {"mixtral": "Mixtral", "qwen3_moe": "Qwen3Moe", "deepseek_v2": "DeepseekV2",
      "deepseek_v3": "DeepseekV3"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CARDS))
def test_card_config_imports_as_the_preset(tmp_path, name):
    family, fields = CARDS[name]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": family, **fields, "_name_or_path": name}))
    assert from_hf_config(path) == get_model_config(name)


@pytest.mark.parametrize("name", sorted(CARDS))
def test_preset_parameters_equal_transformers_on_the_meta_device(name):
    """Every stored tensor: HF's parameters and DeepSeek-V3's score-correction bias (a buffer
    there, 256 a MoE layer, loaded from the checkpoint)."""
    torch = require_module("torch")
    transformers = require_module("transformers")
    family, fields = CARDS[name]
    config = getattr(transformers, f"{HF[family]}Config")(**fields)
    with torch.device("meta"):
        model = getattr(transformers, f"{HF[family]}ForCausalLM")(config)
    counted = sum(p.numel() for p in model.parameters())
    counted += sum(b.numel() for n, b in model.named_buffers() if "e_score_correction" in n)
    assert analytic.num_params(get_model_config(name)) == counted


def test_published_totals_and_active_parameters():
    mixtral = get_model_config("mixtral-8x7b")
    assert analytic.num_params(mixtral) == 46_702_792_704  # the model card's 46.7B
    # active: all but the 6 unpicked experts of 3*D*F in each of 32 layers: 12.9e9
    assert active_params(mixtral) == 46_702_792_704 - 32 * 6 * 3 * 4096 * 14336 == 12_879_925_248
    v3 = get_model_config("deepseek-v3")
    assert round(analytic.num_params(v3) / 1e9, 1) == 671.0  # without the MTP module
    assert round(active_params(v3) / 1e9, 1) == 37.6  # the report's "37B", both embeddings in
    assert analytic.kv_bytes_per_token(v3) == 61 * (512 + 64) * 2 == 70_272
    # per MoE layer: router 256 x 7168 (+ 256 bias), 256 experts of 3 x 7168 x 2048, one shared
    counts = moe_layer_param_counts(v3)
    assert counts[kernels.MOE_ROUTER] == 256 * 7168 + 256
    assert counts[kernels.MOE_GATE_UP] + counts[kernels.MOE_DOWN] == 256 * 3 * 7168 * 2048
    assert counts[kernels.GATE_UP] + counts[kernels.DOWN] == 3 * 7168 * 2048
    assert round(active_params(get_model_config("qwen3-30b-a3b")) / 1e9, 2) == 3.35  # "3.3B"
    lite = get_model_config("deepseek-v2-lite")
    assert round(analytic.num_params(lite) / 1e9, 1) == 15.7
    # the paper's "2.4B activated" leaves the input embedding out (a token reads one row)
    assert round((active_params(lite) - 102400 * 2048) / 1e9, 2) == 2.45


def test_expected_experts_against_a_simulation_of_random_routing():
    """E (1 - (1 - k/E)^M) against M tokens each picking k distinct experts uniformly."""
    rng = np.random.default_rng(0)
    for E, k, M in ((256, 8, 1), (256, 8, 64), (8, 2, 4), (128, 8, 16), (64, 6, 200)):
        trials = 2000
        picks = np.argsort(rng.random((trials, M, E)), axis=-1)[..., :k].reshape(trials, -1)
        distinct = np.array([len(np.unique(p)) for p in picks])
        want = expected_experts_touched(E, k, M)
        assert distinct.mean() == pytest.approx(want, rel=0.01, abs=0.05), (E, k, M)
        best, worst = experts_touched_bounds(E, k, M)
        assert best <= distinct.min() and distinct.max() <= worst
    assert expected_experts_touched(256, 8, 1) == pytest.approx(8)  # B = 1: the active experts
    assert expected_experts_touched(256, 8, 64) == pytest.approx(222.4, abs=0.05)


def test_decode_bytes_at_batch_1_are_active_weights_plus_kv():
    v3 = get_model_config("deepseek-v3")
    S = 4096
    step = analytic.step_cost(v3, Workload("decode", 1, S))
    kernels_1 = analytic.step_kernels(v3, Workload("decode", 1, S))
    weights = sum(c.weight_bytes for c in kernels_1.values())
    # the embedding table is read one row a token; every other active weight once
    bias = 58 * 256 * 2  # the router biases are f32: 2 more bytes each
    want = (active_params(v3) - v3.vocab_size * v3.d_model + v3.d_model) * 2 + bias
    assert weights == pytest.approx(want, rel=1e-9)
    kv = analytic.kv_cache_bytes(v3, S - 1)
    # + activations, the f32 scores of 128 heads (1.7%) and the router's f32 copies (1.2%)
    assert want + kv < step.bytes < 1.03 * (want + kv)
    # at B = 64 the batch touches 222 of 256 experts a layer: 27.8x B=1's expert bytes, not 64x
    b64 = analytic.step_kernels(v3, Workload("decode", 64, S))[kernels.MOE_GATE_UP].weight_bytes
    b1 = analytic.step_kernels(v3, Workload("decode", 1, S))[kernels.MOE_GATE_UP].weight_bytes
    assert b64 / b1 == pytest.approx(222.4 / 8, rel=1e-3)


def test_moe_decode_intensity_grows_far_slower_than_batch():
    dense, moe = get_model_config("llama-3-70b"), get_model_config("deepseek-v3")

    def intensity(cfg, B):
        c = analytic.step_cost(cfg, Workload("decode", B, 2048))
        return c.flops / c.bytes

    assert intensity(dense, 1) == pytest.approx(1, rel=0.1)
    assert intensity(moe, 1) < 1.5  # ~1, raised by MLA's 128-head attention
    assert intensity(dense, 64) / intensity(dense, 1) > 40  # ~ B while weights dominate
    assert intensity(moe, 64) / intensity(moe, 1) < 8  # the batch reads 28x the experts


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"num_shared_experts": 2, "first_dense_layers": 1},
        {"router": "sigmoid", "routed_scaling_factor": 2.5, "expert_groups": 3, "topk_groups": 2},
        {"norm_topk_prob": False, "expert_groups": 2, "topk_groups": 1},
        {"experts_per_token": 3, "sliding_window": 4, "layer_pattern": "LG"},
    ],
    ids=["mixtral", "shared-dense", "v3-routing", "v2-routing", "k3-windows"],
)
@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_moe_traces_match_closed_form(changes, phase, dtype):
    """At the model's own expert reads (M*k gathers, `Workload.experts_touched`)."""
    cfg = get_model_config("tiny-moe", weight_dtype=dtype, kv_dtype=dtype, **changes)
    trace = trace_step(cfg, phase, 3, 7)
    assert trace.workload.experts_touched == trace.workload.tokens * cfg.experts_per_token
    rows = {r.name for r in check_against_closed_form(trace)}
    assert {kernels.MOE_ROUTER, kernels.MOE_TOPK, kernels.MOE_GATE_UP, kernels.MOE_DOWN} <= rows


def test_moe_with_mla_traces_and_one_layer_of_each_kind():
    cfg = get_model_config("tiny-mla-q", num_experts=6, experts_per_token=2, moe_d_ff=20,
                           num_shared_experts=1, first_dense_layers=1, router="sigmoid",
                           expert_groups=2, topk_groups=1)  # fmt: skip
    full = trace_step(cfg, "decode", 2, 9)
    check_against_closed_form(full)
    one = trace_step(cfg.replace(num_layers=5), "decode", 2, 9, layers="one")
    check_against_closed_form(one)


def test_fixed_routing_reads_the_experts_it_picks():
    """A router fixed so token m picks experts 2m and 2m+1: the model's choice is those, and its
    traced expert bytes are the closed form's at M*k = 6 distinct experts (each read once)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from kvjax.nn import Transformer
    from kvjax.nn.moe import route

    cfg = get_model_config("tiny-moe", num_layers=1)
    M, E, D = 3, cfg.num_experts, cfg.d_model
    x = np.zeros((M, D), np.float32)
    x[np.arange(M), np.arange(M)] = 1.0  # token m is the unit vector e_m
    w_r = np.zeros((E, D), np.float32)
    for m in range(M):  # expert 2m and 2m+1 answer to e_m
        w_r[2 * m, m], w_r[2 * m + 1, m] = 3.0, 2.0
    weights, idx = route(cfg, jnp.asarray(x @ w_r.T), None)
    assert np.asarray(idx).tolist() == [[0, 1], [2, 3], [4, 5]]
    assert np.allclose(np.asarray(weights).sum(-1), 1.0)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    del model, jax  # the trace is abstract: the same static gathers whatever the weights
    trace = trace_step(cfg, "decode", 3, 5)
    closed = analytic.step_kernels(cfg, Workload("decode", 3, 5, experts_touched=6))
    traced = trace.by_kernel()
    expert_bytes = 6 * 2 * cfg.moe_d_ff * D * 4  # six distinct experts' gate_up, f32
    assert closed[kernels.MOE_GATE_UP].weight_bytes == expert_bytes
    assert traced[kernels.MOE_GATE_UP].flops == closed[kernels.MOE_GATE_UP].flops
    assert traced[kernels.MOE_GATE_UP].bytes >= closed[kernels.MOE_GATE_UP].bytes


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"num_experts": 4}, "experts_per_token=0 must be in 1 .. num_experts=4"),
        ({"num_experts": 4, "experts_per_token": 2}, "moe_d_ff=0 must be a positive integer"),
        ({"moe_d_ff": 8}, "moe_d_ff=8 is an MoE field, but num_experts=0"),
        ({"num_experts": 6, "experts_per_token": 2, "moe_d_ff": 8, "expert_groups": 4},
         "expert_groups=4 must divide num_experts=6"),
        ({"num_experts": 6, "experts_per_token": 2, "moe_d_ff": 8, "router": "tanh"},
         "router='tanh' is not supported; allowed: softmax, sigmoid"),
        ({"num_experts": 6, "experts_per_token": 2, "moe_d_ff": 8, "first_dense_layers": 2},
         "first_dense_layers=2 leaves no MoE layer of num_layers=2"),
    ],
)  # fmt: skip
def test_bad_moe_configs_name_the_field(changes, message):
    with pytest.raises(KvjaxError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_model_config("tiny-gqa", **changes)


def test_tensor_and_expert_parallel_placement_by_hand():
    from kvjax.analytic import parallel
    from kvjax.cli.calc_report import expert_parallel_report as expert_parallel

    mixtral = get_model_config("mixtral-8x7b")
    # tp: every expert's width split, the router replicated
    dev = parallel.device_config(mixtral, 4)
    full, part = analytic.param_counts(mixtral), analytic.param_counts(dev)
    assert dev.moe_d_ff == 14336 // 4 and part[kernels.MOE_ROUTER] == full[kernels.MOE_ROUTER]
    assert part[kernels.MOE_GATE_UP] * 4 == full[kernels.MOE_GATE_UP]
    with pytest.raises(KvjaxError, match="tp=3 does not divide moe_d_ff=14336"):
        parallel.device_config(mixtral.replace(num_heads=48, num_kv_heads=3, d_ff=12288), 3)
    # ep: one expert of 8 per device per layer, everything else replicated
    e = expert_parallel(mixtral, 8, Workload("decode", 16, 8192))
    expert = 3 * 4096 * 14336 * 2  # bytes of one expert
    assert e["weight_bytes_per_device"] == analytic.weight_bytes(mixtral) - 32 * 7 * expert
    # 16 tokens pick 2 of 8 each: expert e is missed with probability (6/8)^16
    assert e["experts_touched_per_device_per_layer"] == pytest.approx(1 - 0.75**16)
    # 2 tokens a device, each to 2 experts, 7/8 of them elsewhere, there and back, 32 layers
    assert e["all_to_all_bytes_per_device"] == 32 * 2 * 2 * 2 * 4096 * 2 * 7 / 8 == 1_835_008
    with pytest.raises(KvjaxError, match="ep=3 does not divide num_experts=8"):
        expert_parallel(mixtral, 3, Workload("decode", 1, 64))


def test_calc_prints_moe_and_expert_parallel(capsys):
    from kvjax.cli.main import main

    assert main(["calc", "--model", "deepseek-v3", "--batch", "64", "--ep", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["active_params"] == active_params(get_model_config("deepseek-v3"))
    assert out["moe"]["experts_touched_per_layer"] == pytest.approx(222.4, abs=0.05)
    assert (out["moe"]["experts_touched_best"], out["moe"]["experts_touched_worst"]) == (8, 256)
    assert out["expert_parallel"][0]["experts_per_device"] == 32
    # the floor: the weights 64 tokens read, not all 1.34 TB
    assert out["weight_floor_s_per_token"] == pytest.approx(
        out["moe"]["decode_weight_bytes_read"] / out["chip"]["bandwidth_bytes_per_s"]
    )


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_measured_kernels_of_an_moe_layer_run_what_the_closed_form_counts(phase):
    """`kvjax bench` times the router and the gathered experts' products as the model runs them;
    each standalone function's XLA FLOPs are its closed form's (at M*k expert reads)."""
    from kvjax.measured.kernels import kernel_benches

    cfg = get_model_config("tiny-moe", num_shared_experts=1)
    benches = kernel_benches(cfg, Workload(phase, 2, 9))
    assert {kernels.MOE_ROUTER, kernels.MOE_GATE_UP, kernels.MOE_DOWN, kernels.GATE_UP} <= set(
        benches
    )
    for name, kb in benches.items():
        cost = kb.fn.lower(*kb.make_args(0)).cost_analysis()
        assert cost["flops"] == pytest.approx(kb.closed.flops, rel=0.01, abs=8), name


def test_trace_and_profile_commands_on_a_tiny_moe(capsys, tmp_path):
    from kvjax.cli.main import main

    assert main(["trace", "--model", "tiny-moe", "--context", "16", "--batch", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {r["name"] for r in rows["kernels"]} if isinstance(rows, dict) else set()
    assert kernels.MOE_GATE_UP in names
