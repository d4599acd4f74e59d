"""MLA's closed form against hand derivations: DeepSeek-V3's cache, parameters and decode
attention intensity in both forms. (Against XLA per kernel: tests/test_traced_step.py.)"""

import pytest

from kvjax import analytic, kernels
from kvjax.analytic import Workload
from kvjax.hardware import get_chip
from kvjax.model.config import ModelConfig

# DeepSeek-V3's attention (deepseek-ai/DeepSeek-V3 config.json): 61 layers, D 7168, 128 heads,
# q rank 1536, latent 512, RoPE 64, nope 128 (head_dim 192), values 128. The MLP here is its dense
# layers' (d_ff 18432) in every layer: the cache and the attention do not depend on it.
V3 = ModelConfig(
    name="deepseek-v3-attention", num_layers=61, d_model=7168, num_heads=128, num_kv_heads=128,
    head_dim=192, d_ff=18432, vocab_size=129280, kv_lora_rank=512, q_lora_rank=1536,
    qk_rope_head_dim=64, v_head_dim=128, rope_theta=10000.0,
)  # fmt: skip


def test_deepseek_v3_cache_per_token_by_hand():
    assert analytic.kv_bytes_per_token(V3) == 61 * (512 + 64) * 2 == 70_272
    # the same attention as MHA: 128 heads of K 192 and V 128 wide, 61 layers, bf16
    assert 61 * 128 * (192 + 128) * 2 == 4_997_120
    assert analytic.kv_cache_bytes(V3, 131072, 32) == 70_272 * 131072 * 32
    # independent of the head count, linear in the latent
    assert analytic.kv_bytes_per_token(V3.replace(num_heads=16, num_kv_heads=16)) == 70_272
    assert analytic.kv_bytes_per_token(V3.replace(kv_lora_rank=256)) == 61 * 320 * 2


def test_deepseek_v3_attention_parameters_by_hand():
    p = analytic.layer_param_counts(V3)
    attn = {
        k: v
        for k, v in p.items()
        if k.startswith("attn/") or k in (kernels.NORM_Q_A, kernels.NORM_KV_A)
    }
    assert attn == {
        kernels.Q_A_PROJ: 7168 * 1536,
        kernels.NORM_Q_A: 1536,
        kernels.Q_B_PROJ: 1536 * 128 * 192,
        kernels.KV_A_PROJ: 7168 * 576,
        kernels.NORM_KV_A: 512,
        kernels.Q_ABSORB: 128 * 128 * 512,  # the key half of kv_b_proj
        kernels.V_UP: 128 * 128 * 512,  # the value half
        kernels.O_PROJ: 128 * 128 * 7168,
    }
    assert sum(attn.values()) == 187_107_328


def test_decode_attention_intensity_naive_is_mha_absorbed_is_1_9_n():
    naive = V3.replace(mla_decode="naive")
    # like MHA in bf16 (N/K = 1), but the RoPE key is read once for all heads
    assert analytic.attention_intensity(naive) == 2 * 128 * 320 / (128 * 256 * 2 + 64 * 2)
    assert analytic.attention_intensity(naive) == pytest.approx(1.25, abs=0.005)
    absorbed = analytic.attention_intensity(V3)
    assert absorbed == 2 * 128 * (2 * 512 + 64) / (576 * 2)
    assert absorbed / 128 == pytest.approx(1.89, abs=0.005)
    # on an H100 (bf16 ridge 295 FLOP/byte): GQA-8's attention at N/K = 8 sits far below the
    # ridge; absorbed MLA at 128 heads sits at 242, just below it, and past it with an fp8 cache
    h100 = get_chip("h100-sxm")
    ridge = h100.peak_flops_per_s["bf16"] / h100.bandwidth_bytes_per_s
    assert 8 < absorbed < ridge < analytic.attention_intensity(V3.replace(kv_dtype="fp8"))


@pytest.mark.parametrize("form", ["absorbed", "naive"])
def test_kernel_intensity_tends_to_the_closed_form_as_s_grows(form):
    cfg = V3.replace(mla_decode=form)
    ks = analytic.layer_kernels(cfg, Workload("decode", 1, 1 << 20))
    flops = ks[kernels.SCORES].flops + ks[kernels.AV].flops
    # bytes per position: the cache (A + P) * 2 read by the scores, the latent again by av
    if form == "absorbed":
        cache_bytes = ks[kernels.SCORES].kv_bytes
        assert ks[kernels.AV].kv_bytes == ((1 << 20) - 1) * 512 * 2  # av reads the latent
        assert flops / cache_bytes == pytest.approx(analytic.attention_intensity(cfg), rel=0.01)
    else:  # scores and av read the expanded keys (N*U) and values (N*W) and the RoPE keys (P)
        assert kernels.KV_B_PROJ in ks and kernels.Q_ABSORB not in ks
        expanded = ((1 << 20) - 1) * (128 * (128 + 128) + 64) * 2
        assert flops / expanded == pytest.approx(analytic.attention_intensity(cfg), rel=0.01)


def test_absorbed_decode_moves_far_fewer_bytes_than_naive():
    wl = Workload("decode", 8, 32768)
    naive = analytic.step_cost(V3.replace(mla_decode="naive"), wl)
    absorbed = analytic.step_cost(V3, wl)
    # naive writes and reads N*(H+W) = 40,960 expanded elements per position per layer, the
    # absorbed form reads the 576-wide latent (twice: scores, av); both move the f32 scores of
    # N = 128 heads, which keep the unfused absorbed step at ~1/14 of naive's bytes
    assert naive.bytes > 10 * absorbed.bytes
    assert naive.flops > absorbed.flops  # the expansion itself is 2*A*N*(U+W) per position


def test_prefill_is_the_same_in_both_forms():
    wl = Workload("prefill", 2, 64)
    assert analytic.step_kernels(V3, wl) == analytic.step_kernels(
        V3.replace(mla_decode="naive"), wl
    )


@pytest.mark.parametrize(
    "cfg", [V3, V3.replace(mla_decode="naive"), V3.replace(kv_dtype="fp8")], ids=str
)
def test_fused_attention_reads_the_cache_once_and_tends_to_the_closed_form(cfg):
    wl = Workload("decode", 2, 1 << 20)
    fused = analytic.fused_attention_cost(cfg, wl)
    unfused = analytic.attention_cost(cfg, wl)
    assert fused.flops == unfused.flops and fused.bytes < unfused.bytes
    # what it reads: the latent and RoPE key of every cached position (naive: expanded K and V)
    naive = 128 * (128 + 128) * 2 + 64 * 2  # expanded keys and values, the shared RoPE key
    per_position = 576 * cfg.kv_bytes_per_element if cfg.mla_decode == "absorbed" else naive
    assert fused.kv_bytes == 2 * ((1 << 20) - 1) * per_position
    # the softmax's ~7 FLOPs a score are in the kernel, not in the seed-style ratio: within 2%
    assert fused.intensity == pytest.approx(analytic.attention_intensity(cfg), rel=0.02)


def test_fused_attention_of_gqa_is_the_seeds_h_over_h_kv():
    from kvjax import get_model_config

    cfg = get_model_config("seed-70b")
    fused = analytic.fused_attention_cost(cfg, Workload("decode", 1, 1 << 20))
    assert fused.kv_bytes == ((1 << 20) - 1) * 2 * 8 * 128 * 2
    assert fused.intensity == pytest.approx(64 / 8, rel=0.02)
