"""Logits parity of kvjax's MoE decoder with tiny random Hugging Face MixtralForCausalLM,
Qwen3MoeForCausalLM, DeepseekV2ForCausalLM and DeepseekV3ForCausalLM (MoE layers with MLA, a
dense first layer, shared experts, group-limited routing), checkpoints the tests build and save.
The routers' weights are drawn N(0, 1): expert scores lie far apart, so no near-tie can
pick different experts in the two implementations."""

import numpy as np
import pytest
from support import check_hf_parity, require_module

torch = require_module("torch")
transformers = require_module("transformers")

from kvjax.nn import load_hf_llama  # noqa: E402

BASE = dict(vocab_size=97, hidden_size=48, intermediate_size=20, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-6)  # fmt: skip
MLA = dict(kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=6, qk_rope_head_dim=4,
           v_head_dim=7, num_key_value_heads=4)  # fmt: skip


def save(folder, family, **changes):
    torch.manual_seed(0)
    kwargs = {**BASE, **changes}
    make = {
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
        "deepseek_v2": (transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM),
        "deepseek_v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM),
        "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM),
    }[family]
    model = make[1](make[0](**kwargs)).float().eval()
    with torch.no_grad():  # routers sharp enough that the choice is far from a tie; norms off 1
        for name, p in model.named_parameters():
            if name.endswith("gate.weight"):
                p.copy_(torch.randn_like(p))
            elif "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    model.save_pretrained(folder, safe_serialization=True)
    return model


TOKS = np.random.default_rng(0).integers(0, 97, size=(2, 9))


def test_mixtral_matches_transformers(tmp_path):
    ref = save(tmp_path, "mixtral", num_local_experts=6, num_experts_per_tok=2)
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    cfg = model.cfg
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_d_ff, cfg.num_moe_layers) == (
        6,
        2,
        20,
        3,
    )
    check_hf_parity(model, ref, TOKS, prefixes=(4,))


def test_qwen3_moe_matches_transformers(tmp_path):
    ref = save(tmp_path, "qwen3_moe", num_experts=8, num_experts_per_tok=3,
               moe_intermediate_size=12, head_dim=8, norm_topk_prob=True)  # fmt: skip
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    assert model.cfg.qk_norm and model.cfg.norm_topk_prob and model.cfg.moe_d_ff == 12
    check_hf_parity(model, ref, TOKS, prefixes=(4,))


def test_deepseek_v2_group_limited_matches_transformers(tmp_path):
    """Softmax routing within the best group (of 2), not renormalised, scaled; 2 shared experts;
    the first layer dense."""
    ref = save(tmp_path, "deepseek_v2", **MLA, n_routed_experts=8, num_experts_per_tok=2,
               moe_intermediate_size=12, n_shared_experts=2, first_k_dense_replace=1,
               topk_method="group_limited_greedy", n_group=2, topk_group=1,
               routed_scaling_factor=1.5)  # fmt: skip
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    cfg = model.cfg
    assert (cfg.router, cfg.norm_topk_prob, cfg.expert_groups, cfg.first_dense_layers) == (
        "softmax", False, 2, 1)  # fmt: skip
    check_hf_parity(model, ref, TOKS, prefixes=(4,))


@pytest.mark.parametrize("form", ["absorbed", "naive"])
def test_deepseek_v3_moe_with_mla_matches_transformers(tmp_path, form):
    """Sigmoid scores with the correction bias, 2 of 4 groups, renormalised and x 2.5, a shared
    expert, the first layer dense, MLA attention (both decode forms)."""
    ref = save(tmp_path, "deepseek_v3", **MLA, n_routed_experts=8, num_experts_per_tok=2,
               moe_intermediate_size=12, n_shared_experts=1, first_k_dense_replace=1,
               n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True)  # fmt: skip
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32", mla_decode=form)
    cfg = model.cfg
    assert (cfg.router, cfg.expert_groups, cfg.topk_groups, cfg.num_shared_experts) == (
        "sigmoid", 4, 2, 1)  # fmt: skip
    assert cfg.is_mla and cfg.routed_scaling_factor == 2.5
    check_hf_parity(model, ref, TOKS, prefixes=(4,))


def test_qwen2_moe_shared_expert_of_its_own_width(tmp_path):
    """Qwen2-MoE's gated shared expert 30 wide beside routed experts of 12 (transformers allows
    any width): one shared expert of 30 (shared_expert_d_ff), logits equal to transformers'."""
    ref = save(tmp_path, "qwen2_moe", num_experts=6, num_experts_per_tok=2,
               moe_intermediate_size=12, shared_expert_intermediate_size=30)  # fmt: skip
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    cfg = model.cfg
    assert (cfg.num_shared_experts, cfg.shared_expert_d_ff, cfg.shared_d_ff) == (1, 30, 30)
    assert cfg.shared_expert_gate
    from kvjax import analytic

    assert analytic.num_params(cfg) == sum(p.numel() for p in ref.parameters())
    check_hf_parity(model, ref, TOKS, prefixes=(4,))
    with pytest.raises(Exception, match="shared_expert_d_ff=30 is the width of one shared"):
        cfg.replace(num_shared_experts=2)
