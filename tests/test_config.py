import dataclasses
import json

import pytest

from kvjax import ChipSpec, KvjaxError, analytic, get_chip, get_model_config, kernels
from kvjax.hardware import CHIPS, chip_from_numbers
from kvjax.model.config import PRESETS
from kvjax.model.hf import from_hf_config

# Published parameter totals (Hugging Face model cards / safetensors index metadata).
PUBLISHED_PARAMS = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,  # "7.61B"
    "gemma-7b": 8_537_680_896,  # "8.54B"
    "seed-70b": 70e9,  # the seed's "70B"
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_preset_parameter_count_matches_published(name):
    got = analytic.num_params(get_model_config(name))
    assert got == pytest.approx(PUBLISHED_PARAMS[name], rel=0.005 if name != "seed-70b" else 0.01)


def test_llama2_7b_parameter_count_by_hand():
    # embed + lm_head 2*V*D; per layer 4*D^2 + 3*D*F + 2*D; final norm D.
    V, D, F, L = 32000, 4096, 11008, 32
    assert analytic.num_params(get_model_config("llama-2-7b")) == (
        2 * V * D + L * (4 * D * D + 3 * D * F + 2 * D) + D
    )


def test_gemma_head_dim_is_not_d_model_over_heads():
    cfg = get_model_config("gemma-7b")
    assert cfg.head_dim == 256 and cfg.d_model // cfg.num_heads == 192
    assert cfg.q_dim == 4096 and cfg.tied_embeddings and cfg.mlp_activation == "gelu"
    assert analytic.param_counts(cfg)[kernels.LM_HEAD] == 0


def test_qwen_has_qkv_bias_counted():
    cfg = get_model_config("qwen2.5-7b")
    no_bias = cfg.replace(qkv_bias=False)
    extra = cfg.num_layers * (cfg.q_dim + 2 * cfg.kv_dim)
    assert analytic.num_params(cfg) - analytic.num_params(no_bias) == extra


def test_tiny_configs_have_distinct_dimensions():
    for name, k in (("tiny-mha", 12), ("tiny-gqa", 3), ("tiny-mqa", 1)):
        cfg = get_model_config(name)
        assert cfg.num_kv_heads == k
        dims = [cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size]
        assert len(set(dims)) == len(dims)
    gqa = get_model_config("tiny-gqa")
    assert len({gqa.num_kv_heads, gqa.group_size, gqa.num_layers, gqa.head_dim}) == 4


def test_variant_by_replace_is_validated():
    cfg = get_model_config("seed-70b")
    assert dataclasses.replace(cfg, num_kv_heads=1).attention_variant == "MQA"
    assert cfg.replace(num_kv_heads=64).attention_variant == "MHA"
    with pytest.raises(KvjaxError, match="num_heads=64 is not divisible by num_kv_heads=6"):
        dataclasses.replace(cfg, num_kv_heads=6)
    with pytest.raises(KvjaxError, match="allowed num_kv_heads: 1, 2, 4, 8, 16, 32, 64"):
        cfg.replace(num_kv_heads=6)
    with pytest.raises(KvjaxError, match="unknown ModelConfig field 'num_kv_head'"):
        cfg.replace(num_kv_head=4)


def test_config_is_frozen():
    cfg = get_model_config("tiny-gqa")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_kv_heads = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("num_layers", 0, "num_layers=0 must be a positive integer"),
        ("d_model", -8, "d_model=-8 must be a positive integer"),
        ("head_dim", 1.5, "head_dim=1.5 must be a positive integer"),
        ("vocab_size", True, "vocab_size=True must be a positive integer"),
        ("weight_dtype", "int3", "weight_dtype='int3' is not supported; allowed: f32, bf16"),
        ("weight_dtype", "int4", "weight_dtype='int4' is not supported (int4/int2 are KV-cache"),
        ("kv_dtype", "float64", "kv_dtype='float64' is not supported"),
        ("mlp_activation", "relu", "mlp_activation='relu' is not supported; allowed: silu, gelu"),
        ("gated_mlp", "yes", "gated_mlp='yes' must be true or false"),
        ("rope_theta", 0, "rope_theta=0 must be a positive number"),
    ],
)
def test_bad_fields_are_named(field, value, message):
    with pytest.raises(KvjaxError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_model_config("tiny-gqa").replace(**{field: value})


def test_dtype_aliases_and_one_byte_caches():
    cfg = get_model_config("tiny-gqa").replace(weight_dtype="bfloat16", kv_dtype="float8_e4m3fn")
    assert (cfg.weight_dtype, cfg.kv_dtype) == ("bf16", "fp8")
    assert cfg.kv_bytes_per_element == 1
    assert cfg.replace(kv_dtype="int8").kv_bytes_per_element == 1
    assert cfg.replace(kv_dtype="f16").kv_bytes_per_element == 2


def test_unknown_preset_suggests_nearest():
    with pytest.raises(KvjaxError, match="unknown model 'lama-2-7b'; did you mean: llama-2-7b"):
        get_model_config("lama-2-7b")
    with pytest.raises(KvjaxError, match="unknown chip 'h100'; did you mean: h100-sxm"):
        get_chip("h100")


def test_every_preset_has_a_citation_comment():
    import kvjax.model.presets
    import kvjax.model.presets_families
    import kvjax.model.presets_hybrid
    import kvjax.model.presets_serving

    modules = (kvjax.model.presets, kvjax.model.presets_families, kvjax.model.presets_hybrid,
               kvjax.model.presets_serving)  # fmt: skip
    source = "\n".join(open(m.__file__).read() for m in modules)
    for name in PRESETS:
        if not name.startswith("tiny"):
            block = source[: source.index(f'name="{name}"')]
            assert "#" in block.rsplit("_preset(", 1)[0].rsplit("\n\n", 1)[-1], name


# ---- Hugging Face config.json ----------------------------------------------------------------
LLAMA3_8B_HF = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
}


def _write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_hf_llama3_config_equals_preset(tmp_path):
    cfg = from_hf_config(_write(tmp_path, LLAMA3_8B_HF))
    preset = get_model_config("llama-3-8b")
    assert dataclasses.replace(cfg, name=preset.name) == preset
    # A directory holding config.json works too.
    assert from_hf_config(tmp_path).num_kv_heads == 8


def test_hf_gemma_and_qwen_keys(tmp_path):
    gemma = {
        "model_type": "gemma",
        "hidden_size": 3072,
        "intermediate_size": 24576,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "vocab_size": 256000,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-06,
        "torch_dtype": "bfloat16",
    }
    cfg = from_hf_config(_write(tmp_path, gemma))
    assert cfg.head_dim == 256 and cfg.tied_embeddings and cfg.mlp_activation == "gelu"
    assert analytic.num_params(cfg) == analytic.num_params(get_model_config("gemma-7b"))
    qwen = {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    }
    cfg = from_hf_config(_write(tmp_path, qwen, "qwen.json"))
    assert cfg.qkv_bias and cfg.head_dim == 128
    assert analytic.num_params(cfg) == analytic.num_params(get_model_config("qwen2.5-7b"))


def test_hf_missing_head_count_defaults_like_transformers(tmp_path):
    data = {k: v for k, v in LLAMA3_8B_HF.items() if k != "num_key_value_heads"}
    cfg = from_hf_config(_write(tmp_path, data))
    assert cfg.num_kv_heads == 32 and cfg.head_dim == 128


@pytest.mark.parametrize(
    "content,message",
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ({"model_type": "llama", "hidden_size": 64}, "is incomplete: missing 'num_hidden_layers'"),
        ({**LLAMA3_8B_HF, "model_type": "bert"}, "model_type='bert' is not supported"),
        (
            {**LLAMA3_8B_HF, "model_type": "qwen3_next", "layer_types": ["conv"] * 32},
            "layer_types must list 32 entries of linear_attention, full_attention",
        ),
        (
            {**LLAMA3_8B_HF, "model_type": "llama4_text", "moe_layers": [0, 5]},
            r"moe_layers=\[0, 5\] is not every interleave_moe_layer_step=1-th layer",
        ),
        (
            {**LLAMA3_8B_HF, "num_key_value_heads": 5},
            "num_heads=32 is not divisible by num_kv_heads=5",
        ),
        ({**LLAMA3_8B_HF, "hidden_act": "relu"}, "hidden_act='relu' is not supported"),
    ],
)
def test_hf_bad_configs_are_named(tmp_path, content, message):
    with pytest.raises(KvjaxError, match=message):
        from_hf_config(_write(tmp_path, content))


def test_hf_missing_file(tmp_path):
    with pytest.raises(KvjaxError, match="cannot read model config"):
        from_hf_config(tmp_path / "nope.json")


# ---- Chips ----------------------------------------------------------------------------------
def test_chip_presets_required_by_name():
    for name in ("h100-sxm", "h200", "a100-80gb", "tpu-v5e", "tpu-v5p", "mi300x"):
        chip = get_chip(name)
        assert isinstance(chip, ChipSpec) and chip.source and chip.date
        assert chip.peak("bf16") > 1e14 and chip.bandwidth_bytes_per_s > 5e11
    h200 = get_chip("h200")
    assert (h200.peak("bf16"), h200.bandwidth_bytes_per_s, h200.memory_bytes) == (
        989e12,
        4.8e12,
        141e9,
    )
    assert set(CHIPS) >= {"h100-sxm", "h200"}


def test_chip_by_numbers_and_overrides():
    chip = chip_from_numbers(100e12, 1e12, 16e9)
    assert chip.ridge("bf16") == 100
    h100 = get_chip("h100-sxm").with_overrides(bandwidth_bytes_per_s=1e12)
    assert h100.ridge("bf16") == 989 and "bandwidth overridden" in h100.name
    with pytest.raises(KvjaxError, match="chip 'tpu-v5e' has no peak FLOP/s for dtype='f32'"):
        get_chip("tpu-v5e").peak("f32")
    with pytest.raises(KvjaxError, match="bandwidth_bytes_per_s=0 must be a positive number"):
        chip_from_numbers(1e12, 0)
