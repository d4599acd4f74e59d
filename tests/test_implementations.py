"""Each decode kernel's own schedule (kvjax.predict.implementations), one split decision of each
implementation reproduced by hand from its code's rule, and the citations it comes from."""

import math
import re

import pytest

from kvjax.errors import KvjaxError
from kvjax.predict.implementations import BY_KEY, KVJAX, RULES, DecodeShape, rule_for, schedule

A100, H100 = 108, 132


def test_fa2_splits_a_long_mha_cache_as_its_heuristic_does():
    # B = 1, 16 MHA heads, 65,536 keys in 128-key blocks (head dim 128): 512 blocks, and
    # b x h x m-blocks = 16 programs before any split, below 0.8 x the SMs it is told of.
    # Told 108 SMs (Flash-Decoding's release): the best wave efficiency is 1.0 (27 splits:
    # 432 = 4 x 108); the smallest split within 0.85 of it is 6 (96 / 108 = 0.89; 5 gives 0.74),
    # 86 blocks a split. Told 216 (>= 2.5.7): 12 (192 / 216), 43 blocks a split.
    mha = DecodeShape(1, 1, 16, 16, 128, 65536)
    old = BY_KEY["flash-decoding"].plan(mha, A100)
    assert (old.splits, old.programs, old.busiest_blocks) == (6, 96, 86)
    new = BY_KEY["flash-attention-2"].plan(mha, A100)
    assert (new.splits, new.programs, new.busiest_blocks) == (12, 192, 43)
    assert (old.block_m, old.rows, old.block_n) == (64, 1, 128)


def test_fa2_packs_a_gqa_group_into_one_tile_and_skips_ineligible_splits():
    # 32 query heads over 8 KV heads at one query: the rows of a KV head's tile are its 4 heads,
    # so b x h_k x 1 = 8 programs; 64 blocks; told 264 SMs the best efficiency is 256 / 264 at
    # 32 splits, and 28..31 (within 0.85 of it) walk 3 blocks a split as 22..27 do: not eligible.
    gqa = DecodeShape(1, 1, 32, 8, 128, 8192)
    s = BY_KEY["flash-attention-2"].plan(gqa, H100)
    assert (s.splits, s.programs, s.rows, s.busiest_blocks) == (32, 256, 4, 2)
    assert s.padding == 16  # 4 rows of a 64-row tile


def test_fa3_splits_on_the_sm_count_in_176_key_blocks():
    # The same GQA shape in FA3: ceil(8192 / 176) = 47 blocks, 8 m-blocks; 14 splits reach
    # 112 / 132 = 0.848 < 0.85, 15 reach 120 / 132; splits pack the GQA group into 128 rows.
    s = BY_KEY["flash-attention-3"].plan(DecodeShape(1, 1, 32, 8, 128, 8192), H100)
    assert (s.splits, s.programs, s.block_n, s.busiest_blocks) == (15, 120, 176, 4)
    assert (s.block_m, s.rows) == (128, 4)
    # paged in 8-token pages (no TMA): 128-key blocks; an fp8 cache: 224
    paged = BY_KEY["flash-attention-3"].plan(DecodeShape(16, 1, 32, 32, 128, 4000, page_size=8), 1)
    fp8 = BY_KEY["flash-attention-3"].plan(DecodeShape(1, 1, 32, 4, 128, 4096, "fp8"), H100)
    assert (paged.block_n, fp8.block_n) == (128, 224)


def test_flashmla_is_one_wave_of_parts_with_a_fixed_cost_a_request():
    # H800 (132 SMs), B = 64, 128 heads over one latent head, 4,096 keys: 2 query tiles of 64,
    # 132 / 1 / 2 = 66 parts; each request 64 blocks + 5, payload ceil(64 x 69 / 66) + 5 = 72:
    # every part takes one whole request (69 <= 72), 2 parts idle, nothing split.
    s = BY_KEY["flashmla"].plan(DecodeShape(64, 1, 128, 1, 576, 4096), H100)
    assert (s.programs, s.splits, s.busiest_blocks, s.persistent) == (132, 1, 69, True)
    # the busiest core walks 69 blocks where the mean core walks 2 x 64 x 64 / 132
    assert s.stretch(H100) == pytest.approx(69 / (2 * 64 * 64 / 132))
    one = BY_KEY["flashmla"].plan(DecodeShape(1, 1, 128, 1, 576, 4096), H100)
    assert (one.splits, one.busiest_blocks) == (32, 7)  # payload ceil(69 / 66) + 5 = 7


def test_flashinfer_tensor_core_decode_fills_two_programs_an_sm():
    # B = 1, GQA 32 / 8 at one query: a packed length of 4 takes 16-row tiles; the grid holds
    # 2 x 132 = 264 programs, 33 a KV head: in 16-token pages the smallest chunk (>= 8 pages)
    # with ceil(512 / c) <= 33 is 16 pages (256 tokens, 32 chunks); in 1-token pages 249 tokens.
    paged = BY_KEY["flashinfer-tc"].plan(DecodeShape(1, 1, 32, 8, 128, 8192, page_size=16), H100)
    assert (paged.block_m, paged.block_n, paged.splits, paged.programs) == (16, 256, 32, 256)
    ones = BY_KEY["flashinfer-tc"].plan(DecodeShape(1, 1, 32, 8, 128, 8192, page_size=1), H100)
    assert (ones.block_n, ones.splits, ones.programs) == (249, 33, 264)
    # a full batch is not split: its 128 q-tiles exceed the 9 items a KV head the H20 has room for
    full = BY_KEY["flashinfer-tc"].plan(DecodeShape(128, 1, 128, 16, 128, 16384, "fp8", 128), 78)
    assert (full.splits, full.programs, full.compute_dtype) == (1, 2048, "bf16")


def test_stretch_is_the_busiest_core_over_the_mean_core():
    s = BY_KEY["flash-decoding"].plan(DecodeShape(64, 1, 16, 2, 128, 1024), A100)
    # 128 unsplit programs of 8 blocks on 108 SMs: 20 SMs run two
    assert s.programs == 128 and s.splits == 1
    assert s.stretch(A100) == pytest.approx(2 * 8 * 108 / (128 * 8))
    assert s.stretch(10_000) == pytest.approx(1.0 * 10_000 / 128)  # idle cores count


def test_every_rule_cites_a_repository_a_commit_and_a_line():
    cite = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}:[\w./-]+\.(?:h|cpp|cu|cuh|hpp):\d+$")
    for rule in RULES:
        assert rule.cites, rule.key
        for c in rule.cites:
            assert cite.match(c), (rule.key, c)


def test_an_unknown_implementation_takes_kvjax_plan_and_says_so():
    assert rule_for("trtllm-gen (flashinfer backend)") is None
    assert schedule("TileOps (TileLang)", DecodeShape(1, 1, 32, 4, 128, 4096), H100) is None
    assert rule_for("FlashAttention-2.5 flash_attn_with_kvcache").key == "flash-attention-2.5"
    assert rule_for("FlashAttention-2 paged KV decode").key == "flash-attention-2"
    from kvjax.predict import bounds
    from kvjax.predict.corpus import read_corpus

    rows = [r for r in read_corpus() if r.kernel == "attention_decode"]
    seen = {bounds.closed_form(r).schedule for r in rows}
    assert KVJAX in seen and {"flashmla", "flash-decoding", "flash-attention-3"} <= seen


def test_bad_shapes_are_refused_by_name():
    with pytest.raises(KvjaxError, match="num_heads=12 is not divisible by num_kv_heads=5"):
        schedule("FlashMLA", DecodeShape(1, 1, 12, 5, 128, 64), H100)
    with pytest.raises(KvjaxError, match="seq_kv=0 must be >= 1"):
        schedule("FlashMLA", DecodeShape(1, 1, 16, 1, 576, 0), H100)


def test_the_schedule_moves_the_prediction_never_the_bound():
    from kvjax.predict import bounds
    from kvjax.predict.corpus import read_corpus

    row = next(r for r in read_corpus() if r.implementation == "Flash-Decoding")
    c = bounds.closed_form(row)
    plain = bounds.closed_form(type(row)({**row.values, "implementation": "x"}, row.path, 1))
    assert c.bound_s == plain.bound_s
    assert c.schedule == "flash-decoding" and plain.schedule == KVJAX
    assert c.stretch >= 1 and math.isfinite(c.stretch)
