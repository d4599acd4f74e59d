"""The system bound derived by hand from a model's shapes: attention's exact pairs counted once
whatever kernel form the config carries, the weights' read in the latency bounds, speculative
decoding and a prefix cache bounded with them, and unstated precisions at their most favourable.
Each expected value below is written from the model's dimensions, not from kvjax's closed form."""

import pytest

from kvjax import get_model_config
from kvjax.analytic import Workload
from kvjax.hardware import get_chip
from kvjax.predict.bounds import step_floor
from kvjax.serving.system_bound import system_bound

# Llama-3.1-8B: L 32, D 4096, N 32, K 8, H 128, F 14336, V 128256, untied embeddings
L, D, N, K, H, F, V = 32, 4096, 32, 8, 128, 14336, 128256  # noqa: E741
LAYER = D * N * H + 2 * D * K * H + N * H * D + 3 * D * F  # q, k, v, o, gate/up, down
PARAMS = L * (LAYER + 2 * D) + 2 * V * D + D  # + the layers' two norms, embedding, head, norm
R_PER_TOKEN = 2 * L * K * H * 2  # the seed's cache: 2 L h_kv d_h S bytes (bf16) per token
W_STEP = 2 * (PARAMS - V * D + D)  # a decode's weights: all but the embedding table, one row
PEAK, BW, MEMORY = 989e12, 3.35e12, 80e9  # the H100 SXM's bf16 peak, bandwidth, memory


def prefill_flops(i: int) -> float:
    """The matmuls' 2 x params per token, one row's logits, and the causal pairs at 4 H FLOPs
    a pair and query head (q.k and p.v), every layer."""
    return 2 * L * LAYER * i + 2 * D * V + 4 * H * N * L * i * (i + 1) / 2


def decode_flops(s: int) -> float:
    return 2 * L * LAYER + 2 * D * V + 4 * H * N * L * s


@pytest.fixture(scope="module")
def llama():
    cfg = get_model_config("llama-3.1-8b")
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
            cfg.d_ff, cfg.vocab_size) == (L, D, N, K, H, F, V)  # fmt: skip
    assert PARAMS == 8_030_261_248
    return cfg


def test_a_prefill_heavy_row_by_hand(llama):
    """8,192-token prompts, 2 output tokens, one H100 at bf16, offline: 2 . 6.979e9 . 8192 +
    2 . 4096 . 128256 + 512 . 32 . 32 . 8192 . 8193 / 2 + the second token's decode = 1.3196e14
    FLOPs a request: 61,395 input tokens/s (XLA's scores, softmax and a.v counted beside the
    exact pairs gave 48,319). Its TTFT is the prefill's compute; its TPOT the decode's memory."""
    assert 2 * L * LAYER == pytest.approx(2 * 6.979e9, rel=1e-4)
    b = system_bound(llama, get_chip("h100-sxm"), 1, 8192, 2)
    flops = prefill_flops(8192) + decode_flops(8193)
    assert flops == pytest.approx(1.3196e14, rel=1e-4)
    assert b.side == "compute"
    assert b.input_tokens_per_s == pytest.approx(8192 * PEAK / flops, rel=0.01)
    assert b.input_tokens_per_s == pytest.approx(61_395, rel=0.01)
    assert b.ttft_s == pytest.approx(prefill_flops(8192) / PEAK, rel=0.01)
    assert b.tpot_s == pytest.approx((W_STEP + R_PER_TOKEN * 8193) / BW, rel=1e-9)
    assert system_bound(llama.replace(attention_kernel="flash"), get_chip("h100-sxm"), 1, 8192,
                        2) == b  # fmt: skip


def test_a_decode_heavy_row_by_hand(llama):
    """128-token prompts and 2,048 output tokens: the decodes read sum_S R(S) for S = 129 ..
    2175 with the weights W_step a step over the room D M - W they leave, plus the last token's
    cache written; memory-bound, exact. The TTFT of a short prompt is the weights' read."""
    b = system_bound(llama, get_chip("h100-sxm"), 1, 128, 2048)
    free = MEMORY - 2 * PARAMS
    reads = R_PER_TOKEN * sum(range(129, 2176))
    nbytes = reads * (1 + W_STEP / free) + R_PER_TOKEN * 2175
    assert b.side == "memory" and b.bytes == pytest.approx(nbytes, rel=1e-12)
    assert b.output_tokens_per_s == pytest.approx(2048 * BW / nbytes, rel=1e-12)
    assert b.tpot_s == pytest.approx((W_STEP + R_PER_TOKEN * 129) / BW, rel=1e-12)
    assert b.ttft_s == pytest.approx((W_STEP + R_PER_TOKEN * 128) / BW, rel=1e-12)
    assert b.compute_s == pytest.approx(
        (prefill_flops(128) + sum(decode_flops(s) for s in range(129, 2176))) / PEAK, rel=0.01
    )


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-2-70b", "deepseek-r1", "mistral-7b"])
def test_the_floor_is_the_same_for_every_attention_form(name):
    """XLA's separate scores/softmax/a.v and a fused kernel's tiles give one floor; an MLA
    model's is the least of its absorbed and up-projected forms (deepseek-r1's decode at 4,000:
    141.3 GFLOP, 209.7 with XLA's kernels counted too)."""
    chip = get_chip("h100-sxm")
    cfg = get_model_config(name)
    for wl in (Workload("decode", 1, 4000), Workload("prefill", 1, 700)):
        floors = {form: step_floor(cfg.replace(attention_kernel=form), wl, chip)
                  for form in ("xla", "flash")}  # fmt: skip
        assert floors["xla"] == floors["flash"], (name, wl)
        if cfg.is_mla:
            naive = step_floor(cfg.replace(mla_decode="naive"), wl, chip)
            assert floors["xla"] == step_floor(cfg.replace(mla_decode="absorbed"), wl, chip)
            assert floors["xla"][0] <= naive[0]
    decode = step_floor(cfg, Workload("decode", 1, 4000), chip)[0]
    expected = {"llama-2-70b": 147.9e9, "deepseek-r1": 141.3e9}.get(name)
    if expected:
        assert decode == pytest.approx(expected, rel=1e-3)


def test_speculation_reads_the_cache_once_a_verification_step(llama):
    """k = 3 drafted tokens a step, every draft accepted: a token made by a step at context c is
    at most c + 3, so the decodes read at least sum_S R(max(S - 3, I + 1)) / 4; the TPOT's
    memory side is a quarter. k unstated (inf): nothing but the last token's cache."""
    chip = get_chip("h100-sxm")
    b = system_bound(llama, chip, 1, 128, 2048, spec_tokens=3)
    free = MEMORY - 2 * PARAMS
    reads = R_PER_TOKEN * sum(max(s - 3, 129) for s in range(129, 2176)) / 4
    assert b.bytes == pytest.approx(reads * (1 + W_STEP / free) + R_PER_TOKEN * 2175, rel=1e-12)
    assert b.tpot_s == pytest.approx((W_STEP + R_PER_TOKEN * 129) / BW / 4, rel=1e-12)
    plain = system_bound(llama, chip, 1, 128, 2048)
    assert b.flops == plain.flops and plain.memory_s / b.memory_s == pytest.approx(4, rel=0.01)
    assert (plain.side, b.side) == ("memory", "compute")  # four tokens a read: compute's turn
    assert b.output_tokens_per_s == pytest.approx(2048 / b.compute_s)
    unstated = system_bound(llama, chip, 1, 128, 2048, spec_tokens=float("inf"))
    assert unstated.bytes == pytest.approx(R_PER_TOKEN * 2175) and unstated.side == "compute"


def test_a_prefix_cache_charges_no_prefill_flops_to_its_hits(llama):
    """A fraction f of input tokens from the cache: (1 - f) of the prompts' prefill FLOPs, the
    least over how hits fall on requests (the FLOPs are concave in the tokens a prompt computes:
    half the prompts cached whole compute less than every prompt half cached); a cached prompt's
    first token is one token's compute at its context."""
    chip = get_chip("h100-sxm")
    b = system_bound(llama, chip, 1, 4096, 1, phase="prefill", cached_fraction=0.563)
    full = system_bound(llama, chip, 1, 4096, 1, phase="prefill")
    assert b.flops == pytest.approx((1 - 0.563) * full.flops, rel=1e-12)
    assert b.input_tokens_per_s == pytest.approx(full.input_tokens_per_s / (1 - 0.563))
    half_each = 2 * L * LAYER * 2048 + 4 * H * N * L * sum(range(2049, 4097))  # suffixes
    assert prefill_flops(4096) / 2 < half_each
    served = system_bound(llama, chip, 1, 4096, 16, cached_fraction=0.5)
    first = max(decode_flops(4096) / PEAK, (W_STEP + R_PER_TOKEN * 4096) / BW)
    assert served.ttft_s == pytest.approx(first, rel=0.01)


def test_the_published_rows_with_speculation_and_a_cache_are_bounded_with_them():
    """TensorRT-LLM's DeepSeek-R1 MTP rows (k = 3: num_nextn_predict_layers), DeepSeek's day-6
    prefill (56.3% of input tokens hit its cache), and the v4.1 B200 preview's quantized weights
    (their run's precision unstated): FP4 weights and matmuls, a 4-bit cache; all under."""
    from kvjax.serving.systems import read_systems, row_bound, validate_systems

    rows = {(r["source"], r["metric"]): r for r in read_systems()}
    mtp = rows[("trtllm-bestperf-r1:deepseek-r1:fp8:h200:1k/2k:tp8ep4:min-latency:tps-user",
                "output_tokens_per_s")]  # fmt: skip
    assert mtp["spec_tokens"] == 3
    b = row_bound(mtp)
    assert "3 drafted tokens a step, every draft accepted" in b["bound_assumes"]
    without = row_bound({**mtp, "spec_tokens": 0})
    assert b["bound_value"] == pytest.approx(4 * without["bound_value"], rel=0.02)
    day6 = rows[("deepseek-day6:deepseek-v3-r1:fp8:h800:prefill:per-node", "input_tokens_per_s")]
    assert day6["cached_input_fraction"] == 0.563
    cold = row_bound({**day6, "cached_input_fraction": None})
    assert row_bound(day6)["bound_value"] == pytest.approx(cold["bound_value"] / (1 - 0.563))
    b200 = rows[("mlperf-inference-v4.1:NVIDIA:B200-SXM-180GBx1_TRT:llama2-70b-99:Offline",
                 "output_tokens_per_s")]  # fmt: skip
    said = row_bound(b200)["bound_assumes"]
    assert said[:3] == ["fp4 weights (the lowest precision b200 computes)",
                        "a 4-bit cache (the lowest precision b200 computes)",
                        "fp4 matmuls (the chip's fastest the weights allow)"]  # fmt: skip
    out, summary = validate_systems(list(rows.values()))
    assert summary["above_bound"] == 0 and summary["implementations"] >= 5
    assert all(r["implementation"] for r in out)
