"""Gemma 2 / Gemma 3 / Qwen3 in the closed form and the trace: the presets against the Hugging Face
models built on the meta device from the published config.json values (no weights, nothing
downloaded), their config import, and every Gemma/Qwen3 kernel's traced cost."""

import json

import pytest
from support import require_module
from test_traced_step import check_against_closed_form

from kvjax import KvjaxError, analytic, get_model_config, kernels
from kvjax.analytic import Workload
from kvjax.model.hf import from_hf_config
from kvjax.traced.step import trace_step

# The published config.json values (google/gemma-2-9b; google/gemma-3-27b-it's text_config,
# which leaves vocab_size, rope_theta, rope_local_base_freq and the norm eps to the defaults of
# Gemma3TextConfig; Qwen/Qwen3-8B).
CARDS = {
    "gemma-2-9b": ("gemma2", dict(
        vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, sliding_window=4096,
        query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, torch_dtype="bfloat16")),
    "gemma-3-27b": ("gemma3", dict(
        hidden_size=5376, intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32,
        num_key_value_heads=16, head_dim=128, query_pre_attn_scalar=168, sliding_window=1024,
        rope_scaling={"factor": 8.0, "rope_type": "linear"}, torch_dtype="bfloat16")),
    "qwen3-8b": ("qwen3", dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1_000_000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=False, sliding_window=32768,
        use_sliding_window=False, max_window_layers=36, torch_dtype="bfloat16")),
}  # fmt: skip


def _write(tmp_path, name):
    family, fields = CARDS[name]
    if family == "gemma3":  # the multimodal config.json: the text model under text_config
        data = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", **fields}}
    else:
        data = {"model_type": family, **fields}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({**data, "_name_or_path": name}))
    return path


@pytest.mark.parametrize("name", sorted(CARDS))
def test_card_config_imports_as_the_preset(tmp_path, name):
    assert from_hf_config(_write(tmp_path, name)) == get_model_config(name)


@pytest.mark.parametrize("name", sorted(CARDS))
def test_preset_parameters_equal_transformers_on_the_meta_device(name):
    torch = require_module("torch")
    transformers = require_module("transformers")
    family, fields = CARDS[name]
    fields = {k: v for k, v in fields.items() if k != "torch_dtype"}
    make = {
        "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
        "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[family]
    with torch.device("meta"):
        model = make[1](make[0](**fields))
    counted = sum(p.numel() for p in model.parameters())  # a tied embedding counted once
    assert analytic.num_params(get_model_config(name)) == counted


def test_published_totals_by_hand():
    # Gemma 2 9B: embed V*D (tied) + 42 x (q, k, v, o + gated MLP + 4 norms) + final norm.
    V, D, F, L, N, K, H = 256000, 3584, 14336, 42, 16, 8, 256
    layer = D * N * H * 2 + D * K * H * 2 + 3 * D * F + 4 * D
    assert analytic.num_params(get_model_config("gemma-2-9b")) == V * D + L * layer + D
    assert V * D + L * layer + D == 9_241_705_984  # its safetensors index: 18,483,411,968 B bf16
    # Qwen3-8B: untied, q/k norms (2H per layer): the card's 8.2B, 6.95B without embeddings.
    cfg = get_model_config("qwen3-8b")
    counts = analytic.param_counts(cfg)
    assert counts[kernels.QK_NORM] == 36 * 2 * 128
    assert counts["total"] == 8_190_735_360
    assert (
        round((counts["total"] - counts[kernels.EMBED] - counts[kernels.LM_HEAD]) / 1e9, 2) == 6.95
    )


def test_gemma_and_qwen3_fields_are_validated():
    with pytest.raises(KvjaxError, match=r"attn_softcap=-1\.0 must be a number >= 0"):
        get_model_config("tiny-gqa", attn_softcap=-1.0)
    with pytest.raises(KvjaxError, match="rope_linear_factor=0 must be a positive number"):
        get_model_config("tiny-gqa", rope_linear_factor=0)
    with pytest.raises(KvjaxError, match="qk_norm='yes' must be true or false"):
        get_model_config("tiny-gqa", qk_norm="yes")
    with pytest.raises(KvjaxError, match="qk_norm=True is not supported with MLA"):
        get_model_config("tiny-mla", qk_norm=True)
    cfg = get_model_config("gemma-3-27b")
    assert cfg.attn_scale == 168**-0.5
    assert [cfg.layer_rope(i) for i in (0, 5)] == [(10000.0, 1.0), (1e6, 8.0)]


# Tiny configs with each Gemma / Qwen3 feature (tiny-gqa's distinct sizes).
TINY_GEMMA3 = dict(norm_plus_one=True, scale_embeddings=True, sandwich_norms=True, qk_norm=True,
                   query_pre_attn_scalar=6.0, rope_local_theta=100.0, rope_linear_factor=4.0,
                   sliding_window=4, layer_pattern="LG", mlp_activation="gelu",
                   tied_embeddings=True)  # fmt: skip
TINY_GEMMA2 = dict(norm_plus_one=True, scale_embeddings=True, sandwich_norms=True,
                   attn_softcap=50.0, final_softcap=30.0, sliding_window=5,
                   layer_pattern="LG")  # fmt: skip


@pytest.mark.parametrize("features", [TINY_GEMMA3, TINY_GEMMA2, {"qk_norm": True}],
                         ids=["gemma3", "gemma2", "qwen3"])  # fmt: skip
@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_gemma_qwen3_traces_match_closed_form(features, phase, dtype):
    cfg = get_model_config("tiny-gqa", weight_dtype=dtype, kv_dtype=dtype, **features)
    trace = trace_step(cfg, phase, 3, 9)  # past both windows
    rows = {r.name for r in check_against_closed_form(trace)}
    if cfg.sandwich_norms:
        assert {kernels.NORM_POST_ATTN, kernels.NORM_POST_MLP} <= rows
    if cfg.qk_norm:
        assert kernels.QK_NORM in rows
    if cfg.final_softcap:
        assert kernels.LOGIT_SOFTCAP in rows


def test_each_feature_costs_what_its_kernel_says():
    """Hand derivations of the extra work per feature, decode B=1, one layer."""
    base = get_model_config("tiny-gqa")  # D=40, N=12, K=3, H=8, V=97, f32
    wl = Workload("decode", 1, 16)

    def flops(cfg, name):
        return analytic.step_kernels(cfg, wl)[name].flops

    D, N, K, H, V, L = 40, 12, 3, 8, 97, 2
    # q/k norms: an RMSNorm over N + K heads of H: 4*rows*H + rows each, per layer
    rows = N + K
    assert flops(base.replace(qk_norm=True), kernels.QK_NORM) == L * (4 * rows * H + rows)
    # (1 + w): one add per scale element (and per layer per norm)
    plus = base.replace(norm_plus_one=True)
    assert flops(plus, kernels.NORM_ATTN) - flops(base, kernels.NORM_ATTN) == L * D
    # the embedding scale: one multiply per element
    assert (
        flops(base.replace(scale_embeddings=True), kernels.EMBED) - flops(base, kernels.EMBED) == D
    )
    # soft-capping: 2 FLOPs + one tanh per score (S of them per head) and per logit
    capped = base.replace(attn_softcap=50.0, final_softcap=30.0)
    with_cap = analytic.step_kernels(capped, wl)[kernels.SOFTMAX]
    without = analytic.step_kernels(base, wl)[kernels.SOFTMAX]
    assert with_cap.flops - without.flops == L * 2 * N * 16
    assert with_cap.transcendentals - without.transcendentals == L * N * 16
    assert analytic.step_kernels(capped, wl)[kernels.LOGIT_SOFTCAP].flops == 2 * V
    # sandwich norms: two more d_model norms per layer, and 2*D parameters
    sandwich = base.replace(sandwich_norms=True)
    assert analytic.num_params(sandwich) - analytic.num_params(base) == L * 2 * D
    assert flops(sandwich, kernels.NORM_POST_MLP) == flops(base, kernels.NORM_MLP)


def test_calc_shows_gemma3_windows(capsys):
    from kvjax.cli.main import main

    main(["calc", "--model", "gemma-3-27b", "--context", "32k", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["kv_positions_held"]["sliding_layers"] == 52
    assert round(out["kv_cache_bytes"] / 2**30, 2) == 2.91
    assert out["params"] == 27_009_346_304


@pytest.mark.parametrize("features", [TINY_GEMMA3, TINY_GEMMA2], ids=["gemma3", "gemma2"])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_measured_kernels_run_what_the_closed_form_counts(features, phase):
    """The measured view times each kernel alone (`kvjax bench`): with the Gemma details each
    standalone function's XLA FLOPs are its closed form's (the (1 + w) norms, the q/k norms, the
    soft-capped softmax)."""
    from kvjax.measured.kernels import kernel_benches

    cfg = get_model_config("tiny-gqa", **features)
    benches = kernel_benches(cfg, Workload(phase, 2, 9))
    if cfg.qk_norm:
        assert kernels.QK_NORM in benches
    for name, kb in benches.items():
        cost = kb.fn.lower(*kb.make_args(0)).cost_analysis()
        assert cost["flops"] == pytest.approx(kb.closed.flops, rel=0.01, abs=8), name
