"""The hybrids whose layers keep a state that does not grow (issue 31, the closed form): exact
parameter counts against transformers' models on the meta device, Qwen3-Next-80B-A3B's state and
cache crossover derived by hand from its config, validation one line a field, the decode state
kernels flat in S. The model: tests/test_nn_hf_hybrid.py and tests/test_nn_<mixer>.py."""

import dataclasses

import pytest
from support import require_module

from kvjax import analytic, get_model_config, kernels
from kvjax.analytic import Workload
from kvjax.analytic.step import step_kernels
from kvjax.errors import KvjaxError
from kvjax.model.hf import from_hf_config

torch = require_module("torch")
transformers = require_module("transformers")

FAMILIES = {
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM"),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM"),
}
# Each preset's card (as in kvjax/model/presets_hybrid.py), over its config class's defaults
CARDS = {
    "qwen3-next-80b-a3b": ("qwen3_next", dict(rope_parameters={
        "rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})),
    "falcon-h1-7b": ("falcon_h1", dict(
        hidden_size=3072, num_hidden_layers=44, num_attention_heads=12, num_key_value_heads=2,
        head_dim=128, intermediate_size=12288, vocab_size=130048, mamba_d_ssm=3072,
        mamba_n_heads=24, mamba_d_head=128, mamba_d_state=256, mamba_n_groups=1, mamba_d_conv=4,
        mamba_chunk_size=128)),
    "lfm2-1.2b": ("lfm2", dict(
        hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=12288, vocab_size=65536, full_attn_idxs=[2, 5, 8, 10, 12, 14],
        rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
}  # fmt: skip
# transformers 5.24's counts (the meta-device models of the cards above)
PARAMS = {"qwen3-next-80b-a3b": 79_674_391_296, "falcon-h1-7b": 7_585_513_568,
          "lfm2-1.2b": 1_170_340_608}  # fmt: skip


def _build(family, **fields):
    config_cls, model_cls = (getattr(transformers, n) for n in FAMILIES[family])
    config = config_cls(**fields)
    with torch.device("meta"):
        return config, model_cls(config)


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_default_config_sizes_as_transformers(tmp_path, family):
    config, model = _build(family)
    config.to_json_file(tmp_path / "config.json")
    assert analytic.num_params(from_hf_config(tmp_path)) == _count(model), family


@pytest.mark.parametrize("name", sorted(CARDS))
def test_presets_size_as_transformers(tmp_path, name):
    family, fields = CARDS[name]
    config, model = _build(family, **fields)
    assert analytic.num_params(get_model_config(name)) == _count(model) == PARAMS[name]
    config.to_json_file(tmp_path / "config.json")
    assert from_hf_config(tmp_path).replace(name=name) == get_model_config(name)


# Qwen3-Next-80B-A3B by hand, from its config: 48 layers, full_attention_interval 4 -> 12 gated
# attention layers (2 KV heads of 256) and 36 Gated DeltaNet layers (32 value heads, d_k = d_v =
# 128; 16 q/k heads; conv kernel 4); bf16 weights and caches, the state in f32 (as HF keeps it).
DELTANET_LAYERS = 36
STATE_PER_LAYER = 32 * 128 * 128 * 4  # 2,097,152 B: J x d_k x d_v x 4
CONV_PER_LAYER = (4 - 1) * (2 * 16 * 128 + 32 * 128) * 2  # 49,152 B: 3 rows of q, k, v
KV_PER_TOKEN = 12 * 2 * 2 * 256 * 2  # 24,576 B: 12 layers x (K and V) x 2 heads x 256 x bf16
GQA_KV_PER_TOKEN = 48 * 2 * 2 * 256 * 2  # 98,304 B: every layer full attention, same heads


def test_qwen3_next_state_bytes_by_hand():
    cfg = get_model_config("qwen3-next-80b-a3b")
    assert STATE_PER_LAYER == 2_097_152 and CONV_PER_LAYER == 49_152
    per_sequence = DELTANET_LAYERS * (STATE_PER_LAYER + CONV_PER_LAYER)
    assert per_sequence == 77_266_944  # 73.7 MiB a sequence, whatever S
    assert analytic.state_bytes(cfg) == per_sequence
    assert analytic.state_bytes(cfg, batch=8) == 8 * per_sequence
    # a decode step reads and writes every DeltaNet layer's state and conv cache
    step_bytes = 2 * per_sequence
    assert step_bytes == 154_533_888
    for S in (1_000, 100_000):
        k = step_kernels(cfg, Workload("decode", 1, S))
        assert k[kernels.LINEAR_SCAN].kv_bytes == 2 * DELTANET_LAYERS * STATE_PER_LAYER
        assert k[kernels.LINEAR_CONV].kv_bytes == 2 * DELTANET_LAYERS * CONV_PER_LAYER
        assert k[kernels.LINEAR_SCAN].kv_bytes + k[kernels.LINEAR_CONV].kv_bytes == step_bytes
    assert analytic.kv_bytes_per_token(cfg) == KV_PER_TOKEN


def test_qwen3_next_cache_equals_gqa_at_1048_by_hand():
    """state + 24,576 S = 98,304 S  ->  S = 77,266,944 / 73,728 = 1048 exactly."""
    cfg = get_model_config("qwen3-next-80b-a3b")
    gqa = cfg.replace(layer_kinds="A", state_heads=0, state_groups=0, state_key_dim=0,
                      state_value_dim=0, conv_kernel=0)  # fmt: skip
    assert analytic.kv_bytes_per_token(gqa) == GQA_KV_PER_TOKEN
    S = 77_266_944 / (GQA_KV_PER_TOKEN - KV_PER_TOKEN)
    assert S == 1048
    assert analytic.cache_equals_at_context(cfg, gqa) == 1048
    assert analytic.cache_bytes(cfg, 1048) == analytic.cache_bytes(gqa, 1048) == 103_022_592
    assert analytic.cache_bytes(cfg, 1047) > analytic.cache_bytes(gqa, 1047)
    assert analytic.cache_bytes(cfg, 1049) < analytic.cache_bytes(gqa, 1049)
    # the whole cache passes the bf16 weights (159,348,782,592 B) at 6,480,775 tokens; the GQA
    # model's (its own weights: attention instead of DeltaNet) at 1,616,252, four times sooner
    weights = analytic.weight_bytes(cfg)
    assert weights == 2 * 79_674_391_296
    at = analytic.kv_exceeds_weights_at_context(cfg)
    assert at == (weights - 77_266_944) // KV_PER_TOKEN + 1 == 6_480_775
    gqa_at = analytic.weight_bytes(gqa) // GQA_KV_PER_TOKEN + 1
    assert analytic.kv_exceeds_weights_at_context(gqa) == gqa_at == 1_616_252


def test_state_layers_decode_is_flat_in_context():
    for name, names in (
        ("qwen3-next-80b-a3b", (kernels.LINEAR_SCAN, kernels.LINEAR_CONV, kernels.LINEAR_GATES)),
        ("falcon-h1-7b", (kernels.SSM_SCAN, kernels.SSM_CONV, kernels.SSM_DT)),
        ("lfm2-1.2b", (kernels.CONV_CONV, kernels.CONV_GATE, kernels.CONV_IN_PROJ)),
    ):
        cfg = get_model_config(name)
        short, long = (step_kernels(cfg, Workload("decode", 2, S)) for S in (128, 65_536))
        for kernel in names:
            assert short[kernel] == long[kernel], (name, kernel)
        assert long[kernels.SCORES].flops > short[kernels.SCORES].flops  # attention still grows


# Tiny configs, every dimension distinct
TINY = dict(num_layers=4, d_model=48, num_heads=6, num_kv_heads=3, head_dim=8, d_ff=56,
            vocab_size=97, weight_dtype="f32", kv_dtype="f32")  # fmt: skip
DELTA = dict(layer_kinds="DDDA", state_heads=4, state_groups=2, state_key_dim=5,
             state_value_dim=7, conv_kernel=3)  # fmt: skip
MAMBA = dict(layer_kinds="H", state_heads=4, state_groups=2, state_key_dim=5, state_value_dim=7,
             conv_kernel=3, scan_chunk=4)  # fmt: skip


def test_tiny_state_kernels_by_hand():
    from kvjax import ModelConfig

    delta = ModelConfig(**TINY, **DELTA)
    J, dk, dv, X = 4, 5, 7, 2 * 2 * 5 + 4 * 7  # conv channels: q, k (2 groups of 5), v
    k = step_kernels(delta, Workload("decode", 3, 10))
    assert k[kernels.LINEAR_SCAN].flops == 3 * 3 * J * (7 * dk * dv + 2 * dv)  # 3 layers, B = 3
    assert k[kernels.LINEAR_CONV].flops == 3 * 3 * X * (2 * 3 - 1 + 4)  # conv + silu a channel
    assert analytic.state_bytes(delta) == 3 * (J * dk * dv * 4 + 2 * X * 4)
    mamba = ModelConfig(**TINY, **MAMBA)
    N, P, X = 5, 7, 4 * 7 + 2 * 2 * 5  # conv channels: x, B, C
    k = step_kernels(mamba, Workload("decode", 1, 10))
    assert k[kernels.SSM_SCAN].flops == 4 * 4 * (5 * P * N + 3 * P + 1)
    assert analytic.state_bytes(mamba) == 4 * (4 * N * P * 4 + 2 * X * 4)
    # prefill: T = 10 in chunks of 4 -> 3 chunks, 12 padded positions; the products per head,
    # C B^T per group (2 groups); the cumsums as reduce-windows (Z - 1, n_c adds an output)
    nc, Z, T, Tp = 3, 4, 10, 12
    products = nc * (2 * Z * Z * P + 4 * Z * N * P) + 2 * (nc + 1) ** 2 * P * N
    rest = T * P + T + Tp * (Z - 1) + 3 * nc * Z * Z + Tp + Tp * N + nc * (nc + 1)
    rest += 2 * (nc + 1) ** 2 + 2 * Tp * P + 2 * T * P
    k = step_kernels(mamba, Workload("prefill", 1, T))
    assert k[kernels.SSM_SCAN].flops == 4 * (4 * (products + rest) + 2 * nc * 2 * Z * Z * N)
    # the decode step's only S-dependent cost is the attention beside the state layers
    assert analytic.kv_bytes_per_token(delta) == 1 * 2 * 3 * 8 * 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(layer_kinds="DXA"), "layer_kinds='DXA' must be a string of A"),
        (dict(DELTA, state_heads=0), "state_heads=0 but layer_kinds='DDDA' has state layers"),
        (dict(DELTA, state_groups=3), "state_groups=3 must divide state_heads=4"),
        (dict(state_key_dim=4), "state_key_dim=4 is a state-layer field"),
        (dict(layer_kinds="CA"), "conv_kernel=0 must be >= 1"),
        (dict(conv_kernel=4), "conv_kernel=4 is a state-layer field"),
        (dict(DELTA, state_norm=True), "state_norm=True is the Mamba-2 layers' gated norm"),
        (dict(DELTA, state_dtype="int3"), "state_dtype='int3' is not supported"),
        (dict(DELTA, scan_chunk=0), "scan_chunk=0 must be an integer >= 1"),
        (dict(DELTA, layer_pattern="LG", sliding_window=8), "layer_pattern='LG' .sliding"),
    ],
)
def test_bad_hybrid_fields_are_named(change, message):
    from kvjax import ModelConfig

    with pytest.raises(KvjaxError, match=message) as info:
        ModelConfig(**TINY, **change)
    assert "\n" not in str(info.value)


def test_model_needs_an_attention_layer_for_positions():
    from flax import nnx

    from kvjax.nn.transformer import Transformer

    cfg = get_model_config("lfm2-1.2b").replace(
        num_layers=2, d_model=16, num_heads=2, num_kv_heads=1, head_dim=8, d_ff=24,
        vocab_size=11, layer_kinds="C", weight_dtype="f32",
    )  # fmt: skip
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(KvjaxError, match=r"layer_kinds='C' has no attention layer \(A or H\)"):
        model.init_cache(1, 4)


def test_hybrid_presets_are_hybrid():
    for name in CARDS:
        cfg = get_model_config(name)
        assert cfg.is_hybrid and dataclasses.replace(cfg).is_hybrid
    assert get_model_config("falcon-h1-7b").num_attention_layers == 44
    assert get_model_config("lfm2-1.2b").num_attention_layers == 6


def test_calc_reports_state_beside_kv():
    from kvjax.analytic.variants import variant_rows
    from kvjax.cli.calc_report import calc_report
    from kvjax.hardware import get_chip

    cfg = get_model_config("qwen3-next-80b-a3b")
    r = calc_report(cfg, Workload("decode", 2, 4096), get_chip("h100-sxm"))
    assert r["state_bytes"] == 2 * 77_266_944
    assert r["cache_bytes"] == r["kv_cache_bytes"] + r["state_bytes"]
    assert r["kv_cache_bytes"] == 2 * 4096 * KV_PER_TOKEN
    assert r["state"]["layers"]["D"] == {"count": 36, "recurrent": 2_097_152, "conv": 49_152}
    at = analytic.kv_exceeds_weights_at_context(cfg, 2)
    assert r["cache_exceeds_weights_at_context"] == at
    assert (
        calc_report(get_model_config("llama-3-8b"), Workload("decode", 1, 8), get_chip("h100-sxm"))[
            "state"
        ]
        is None
    )
    rows = {row["variant"]: row for row in variant_rows(cfg)}
    every = rows["GQA every layer"]
    assert every["kv_bytes_per_token"] == GQA_KV_PER_TOKEN
    assert rows["GQA"]["cache"][0]["kv_cache_bytes"] == 8192 * KV_PER_TOKEN + 77_266_944


def test_explorer_shows_the_hybrids():
    """The page's closed form covers the state layers (tests/test_plotting_explorer.py checks
    its numbers against `kvjax calc` in a browser)."""
    from kvjax.plotting.explorer import explorer_data, render_explorer

    assert set(CARDS) <= set(explorer_data()["models"])
    assert '"default_model": "lfm2-1.2b"' in render_explorer("lfm2-1.2b")
