import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvjax import KvjaxError, analytic, get_model_config, kernels
from kvjax.analytic import Workload
from kvjax.model.config import DTYPE_BYTES, ModelConfig

small = st.integers(min_value=1, max_value=64)


@st.composite
def configs(draw):
    num_kv_heads = draw(st.integers(1, 16))
    group = draw(st.integers(1, 8))
    return ModelConfig(
        num_layers=draw(small),
        d_model=draw(st.integers(8, 512)),
        num_heads=num_kv_heads * group,
        num_kv_heads=num_kv_heads,
        head_dim=draw(st.sampled_from([16, 32, 64, 128, 256])),
        d_ff=draw(st.integers(8, 2048)),
        vocab_size=draw(st.integers(16, 4096)),
        kv_dtype=draw(st.sampled_from(["bf16", "f16", "f32"])),  # 1-byte caches add scales
        weight_dtype=draw(st.sampled_from(["bf16", "f16", "f32"])),
    )


# ---- KV cache: 2 * L * h_kv * d_h * S * B * bytes, linear in every factor ----------------------
@given(configs(), st.integers(1, 10**6), st.integers(1, 512), st.integers(2, 5))
def test_kv_bytes_linear_in_each_factor(cfg, context, batch, k):
    base = analytic.kv_cache_bytes(cfg, context, batch)
    assert (
        base
        == 2
        * cfg.num_layers
        * cfg.num_kv_heads
        * cfg.head_dim
        * context
        * batch
        * (DTYPE_BYTES[cfg.kv_dtype])
    )
    assert analytic.kv_cache_bytes(cfg, k * context, batch) == k * base
    assert analytic.kv_cache_bytes(cfg, context, k * batch) == k * base
    assert (
        analytic.kv_cache_bytes(cfg.replace(num_layers=k * cfg.num_layers), context, batch)
        == k * base
    )
    assert (
        analytic.kv_cache_bytes(cfg.replace(head_dim=k * cfg.head_dim), context, batch) == k * base
    )
    scaled_heads = cfg.replace(num_kv_heads=k * cfg.num_kv_heads, num_heads=k * cfg.num_heads)
    assert analytic.kv_cache_bytes(scaled_heads, context, batch) == k * base
    elements = base // DTYPE_BYTES[cfg.kv_dtype]
    L, K = cfg.num_layers, cfg.num_kv_heads
    scales = {  # int8: f32 per token per KV head for K and V; fp8: one f32 per tensor
        "int8": 2 * L * K * 4 * context * batch,
        "fp8": 2 * L * 4,
    }
    for dtype, width in DTYPE_BYTES.items():
        assert analytic.kv_cache_bytes(cfg.replace(kv_dtype=dtype), context, batch) == (
            elements * width + scales.get(dtype, 0)
        )


@given(configs(), st.integers(1, 10**5), st.integers(1, 64))
def test_mha_over_gqa_cache_ratio_is_h_over_hkv(cfg, context, batch):
    mha = cfg.replace(num_kv_heads=cfg.num_heads)
    ratio = analytic.kv_cache_bytes(mha, context, batch) / analytic.kv_cache_bytes(
        cfg, context, batch
    )
    assert ratio == cfg.num_heads / cfg.num_kv_heads


@settings(max_examples=50)
@given(st.integers(1, 256), st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
def test_decode_intensity_tends_to_batch_as_kv_cache_vanishes(batch, num_kv_heads):
    # A wide model (activations << weights) with a one-position cache, bf16 weights.
    cfg = get_model_config("seed-70b", num_kv_heads=num_kv_heads)
    step = analytic.step_cost(cfg, Workload("decode", batch, 1))
    # Activations grow with B: their share of the bytes is ~B * (D + F) / (D * F) per matmul.
    assert step.intensity <= batch
    assert step.intensity >= batch * (1 - 1e-3 * batch) * 0.99


@given(configs(), st.integers(10**4, 10**6), st.integers(10**4, 10**6), st.integers(1, 256))
def test_attention_intensity_is_independent_of_context_and_batch(cfg, s1, s2, b):
    # The seed's formula for any cache dtype; the kernels checked with the cache in the compute
    # dtype (a wider or narrower cache adds convert FLOPs to the kernels).
    assert analytic.attention_intensity(cfg) == pytest.approx(
        2 * cfg.num_heads / (cfg.num_kv_heads * DTYPE_BYTES[cfg.kv_dtype])
    )
    cfg = cfg.replace(kv_dtype=cfg.compute_dtype)

    def kernel_attention_intensity(s, b):
        ks = analytic.layer_kernels(cfg, Workload("decode", b, s))
        flops = ks[kernels.SCORES].flops + ks[kernels.AV].flops
        return flops / (ks[kernels.SCORES].kv_bytes + ks[kernels.AV].kv_bytes)

    i = analytic.attention_intensity(cfg)
    # The kernels' matmul FLOPs over cache bytes tend to the seed's value as S grows (the new
    # token's own k, v are not read from the cache): within 1e-3 from S = 10^4 on.
    assert kernel_attention_intensity(s1, b) == pytest.approx(i, rel=1e-3)
    assert kernel_attention_intensity(s2, 1) == pytest.approx(i, rel=1e-3)
    # 4*N*H*S FLOPs over 2*K*H*S*bytes = 2N / (K * bytes): h/h_kv for a 2-byte cache.
    assert i == pytest.approx(2 * cfg.num_heads / (cfg.num_kv_heads * DTYPE_BYTES[cfg.kv_dtype]))
    if DTYPE_BYTES[cfg.kv_dtype] == 2:
        assert i == pytest.approx(cfg.num_heads / cfg.num_kv_heads)


# ---- Per-kernel values derived by hand on the tiny GQA config -------------------------------
def test_tiny_gqa_decode_kernels_by_hand():
    cfg = get_model_config("tiny-gqa")  # L=2 D=40 N=12 K=3 G=4 H=8 F=56 V=97, f32
    B, S = 5, 11  # 10 cached positions + the new token
    ks = analytic.layer_kernels(cfg, Workload("decode", B, S))
    # q_proj: 2*B*D*N*H FLOPs; weights D*N*H*4 + x B*D*4 + q B*N*H*4 bytes.
    assert ks[kernels.Q_PROJ].flops == 2 * 5 * 40 * 96
    assert ks[kernels.Q_PROJ].bytes == 4 * (40 * 96 + 5 * 40 + 5 * 96)
    assert ks[kernels.K_PROJ].flops == 2 * 5 * 40 * 24
    assert ks[kernels.K_PROJ].weight_bytes == 4 * 40 * 24
    # scores: q . K_cache over 10 rows (2*B*N*10*H) and q . k_new (2*B*N*H): 2*B*N*S*H.
    assert ks[kernels.SCORES].flops == 2 * 5 * 12 * 11 * 8
    # bytes: q twice (B*N*H), the K cache (B*10*K*H), k_new (B*K*H), f32 scores (B*N*S).
    assert ks[kernels.SCORES].bytes == 4 * (2 * 5 * 96 + 5 * 10 * 24 + 5 * 24 + 5 * 12 * 11)
    assert ks[kernels.SCORES].kv_bytes == 4 * 5 * 10 * 24
    # av: P . V_cache (2*B*N*10*H), p_self x v_new (2*B*N*H), their sum (B*N*H).
    assert ks[kernels.AV].flops == 2 * 5 * 12 * 10 * 8 + 2 * 5 * 12 * 8 + 5 * 12 * 8
    assert ks[kernels.KV_WRITE].kv_bytes == 2 * 5 * 24 * 4
    # gate_up: 2*B*D*2F; down 2*B*F*D.
    assert ks[kernels.GATE_UP].flops == 2 * 5 * 40 * 112
    assert ks[kernels.DOWN].bytes == 4 * (56 * 40 + 5 * 56 + 5 * 40)
    step = analytic.step_kernels(cfg, Workload("decode", B, S))
    assert step[kernels.Q_PROJ].flops == 2 * ks[kernels.Q_PROJ].flops  # summed over L=2 layers
    assert step[kernels.LM_HEAD].flops == 2 * 5 * 40 * 97
    assert step[kernels.LM_HEAD].bytes == 4 * (40 * 97 + 5 * 40 + 5 * 97)


def test_prefill_attends_the_full_square():
    cfg = get_model_config("tiny-mqa")
    ks = analytic.layer_kernels(cfg, Workload("prefill", 2, 7))
    assert ks[kernels.SCORES].flops == 2 * 2 * 12 * 7 * 7 * 8  # 2*B*N*T*S*H with T = S
    assert ks[kernels.Q_PROJ].flops == 2 * (2 * 7) * 40 * 96  # M = B*T tokens
    assert ks[kernels.KV_WRITE].kv_bytes == 2 * 14 * 8 * 4


def test_matmul_weights_read_once_whatever_the_batch():
    cfg = get_model_config("llama-3-8b")
    w1 = analytic.step_cost(cfg, Workload("decode", 1, 128)).weight_bytes
    w64 = analytic.step_cost(cfg, Workload("decode", 64, 128)).weight_bytes
    embed_rows = 63 * cfg.d_model * 2  # the embedding gather reads one row per sequence
    assert w64 - w1 == embed_rows
    # Every weight except the embedding table is read in a decode step.
    table = cfg.vocab_size * cfg.d_model * 2
    assert w1 == analytic.weight_bytes(cfg) - table + cfg.d_model * 2


def test_scores_exceed_kv_bytes_at_mqa():
    # The point: with h_kv = 1 the f32 scores and probabilities outweigh the KV bytes.
    cfg = get_model_config("seed-70b", num_kv_heads=1)
    att = analytic.attention_cost(cfg, Workload("decode", 1, 8192))
    assert att.bytes - att.kv_bytes > att.kv_bytes


def test_decode_flops_are_about_2n_per_token():
    cfg = get_model_config("seed-70b")
    ratio = analytic.step_cost(cfg, Workload("decode", 1, 1)).flops / analytic.num_params(cfg)
    # 2 FLOPs per parameter, less the embedding table (a gather, no FLOPs): 2 * (1 - V*D / N).
    expected = 2 * (1 - cfg.vocab_size * cfg.d_model / analytic.num_params(cfg))
    assert ratio == pytest.approx(expected, rel=1e-3)
    assert 1.95 < ratio < 2.0


def test_fit_limits():
    cfg = get_model_config("llama-3-8b")
    w = analytic.weight_bytes(cfg)
    mem = w + 10 * analytic.kv_cache_bytes(cfg, 4096, 1) + 1
    assert analytic.max_batch_that_fits(cfg, mem, 4096) == 10
    assert analytic.max_context_that_fits(cfg, mem, 10) == 4096
    assert analytic.max_batch_that_fits(cfg, w / 2, 4096) == 0
    s = analytic.kv_exceeds_weights_at_context(cfg, batch=4)
    assert analytic.kv_cache_bytes(cfg, s, 4) > w >= analytic.kv_cache_bytes(cfg, s - 1, 4)


@pytest.mark.parametrize(
    "phase,batch,context,message",
    [
        ("generate", 1, 1, "phase='generate' is not supported; allowed: prefill, decode"),
        ("decode", 0, 1, "batch=0 must be a positive integer"),
        ("decode", 1, -5, "context=-5 must be a positive integer"),
    ],
)
def test_bad_workloads(phase, batch, context, message):
    with pytest.raises(KvjaxError, match=message):
        Workload(phase, batch, context)


def test_int8_weights_compute_in_bf16():
    cfg = get_model_config("llama-3-8b").replace(weight_dtype="int8")
    assert cfg.compute_dtype == "bf16"
    assert analytic.weight_bytes(cfg) == analytic.num_params(cfg)
    assert math.isclose(
        analytic.step_cost(cfg, Workload("decode", 1, 1)).intensity,
        2
        * analytic.step_cost(cfg.replace(weight_dtype="bf16"), Workload("decode", 1, 1)).intensity,
        rel_tol=0.01,
    )
