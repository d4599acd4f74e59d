"""Every number of the seed text (shared/seed/kv-cache-and-arithmetic-intensity.txt), to the
precision the seed prints it, from kvjax's closed forms."""

import pytest

from kvjax import analytic, get_chip, get_model_config, kernels
from kvjax.analytic import Workload
from kvjax.analytic.variants import variants_table
from kvjax.cli.calc_report import calc_report

KiB, GiB, TiB = 2**10, 2**30, 2**40


def seed(num_kv_heads):
    return get_model_config("seed-70b", num_kv_heads=num_kv_heads)


# (variant, h_kv, per token KiB, 8k x 1 GiB, 128k x 32 in TiB or GiB), as printed in the seed.
SEED_TABLE = [
    ("MHA", 64, 2560, 20.0, ("TiB", 10)),
    ("GQA", 8, 320, 2.5, ("TiB", 1.25)),
    ("MQA", 1, 40, 0.31, ("GiB", 160)),
]


def _printed_precision(printed: float) -> float:
    """Half a unit of the last printed digit: 20.0 -> 0.05, 0.31 -> 0.005, 2560 -> 0.5."""
    text = repr(printed)
    decimals = len(text.split(".")[1]) if "." in text else 0
    if text.endswith(".0"):
        decimals = 1
    return 0.5 * 10**-decimals


@pytest.mark.parametrize("variant,h_kv,per_token_kib,gib_8k,big", SEED_TABLE)
def test_seed_kv_table_every_cell(variant, h_kv, per_token_kib, gib_8k, big):
    cfg = seed(h_kv)
    assert cfg.attention_variant == variant
    per_token = analytic.kv_bytes_per_token(cfg)
    assert abs(per_token / KiB - per_token_kib) <= _printed_precision(per_token_kib)
    assert abs(analytic.kv_cache_bytes(cfg, 8192, 1) / GiB - gib_8k) <= _printed_precision(gib_8k)
    unit, value = big
    got = analytic.kv_cache_bytes(cfg, 128 * 1024, 32) / {"TiB": TiB, "GiB": GiB}[unit]
    assert abs(got - value) <= _printed_precision(value)


def test_seed_one_head_costs_512_bytes_per_token_per_layer():
    # "Per token per layer, one head costs 2*128*2 = 512 bytes."
    assert analytic.kv_bytes_per_token_per_layer(seed(1)) == 512


def test_seed_table_from_variants_report_matches_cells():
    rows = variants_table(seed(8), get_chip("h100-sxm"))
    mla, rows = rows[3], rows[:3]  # the seed's three rows, then kvjax's MLA row
    assert [(r["variant"], r["num_kv_heads"]) for r in rows] == [
        ("MHA", 64),
        ("GQA", 8),
        ("MQA", 1),
    ]
    # MLA with DeepSeek-V2's recipe for d_h=128 (latent 4*128, RoPE 64): 80 x 576 x 2 bytes
    assert mla["variant"] == "MLA A=512 P=64"
    assert mla["kv_bytes_per_token"] == 80 * 576 * 2 == 90 * KiB
    assert mla["cache_reduction_vs_mha"] == 2560 / 90
    assert [r["cache_reduction_vs_mha"] for r in rows] == [1, 8, 64]  # "h/h_kv x smaller"
    assert [r["kv_bytes_per_token"] / KiB for r in rows] == [2560, 320, 40]
    assert [r["cache"][0]["kv_cache_bytes"] / GiB for r in rows] == [20.0, 2.5, 0.3125]
    assert [r["cache"][1]["kv_cache_bytes"] / TiB for r in rows] == [10, 1.25, 0.15625]


def test_seed_ridge_is_295_flops_per_byte():
    chip = get_chip("h100-sxm")
    assert chip.peak("bf16") == 989e12 and chip.bandwidth_bytes_per_s == 3.35e12
    assert round(chip.ridge("bf16")) == 295
    report = calc_report(seed(8), Workload("decode", 1, 8192), chip)
    assert round(report["ridge_flops_per_byte"]) == 295


def test_seed_70b_floor_42_ms_and_24_tokens_per_s():
    # The seed: 1.4e11 / 3.35e12 = 41.8 ms, printed as 42 ms / 24 tok/s. The seed-70b preset
    # (70.55e9 parameters at h_kv = 8) gives the same to the printed digits.
    report = calc_report(seed(8), Workload("decode", 1, 8192), get_chip("h100-sxm"))
    assert round(report["weight_floor_s_per_token"] * 1e3) == 42
    assert round(1 / report["weight_floor_s_per_token"]) == 24
    assert round(report["params"] / 1e9) == 71 and abs(report["params"] / 70e9 - 1) < 0.01


def test_seed_decode_generates_140_gflop_from_140_gb():
    # "Generating a token from a 70B model moves 140 GB of weights to do 140 GFLOPs."
    step = analytic.step_cost(seed(8), Workload("decode", 1, 1))
    assert round(step.bytes / 1e9, -1) == 140
    assert round(step.flops / 1e9, -1) == 140


def test_seed_prefill_intensity_is_about_S():
    # "Processing S prompt tokens ... I ~ S. At S=2048 prefill is comfortably compute-bound."
    cfg, chip = seed(8), get_chip("h100-sxm")
    wl = Workload("prefill", 1, 2048)
    assert analytic.step_cost(cfg, wl).intensity > chip.ridge("bf16")
    for name in (kernels.Q_PROJ, kernels.O_PROJ, kernels.GATE_UP, kernels.DOWN):
        # 2*S*D*F / (2*D*F + 2*S*(D + F)): within a factor 2 of S while S is below D and F.
        assert 2048 / 2 < analytic.layer_kernels(cfg, wl)[name].intensity < 2048
    # The unfused S x S scores (f32) pull the step below S: they are real bytes here.
    assert analytic.step_cost(cfg, wl).intensity < 2048 / 2


# ---- The five "Check yourself" questions ----------------------------------------------------
def test_check_1_kv_cache_32_layers_8_heads_32k_context_16_sequences_is_64_gib():
    # 2 * 32 * 8 * 128 * 32768 * 16 * 2 bytes = 2^36 bytes.
    cfg = get_model_config("llama-3-8b")  # L=32, h_kv=8, d_h=128, bf16
    assert (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim) == (32, 8, 128)
    assert analytic.kv_cache_bytes(cfg, 32768, 16) == 2 * 32 * 8 * 128 * 32768 * 16 * 2 == 64 * GiB


@pytest.mark.parametrize("batch,rel", [(1, 0.01), (2, 0.01), (8, 0.01), (64, 0.05)])
def test_check_2_decode_intensity_is_batch_when_kv_cache_is_negligible(batch, rel):
    # Assumption that makes I = B approximate: every FLOP is a weight matmul (2 FLOPs per weight
    # per sequence, bf16 = 2 bytes per weight) and only weights move; KV cache and activations
    # are negligible. Activations grow with B, so the approximation loosens as B grows.
    step = analytic.step_cost(seed(8), Workload("decode", batch, 1))
    assert step.intensity == pytest.approx(batch, rel=rel)
    assert step.intensity < batch


def test_check_3_batching_raises_weight_intensity_not_attention_intensity():
    cfg = seed(8)
    q1 = analytic.layer_kernels(cfg, Workload("decode", 1, 4096))[kernels.Q_PROJ].intensity
    q64 = analytic.layer_kernels(cfg, Workload("decode", 64, 4096))[kernels.Q_PROJ].intensity
    assert q64 / q1 == pytest.approx(64, rel=0.05)
    a1 = analytic.attention_cost(cfg, Workload("decode", 1, 4096)).intensity
    a64 = analytic.attention_cost(cfg, Workload("decode", 64, 4096)).intensity
    assert a64 == pytest.approx(a1, rel=1e-9)
    assert analytic.attention_intensity(cfg) == 8  # h / h_kv = 64 / 8


def test_check_4_13b_floor_against_70b():
    # The seed's 2 * 13e9 / 3.35e12 = 7.76 ms versus 41.8 ms: 5.4x faster. With the exact
    # Llama-2-13B (13.02e9) and seed-70b (70.55e9) parameter counts: 7.77 ms and 5.4x.
    chip, wl = get_chip("h100-sxm"), Workload("decode", 1, 1)
    t13 = calc_report(get_model_config("llama-2-13b"), wl, chip)["weight_floor_s_per_token"]
    t70 = calc_report(seed(8), wl, chip)["weight_floor_s_per_token"]
    assert round(t13 * 1e3, 2) == 7.77 and round(t70 / t13, 1) == 5.4


def test_check_5_gqa_cache_exceeds_weights_past_about_427k_tokens():
    # 140e9 bytes of weights / 327,680 bytes per token = 427,246 tokens for one sequence.
    assert analytic.kv_bytes_per_token(seed(8)) == 327680  # 80 layers x 8 heads x 512 bytes
    # The preset's exact 141.1e9 bytes of weights: 430,626 tokens (0.8% more).
    s = analytic.kv_exceeds_weights_at_context(seed(8), batch=1)
    assert analytic.kv_cache_bytes(seed(8), s, 1) > analytic.weight_bytes(seed(8))
    assert analytic.kv_cache_bytes(seed(8), s - 1, 1) <= analytic.weight_bytes(seed(8))
    assert s == pytest.approx(427246, rel=0.01)
