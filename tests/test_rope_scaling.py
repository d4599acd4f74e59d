"""Long-context RoPE: Llama 3.1's `llama3` and YaRN frequencies against transformers'
own ROPE_INIT_FUNCTIONS, tiny-checkpoint logits parity (Llama with each, DeepSeek-V3 with YaRN's
softmax mscale), and the RoPE kernel's trace equal to its closed form with constant tables."""

import json

import numpy as np
import pytest
from support import check_hf_parity, require_module

from kvjax import KvjaxError, get_model_config
from kvjax.model.hf import from_hf_config
from kvjax.model.rope import inverse_frequencies

torch = require_module("torch")
transformers = require_module("transformers")

LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}  # Llama 3.1
GPT_OSS_YARN = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
DEEPSEEK_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32,
                 "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707,
                 "original_max_position_embeddings": 4096}  # fmt: skip


@pytest.mark.parametrize("params,head_dim", [(LLAMA3, 128), (GPT_OSS_YARN, 64),
                                             (DEEPSEEK_YARN, 64)])  # fmt: skip
def test_frequencies_and_attention_factor_match_transformers(tmp_path, params, head_dim):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = transformers.LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4,
                                  head_dim=head_dim, max_position_embeddings=131072,
                                  rope_parameters=dict(params))  # fmt: skip
    want, factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf)
    hf.to_json_file(tmp_path / "config.json")
    cfg = from_hf_config(tmp_path)
    assert (cfg.rope_scaling, cfg.rope_factor) == (params["rope_type"], params["factor"])
    got = inverse_frequencies(cfg, head_dim, cfg.rope_theta)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
    assert cfg.rope_attention_factor == pytest.approx(factor, rel=1e-12)
    # the scaling moves the frequencies it is meant to: the lowest by the factor, not the highest
    plain = cfg.replace(rope_scaling="none")
    base = inverse_frequencies(plain, head_dim, cfg.rope_theta)
    assert got[0] == base[0] and got[-1] == pytest.approx(base[-1] / params["factor"], rel=1e-6)


TINY = dict(vocab_size=97, hidden_size=48, intermediate_size=56, num_hidden_layers=2,
            num_attention_heads=12, num_key_value_heads=3, head_dim=8, max_position_embeddings=64,
            rms_norm_eps=1e-5, tie_word_embeddings=False)  # fmt: skip
# the tiny model's original context short enough that positions 0..10 reach the ramp
TINY_ROPE = {
    "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 16},
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(TINY_ROPE))
def test_tiny_llama_with_long_rope_matches_transformers(tmp_path, kind):
    from kvjax.nn import load_hf_llama

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**TINY, rope_parameters=TINY_ROPE[kind])
    ref = transformers.LlamaForCausalLM(config).float().eval()
    ref.save_pretrained(tmp_path, safe_serialization=True)
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    assert model.cfg.rope_scaling == kind
    toks = np.random.default_rng(0).integers(0, 97, size=(2, 11))
    want = check_hf_parity(model, ref, toks)
    plain = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32", rope_scaling="none")
    assert np.abs(np.asarray(plain(toks)) - want).max() > 1e-3  # the scaling matters here


def test_tiny_deepseek_v3_with_yarn_matches_transformers(tmp_path):
    """YaRN's frequencies on the RoPE part of MLA, its attention factor on cos and sin, and
    DeepSeek's softmax scale times yarn_mscale(factor, mscale_all_dim)^2."""
    from test_nn_hf_mla import save_tiny_deepseek

    from kvjax.nn import load_hf_llama

    yarn = {**DEEPSEEK_YARN, "original_max_position_embeddings": 16, "factor": 4.0}
    ref = save_tiny_deepseek(tmp_path, rope_parameters=yarn)
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    cfg = model.cfg
    assert cfg.rope_scaling == "yarn" and cfg.rope_attention_factor != 1.0
    assert cfg.attn_scale == pytest.approx(ref.model.layers[0].self_attn.scaling, rel=1e-12)
    check_hf_parity(model, ref, np.random.default_rng(0).integers(0, 97, size=(2, 9)))


def test_long_rope_bad_fields_are_named(tmp_path):
    cfg = get_model_config("tiny-gqa")
    with pytest.raises(KvjaxError, match="rope_scaling='ntk' is not supported; allowed: none"):
        cfg.replace(rope_scaling="ntk")
    with pytest.raises(KvjaxError, match="rope_original_context=0 must be a positive integer"):
        cfg.replace(rope_scaling="yarn", rope_factor=4.0)
    with pytest.raises(KvjaxError, match="rope_low_freq_factor=4.0 must be below"):
        cfg.replace(rope_scaling="llama3", rope_original_context=16, rope_low_freq_factor=4.0)
    with pytest.raises(KvjaxError, match="one RoPE scaling, not both"):
        cfg.replace(rope_scaling="yarn", rope_original_context=16, rope_linear_factor=2.0)
    data = {**TINY, "model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8}}
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(KvjaxError, match="'llama3' needs original_max_position_embeddings"):
        from_hf_config(tmp_path)


ROPE_FEATURES = {
    "tiny-gqa": dict(rope_scaling="llama3", rope_factor=8.0, rope_original_context=16),
    "tiny-mha": dict(rope_scaling="yarn", rope_factor=4.0, rope_original_context=16,
                     rope_attention_factor=1.2, rotary_dim=8),
    "tiny-mla": dict(rope_scaling="yarn", rope_factor=4.0, rope_original_context=16,
                     rope_attention_factor=1.2),
}  # fmt: skip


@pytest.mark.parametrize("preset", sorted(ROPE_FEATURES))
@pytest.mark.parametrize("phase,batch,context", [("prefill", 1, 9), ("decode", 3, 9)])
def test_long_rope_traces_as_the_closed_form(preset, phase, batch, context):
    from test_traced_step import check_against_closed_form

    from kvjax.traced.step import trace_step

    cfg = get_model_config(preset, **ROPE_FEATURES[preset])
    check_against_closed_form(trace_step(cfg, phase, batch, context))
