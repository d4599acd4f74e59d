"""Every Hugging Face family kvjax reads, against transformers itself: the parameter count of the
model built on the meta device from the config class's own defaults (what `kvjax calc --model
<that config.json>` sizes), each preset's count from its card, and for the families added in
issue 29 tiny random-checkpoint logits parity (uncached forward, prefill + cached decode, f32),
with a test that switching each family's feature off moves the logits."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from support import check_hf_parity, require_module

from kvjax import analytic, get_model_config
from kvjax.model.hf import from_hf_config

torch = require_module("torch")
transformers = require_module("transformers")

# model_type -> (config class, model class) in transformers 5
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM"),
    "granite": ("GraniteConfig", "GraniteForCausalLM"),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM"),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM"),
    "glm4": ("Glm4Config", "Glm4ForCausalLM"),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM"),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM"),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM"),
    "internlm3": ("InternLM3Config", "LlamaForCausalLM"),  # transformers runs it as Llama
    "apertus": ("ApertusConfig", "ApertusForCausalLM"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
    "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM"),
}


def hf_param_count(model) -> int:
    """Parameters, a tied embedding once, and the one buffer a checkpoint holds as weights:
    DeepSeek-V3's router score-correction biases."""
    params = sum(p.numel() for p in model.parameters())
    return params + sum(b.numel() for n, b in model.named_buffers() if "e_score_correction" in n)


def _build(family, **fields):
    config_cls, model_cls = (getattr(transformers, n) for n in FAMILIES[family])
    config = config_cls(**fields)
    with torch.device("meta"):
        return config, model_cls(config)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_default_config_sizes_as_transformers(tmp_path, family):
    """`kvjax calc --model <the config class's default config.json>`: the parameters of the
    Hugging Face model that file builds."""
    config, model = _build(family)
    config.to_json_file(tmp_path / "config.json")
    cfg = from_hf_config(tmp_path)
    assert analytic.num_params(cfg) == hf_param_count(model), family


# Each new family's preset: the card's fields (as in kvjax/model/presets_families.py)
CARDS = {
    "seed-oss-36b": ("seed_oss", dict(hidden_size=5120, num_hidden_layers=64,
                                      num_attention_heads=80, num_key_value_heads=8,
                                      head_dim=128, intermediate_size=27648,
                                      vocab_size=155136, rope_theta=1e7)),
    "granite-3-8b": ("granite", dict(hidden_size=4096, num_hidden_layers=40,
                                     num_attention_heads=32, num_key_value_heads=8,
                                     intermediate_size=12800, vocab_size=49159,
                                     tie_word_embeddings=True, rope_theta=1e7, rms_norm_eps=1e-5,
                                     attention_multiplier=0.0078125, embedding_multiplier=12.0,
                                     residual_multiplier=0.22, logits_scaling=16.0)),
    "smollm3-3b": ("smollm3", dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
                                   num_key_value_heads=4, intermediate_size=11008,
                                   vocab_size=128256)),
    "phi-3-mini": ("phi3", dict(sliding_window=2047)),
    "starcoder2-3b": ("starcoder2", dict(bos_token_id=None, eos_token_id=None)),
    "stablelm-3b": ("stablelm", dict(bos_token_id=None, eos_token_id=None)),
    "olmo-2-7b": ("olmo2", dict(vocab_size=100352, rope_theta=500000.0, rms_norm_eps=1e-6,
                                pad_token_id=None, eos_token_id=None)),
    "qwen1.5-moe-a2.7b": ("qwen2_moe", dict()),
    "olmoe-1b-7b": ("olmoe", dict(pad_token_id=None, eos_token_id=None)),
    "glm-4-9b": ("glm4", dict(pad_token_id=None)),
    "ernie-4.5-0.3b": ("ernie4_5", dict(pad_token_id=None, bos_token_id=None, eos_token_id=None)),
    "exaone-4.0-32b": ("exaone4", dict(hidden_size=5120, num_hidden_layers=64,
                                       num_attention_heads=40, num_key_value_heads=8,
                                       head_dim=128, intermediate_size=27392, rope_theta=1e6,
                                       sliding_window=4096, sliding_window_pattern=4)),
    "command-r7b": ("cohere2", dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                    num_key_value_heads=8, intermediate_size=14336,
                                    rope_theta=50000.0, logit_scale=0.25, sliding_window=4096,
                                    pad_token_id=None, bos_token_id=None, eos_token_id=None)),
    "internlm3-8b": ("internlm3", dict(rope_theta=5e7, pad_token_id=None, bos_token_id=None,
                                       eos_token_id=None)),
    "apertus-8b": ("apertus", dict(num_key_value_heads=8, intermediate_size=21504)),
    "gpt-oss-120b": ("gpt_oss", dict(quantization_config={"quant_method": "mxfp4"})),
    "gpt-oss-20b": ("gpt_oss", dict(num_hidden_layers=24, num_local_experts=32,
                                    quantization_config={"quant_method": "mxfp4"})),
    # Llama4TextConfig's defaults are Scout's text model (its llama3 RoPE scaling left out)
    "llama-4-scout": ("llama4_text", dict(pad_token_id=None, bos_token_id=None,
                                          eos_token_id=None)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CARDS))
def test_presets_size_as_transformers(tmp_path, name):
    family, fields = CARDS[name]
    config, model = _build(family, **fields)
    assert analytic.num_params(get_model_config(name)) == hf_param_count(model)
    config.to_json_file(tmp_path / "config.json")
    assert from_hf_config(tmp_path).replace(name=name) == get_model_config(name)


# Tiny random checkpoints: every dimension distinct (D 48, N 12 of 8, K 3, F 56, V 97)
TINY = dict(vocab_size=97, hidden_size=48, intermediate_size=56, num_hidden_layers=2,
            num_attention_heads=12, num_key_value_heads=3, head_dim=8, max_position_embeddings=64,
            rms_norm_eps=1e-5, tie_word_embeddings=False)  # fmt: skip


def _zero(attribute):
    """The feature switched off in a loaded model: every layer's `attribute` zeroed."""

    def off(model):
        for layer in model.layers:
            param = layer
            for name in attribute.split("."):
                param = getattr(param, name)
            param[...] = jnp.zeros_like(param[...])

    return off


def _no_sinks(model):
    """gpt-oss's sinks off: a logit of -1e9 adds exp(-1e9 - max) = 0 to every denominator."""
    for layer in model.layers:
        layer.attn.sink_logits[...] = jnp.full_like(layer.attn.sink_logits[...], -1e9)


LLAMA4_TINY = dict(intermediate_size=20, intermediate_size_mlp=56, num_local_experts=6,
                   num_experts_per_tok=2, num_hidden_layers=4, interleave_moe_layer_step=2,
                   no_rope_layer_interval=2, attention_chunk_size=4, floor_scale=2, attn_scale=0.5,
                   pad_token_id=None, bos_token_id=None, eos_token_id=None)  # fmt: skip

# family -> (its tiny config's extra fields, the feature switched off: kvjax fields to load
# with, or a function of the loaded model)
PARITY = {
    "seed_oss": (dict(attention_bias=True, attention_out_bias=True, mlp_bias=True,
                      attention_dropout=0.0, residual_dropout=0.0),
                 _zero("attn.o_bias")),
    "granite": (dict(attention_multiplier=0.2, embedding_multiplier=3.0, residual_multiplier=0.5,
                     logits_scaling=4.0),
                dict(residual_multiplier=1.0)),
    "smollm3": (dict(no_rope_layer_interval=2, num_hidden_layers=4, pad_token_id=None,
                     bos_token_id=None, eos_token_id=None), dict(rope_pattern="R")),
    "phi3": (dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                   "partial_rotary_factor": 0.5},
                  sliding_window=6, pad_token_id=None, bos_token_id=None, eos_token_id=None),
             dict(rotary_dim=0)),
    "starcoder2": (dict(norm_epsilon=1e-5, sliding_window=6, bos_token_id=None,
                        eos_token_id=None, residual_dropout=0.0, embedding_dropout=0.0),
                   _zero("attn_norm.bias")),
    "stablelm": (dict(use_qkv_bias=True, layer_norm_eps=1e-5, bos_token_id=None,
                      eos_token_id=None, hidden_size=96,  # head_dim = 96 / 12 = 8
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                       "partial_rotary_factor": 0.5}),
                 dict(rotary_dim=0)),
    "olmo2": (dict(pad_token_id=None, eos_token_id=None), _zero("attn.q_norm.scale")),
    "qwen2_moe": (dict(moe_intermediate_size=20, shared_expert_intermediate_size=40,
                       num_experts=6, num_experts_per_tok=2), _zero("mlp.shared_gate")),
    "olmoe": (dict(num_experts=6, num_experts_per_tok=2, intermediate_size=20, hidden_size=96,
                   pad_token_id=None,
                   eos_token_id=None), _zero("attn.k_norm.scale")),
    "glm4": (dict(pad_token_id=None, attention_bias=True), _zero("post_mlp_norm.scale")),
    "ernie4_5": (dict(use_bias=True, pad_token_id=None, bos_token_id=None, eos_token_id=None),
                 _zero("attn.o_bias")),
    "exaone4": (dict(sliding_window=4, sliding_window_pattern=2, num_hidden_layers=4,
                     bos_token_id=None, eos_token_id=None), dict(rope_pattern="R")),
    "cohere2": (dict(sliding_window=4, num_hidden_layers=4, logit_scale=0.5, pad_token_id=None,
                     bos_token_id=None, eos_token_id=None,
                     layer_types=["sliding_attention", "full_attention"] * 2),
                dict(rope_pattern="R")),
    "internlm3": (dict(qkv_bias=True, bias=True, pad_token_id=None, bos_token_id=None,
                       eos_token_id=None), _zero("attn.o_bias")),
    # Apertus's default llama3 RoPE scaling, over a context short enough to move the frequencies
    "apertus": (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 16},
                     pad_token_id=None, bos_token_id=None, eos_token_id=None),
                _zero("mlp.alpha_p")),
    # alternating sliding layers of 4 and full ones (its default), YaRN x32 (its default)
    "gpt_oss": (dict(num_local_experts=6, num_experts_per_tok=2, sliding_window=4,
                     num_hidden_layers=4), _no_sinks),
    # chunks of 4 (11 tokens: prefill and decode past two chunk ends), NoPE every 2nd layer with
    # temperature tuning, MoE every 2nd layer (6 experts of 20, 2 a token, a shared one)
    "llama4_text": (LLAMA4_TINY, dict(chunked_attention=False, layer_pattern="G",
                                      sliding_window=0)),
}  # fmt: skip


def save_tiny(folder, family, **extra):
    torch.manual_seed(0)
    config_cls, model_cls = (getattr(transformers, n) for n in FAMILIES[family])
    model = model_cls(config_cls(**{**TINY, **extra})).float().eval()
    with torch.no_grad():  # norms away from 1, biases away from 0: a misplaced one shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "act_fn.alpha" in name:  # Apertus's xIELU: each layer's own alphas
                p.add_(0.5 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    return model


@pytest.mark.parametrize("family", sorted(PARITY))
def test_tiny_checkpoint_logits_parity(tmp_path, family):
    from kvjax.nn import load_hf_llama

    extra, off = PARITY[family]
    ref = save_tiny(tmp_path, family, **extra)
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    toks = np.random.default_rng(0).integers(0, 97, size=(2, 11))
    want = check_hf_parity(model, ref, toks)
    if callable(off):
        off(model)
        moved = model
    else:
        moved = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32", **off)
    assert np.abs(np.asarray(moved(jnp.asarray(toks))) - want).max() > 1e-3, family


def test_families_are_listed_once():
    from kvjax.model.hf import _HF_MODEL_TYPES

    assert set(FAMILIES) - {"gemma3"} <= set(_HF_MODEL_TYPES)
    assert json.dumps(sorted(FAMILIES))  # a table, not a computation


# Each family feature on the tiny config: the trace equals the closed form per kernel
FEATURES = {
    "biases": dict(qkv_bias=True, o_bias=True, mlp_bias=True),
    "multipliers": dict(
        embedding_multiplier=3.0,
        residual_multiplier=0.5,
        logits_scaling=4.0,
        query_pre_attn_scalar=25.0,
    ),
    "nope": dict(num_layers=3, rope_pattern="RN"),
    "partial-rotary": dict(rotary_dim=4),
    "layernorm": dict(norm_kind="layer", norm_bias=True, sandwich_norms=True),
    "post-norms": dict(pre_norms=False, sandwich_norms=True, qk_norm=True, qk_norm_full=True),
    "parallel": dict(parallel_block=True, norm_kind="layer"),
    "xielu": dict(gated_mlp=False, mlp_activation="xielu", qk_norm=True),
    "sink-logits": dict(sink_logits=True, sliding_window=4, layer_pattern="LG"),
    "clamped-swiglu": dict(mlp_activation="clamped_swiglu", swiglu_limit=0.5),
    "chunked": dict(num_layers=3, layer_pattern="LLG", sliding_window=4, chunked_attention=True),
    "l2-norm-temperature": dict(
        num_layers=3, rope_pattern="RN", qk_l2_norm=True, temperature_floor=4, temperature_scale=0.3
    ),
}
MOE_FEATURES = {
    "shared-gate": dict(num_shared_experts=2, shared_expert_gate=True),
    "gpt-oss-experts": dict(router_bias=True, expert_bias=True, mlp_activation="clamped_swiglu",
                            sink_logits=True),
    # Llama 4: MoE every 2nd layer, the top-k sigmoids scaling the experts' input, k = 1 and 2
    "llama4-moe": dict(num_layers=3, moe_layer_step=2, router="topk_sigmoid",
                       norm_topk_prob=False, num_shared_experts=1, experts_per_token=1),
    "llama4-moe-k2": dict(num_layers=4, moe_layer_step=2, router="topk_sigmoid",
                          norm_topk_prob=False, num_shared_experts=1, layer_pattern="LLLG",
                          rope_pattern="RRRN", sliding_window=4, chunked_attention=True,
                          qk_l2_norm=True, temperature_floor=3),
}  # fmt: skip


@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("phase,batch,context", [("prefill", 1, 9), ("decode", 3, 9)])
def test_family_features_trace_as_the_closed_form(feature, phase, batch, context):
    from test_traced_step import check_against_closed_form

    from kvjax.traced.step import trace_step

    cfg = get_model_config("tiny-gqa", **FEATURES[feature])
    check_against_closed_form(trace_step(cfg, phase, batch, context))


@pytest.mark.parametrize("feature", sorted(MOE_FEATURES))
@pytest.mark.parametrize("phase,batch,context", [("prefill", 1, 9), ("decode", 3, 9)])
def test_moe_family_features_trace_as_the_closed_form(feature, phase, batch, context):
    from test_traced_step import check_against_closed_form

    from kvjax.traced.step import trace_step

    cfg = get_model_config("tiny-moe", **MOE_FEATURES[feature])
    check_against_closed_form(trace_step(cfg, phase, batch, context))


def test_llama4_features_each_move_the_logits(tmp_path):
    """Llama 4's other pieces, each switched off on the tiny checkpoint, move its logits: the
    L2 q/k norms, the temperature tuning and the expert-input scaling (as a softmax router)."""
    from kvjax.nn import load_hf_llama

    ref = save_tiny(tmp_path, "llama4_text", **LLAMA4_TINY)
    toks = np.random.default_rng(0).integers(0, 97, size=(2, 11))
    with torch.no_grad():
        want = ref(torch.tensor(toks)).logits.numpy()
    for off in (dict(qk_l2_norm=False), dict(temperature_floor=0), dict(router="softmax")):
        model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32", **off)
        assert np.abs(np.asarray(model(jnp.asarray(toks))) - want).max() > 1e-3, off


def test_llama4_multimodal_config_reads_its_text_config(tmp_path):
    """A `llama4` config.json (Llama4Config) is sized as its text model: Scout's."""
    transformers.Llama4Config().to_json_file(tmp_path / "config.json")
    cfg = from_hf_config(tmp_path)
    assert analytic.num_params(cfg) == analytic.num_params(get_model_config("llama-4-scout"))
    assert cfg.replace(name="llama-4-scout") == get_model_config("llama-4-scout")


def test_internlm3_hub_file_bias_keys(tmp_path):
    """InternLM3's Hub config.json (transformers 4) writes `qkv_bias` and `bias`, which its
    config class maps to attention_bias (q, k, v and o, as Llama runs it) and mlp_bias."""
    base = dict(model_type="internlm3", hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=96, vocab_size=50)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps({**base, "qkv_bias": True, "bias": False}))
    cfg = from_hf_config(tmp_path)
    assert (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) == (True, True, False)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (2, 128, 50)  # class defaults
    (tmp_path / "config.json").write_text(json.dumps({**base, "bias": True}))
    cfg = from_hf_config(tmp_path)
    assert (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) == (False, False, True)


def test_apertus_checkpoint_with_another_xielu_beta_is_refused(tmp_path):
    """kvjax holds xIELU's beta and eps fixed (Hugging Face's buffers, which Apertus never
    changes): a checkpoint whose beta differs is refused by name, not run wrong."""
    from kvjax.errors import KvjaxError
    from kvjax.nn import load_hf_llama

    ref = save_tiny(tmp_path, "apertus", **PARITY["apertus"][0])
    with torch.no_grad():
        ref.model.layers[1].mlp.act_fn.beta.fill_(0.25)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(KvjaxError, match=r"layers\.1\.mlp\.act_fn\.beta' = 0\.25: .*beta 0\.5"):
        load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")


def test_xielu_on_a_gated_mlp_is_refused_by_name():
    from kvjax.errors import KvjaxError

    with pytest.raises(KvjaxError, match=r"^mlp_activation='xielu' needs gated_mlp=False"):
        get_model_config("tiny-gqa", mlp_activation="xielu")
