"""Logits parity of kvjax's hybrids with tiny random Hugging Face checkpoints (issue 31):
Qwen3NextForCausalLM (Gated DeltaNet layers, gated attention, MoE), FalconH1ForCausalLM (Mamba-2
beside attention in every layer, every muP multiplier away from 1) and Lfm2ForCausalLM (short
convolutions and GQA layers): the uncached forward, and prefill then cached decode (the flat
states carried in the cache), f32, atol 2e-4. Right-padded prompts of different lengths leave each
sequence's state where its own prompt ends."""

import jax.numpy as jnp
import numpy as np
import pytest
from support import check_hf_parity, jitted, require_module

torch = require_module("torch")
transformers = require_module("transformers")

from kvjax.nn import load_hf_llama  # noqa: E402

BASE = dict(vocab_size=97, hidden_size=48, intermediate_size=20, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
FAMILIES = {
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(
        num_hidden_layers=4, head_dim=8, rms_norm_eps=1e-6, partial_rotary_factor=0.5,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=6,
        linear_value_head_dim=5, linear_conv_kernel_dim=4, num_experts=6, num_experts_per_tok=2,
        moe_intermediate_size=12, shared_expert_intermediate_size=12)),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM", dict(
        num_hidden_layers=2, head_dim=12, rms_norm_eps=1e-6, mamba_d_ssm=24, mamba_n_heads=4,
        mamba_d_head=6, mamba_n_groups=2, mamba_d_state=5, mamba_d_conv=4, mamba_chunk_size=8,
        attention_in_multiplier=0.7, key_multiplier=1.3, attention_out_multiplier=0.9,
        ssm_in_multiplier=1.1, ssm_out_multiplier=0.8, mlp_multipliers=[1.2, 0.6],
        ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.05], embedding_multiplier=1.5,
        lm_head_multiplier=0.7)),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(
        num_hidden_layers=4, intermediate_size=64, block_multiple_of=8, full_attn_idxs=[1, 3],
        conv_L_cache=3, norm_eps=1e-6)),
}  # fmt: skip


def save(folder, family, **changes):
    torch.manual_seed(0)
    config_cls, model_cls, fields = FAMILIES[family]
    config = getattr(transformers, config_cls)(**{**BASE, **fields, **changes})
    model = getattr(transformers, model_cls)(config).float().eval()
    with torch.no_grad():  # routers far from ties; norms off their init
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn_like(p))
            elif "norm" in name:
                p.copy_(p + 0.1 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    return model


TOKS = np.random.default_rng(0).integers(0, 97, size=(2, 19))


def test_qwen3_next_matches_transformers(tmp_path):
    ref = save(tmp_path, "qwen3_next")
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    cfg = model.cfg
    assert (cfg.layer_kinds, cfg.state_heads, cfg.state_groups, cfg.attn_output_gate) == (
        "DDDA", 4, 2, True)  # fmt: skip
    check_hf_parity(model, ref, TOKS, prefixes=(1, 11))


def test_qwen3_next_over_several_chunks(tmp_path):
    """T = 70: two of the chunked delta rule's 64-token chunks, the second partial."""
    ref = save(tmp_path, "qwen3_next", num_experts=0, num_hidden_layers=2,
               layer_types=["linear_attention", "full_attention"])  # fmt: skip
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    toks = np.random.default_rng(1).integers(0, 97, size=(1, 70))
    check_hf_parity(model, ref, toks, prefixes=(66,))


@pytest.mark.parametrize("rms_norm,before", [(False, True), (True, True), (True, False)])
def test_falcon_h1_matches_transformers(tmp_path, rms_norm, before):
    """Without the gated norm, and with it in either order (FalconH1Config's default norms before
    the gate; Falcon-H1's config.json files set mamba_norm_before_gate false)."""
    ref = save(tmp_path, "falcon_h1", mamba_rms_norm=rms_norm, mamba_norm_before_gate=before)
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    cfg = model.cfg
    assert (cfg.layer_kinds, cfg.state_heads, cfg.state_value_dim, cfg.state_norm) == (
        "H", 4, 6, rms_norm)  # fmt: skip
    assert cfg.state_norm_before_gate == (rms_norm and before)
    check_hf_parity(model, ref, TOKS, prefixes=(1, 10))


@pytest.mark.parametrize("conv_bias", [False, True])
def test_lfm2_matches_transformers(tmp_path, conv_bias):
    ref = save(tmp_path, "lfm2", conv_bias=conv_bias)
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    cfg = model.cfg
    assert (cfg.layer_kinds, cfg.conv_kernel, cfg.d_ff, cfg.conv_bias) == (
        "CA", 3, 48, conv_bias)  # fmt: skip
    check_hf_parity(model, ref, TOKS, prefixes=(1, 2, 9))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_padded_prompts_keep_their_own_state(tmp_path, family):
    """Prompts of 4 and 11 tokens right-padded to 11: each sequence decodes as if alone."""
    save(tmp_path, family)
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    forward, prefill, decode, _ = jitted(model)
    toks = TOKS[:, :14]
    lengths = np.array([4, 11])
    cache = model.init_cache(2, 16)
    _, cache = prefill(jnp.asarray(toks[:, :11]), cache, jnp.asarray(lengths))
    got = [[], []]
    for t in range(3):
        nxt = jnp.asarray([toks[0, 4 + t], toks[1, 11 + t]])
        step, cache = decode(nxt, cache)
        for b in range(2):
            got[b].append(np.asarray(step[b]))
    for b, n in enumerate(lengths):
        alone = np.asarray(forward(jnp.asarray(toks[b : b + 1, : n + 3])))[0, n:]
        np.testing.assert_allclose(np.stack(got[b]), alone, atol=2e-4)


# Configs as transformers 5 writes them: the config class built with its current keyword
# arguments (layer_types, not the older full_attn_idxs / intervals), saved, then loaded.
WRITTEN = {
    "lfm2": (dict(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
                  full_attn_idxs=None), "CAC"),
    "qwen3_next": (dict(layer_types=["linear_attention", "full_attention"] * 2), "DA"),
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(WRITTEN))
def test_config_as_transformers_writes_it(tmp_path, family):
    from kvjax import analytic
    from kvjax.model.hf import from_hf_config

    changes, kinds = WRITTEN[family]
    config_cls, model_cls, fields = FAMILIES[family]
    config = getattr(transformers, config_cls)(**{**BASE, **fields, **changes})
    config.save_pretrained(tmp_path)
    written = __import__("json").loads((tmp_path / "config.json").read_text())
    assert written["layer_types"] == changes["layer_types"]
    cfg = from_hf_config(tmp_path)
    assert cfg.layer_kinds == kinds
    with torch.device("meta"):
        model = getattr(transformers, model_cls)(config)
    assert analytic.num_params(cfg) == sum(p.numel() for p in model.parameters())


def test_lfm2_from_layer_types_matches_transformers(tmp_path):
    """LFM2 as `Lfm2Config(layer_types=[...]).save_pretrained()` writes it (full_attn_idxs
    null): the attention layers read from layer_types, logits equal to transformers'."""
    ref = save(tmp_path, "lfm2", num_hidden_layers=3, full_attn_idxs=None,
               layer_types=["conv", "full_attention", "conv"])  # fmt: skip
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    assert model.cfg.layer_kinds == "CAC"
    check_hf_parity(model, ref, TOKS, prefixes=(2, 9))
