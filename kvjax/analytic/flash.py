"""Fused attention as accelerators run it: FlashAttention-2 prefill and flash-decoding.

Pure Python; letters: `kvjax.kernels`. The unfused form (`kvjax.analytic.step`) computes the
full T x S score square and moves the scores through memory; a fused kernel computes only the
blocks the causal (or sliding-window) mask leaves, keeps scores and probabilities on chip and
moves only Q, K, V and O, plus the K/V re-reads of its loop.

Prefill (Dao et al. 2022, "FlashAttention", Algorithm 1 and Theorem 2; Dao 2023,
"FlashAttention-2", Algorithm 1): for each (sequence, query head) the loop walks the T queries
in blocks of B_r rows; each query block loads its Q block once, streams the key/value blocks of
B_c positions its mask reaches, and writes its O block once. Block sizes follow the paper's rule
for an on-chip memory of M elements, B_c = M / (4H) and B_r = min(B_c, H), rounded down to a
power of two as kernels tile and at most 512 (the H100's 228 KiB per SM: B_r = B_c = 128 at
H = 128, FA2's own tiles). A block the mask touches at all is computed whole, so FLOPs count the
block-causal pairs (`computed_pairs`) beside the exact causal ones (`exact_pairs`, T(T+1)/2
without a window). HBM bytes: Q and O once, K and V once per query block that visits them, so
the K/V traffic is T * S * H / B_r per head, the Theta(T^2 H^2 / M) of Theorem 2, unless one
head's K and V fit in half the on-chip memory (a TPU's VMEM at 8k: they stay on chip, read
once). FLOPs are the two products (2 per pair per query-key width, 2 per pair per value width);
the softmax's exponentials are `transcendentals`, its rescaling a few vector ops per pair left
out (they run beside the tensor cores), and L2 hits are not modelled: the bytes are those the
loop asks of off-chip memory.

Decode (flash-decoding, Dao, Haziza, Massa, Sizov 2023): one query per sequence, the cache split
into `splits` chunks so B * K * splits programs fill the chip's cores; each program reads its
chunk of K and V once for all G query heads of its KV head and writes a partial output (G x H,
f32) and its max and sum (2 x G, f32); a combine kernel reads the partials back and writes O. The
cache read dominates: the kernel's intensity tends to 2N / (K * kv), the seed's h / h_kv, as S
grows. MLA absorbed decode is the same kernel over the latent: one KV head of A + P key features
whose first A are also the values, G = N query heads (FlashMLA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvjax import kernels
from kvjax.analytic.costs import EXTEND, SCORE_BYTES, KernelCost, Workload
from kvjax.analytic.keys import key_union
from kvjax.analytic.pairs import block_pairs, ceil_div, exact_pairs
from kvjax.analytic.primitives import _act_bytes
from kvjax.analytic.quant import scale_bytes_per_row
from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig

DEFAULT_BLOCK = 128  # FA2/FA3's tile at H = 128 when no chip is named
MAX_BLOCK = 512  # the largest tile kernels use (splash attention's default on TPU)


@dataclass(frozen=True)
class AttentionShape:
    """What the fused kernel sees of a layer: query heads, KV heads its loop walks, the key (and
    query) width, the value width, and the bytes of one cached position of one KV head."""

    query_heads: int
    kv_heads: int
    key_width: int
    value_width: int
    kv_bytes_per_position: float  # of one KV head: K and V (or the latent) as stored


@dataclass(frozen=True)
class FlashPlan:
    block_q: int
    block_k: int
    splits: int = 1  # decode: chunks of the cache combined afterwards
    kv_on_chip: bool = False  # one key block holds every position: K/V read once per head
    # The L2 (a GPU's last-level cache, `ChipSpec.l2_bytes`): the programs resident at once
    # (`cores`, one per SM) share the K/V blocks they stream, and a KV head's K/V that stays in
    # the L2 between waves is read from HBM once. None: no L2 known, every program's K/V re-read
    # reaches HBM (Dao 2022's count).
    l2_bytes: float | None = None
    cores: int = 0


@dataclass(frozen=True)
class FlashCost:
    """The fused kernel (`kernels.ATTENTION`) and flash-decoding's combine (`kernels.ATTN_COMBINE`,
    None when the cache is not split) of one layer, with the pair counts behind the FLOPs."""

    attention: KernelCost
    combine: KernelCost | None
    plan: FlashPlan
    exact_pairs: int  # (query, key) pairs the mask allows, over the batch, per query head
    computed_pairs: int  # pairs in the blocks the kernel computes (diagonal blocks whole)

    def kernels(self) -> list[KernelCost]:
        return [self.attention] + ([self.combine] if self.combine else [])


def _pow2_floor(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(x, 1)))))


def attention_shape(cfg: ModelConfig, phase: str) -> AttentionShape:
    """MHA/GQA/MQA as configured; MLA prefill as MHA over the up-projected keys (U + P) and values
    (W, compute dtype, as DeepSeek prefills); MLA absorbed decode as one latent KV head."""
    kv, a = cfg.kv_bytes_per_element, _act_bytes(cfg)
    if not cfg.is_mla:
        H, K = cfg.head_dim, cfg.num_kv_heads
        return AttentionShape(cfg.num_heads, K, H, H, 2 * H * kv)
    A, P, N = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.num_heads
    if phase == "decode" and cfg.mla_decode == "absorbed":
        return AttentionShape(N, 1, A + P, A, (A + P) * kv)
    return AttentionShape(N, N, cfg.head_dim, cfg.v_head_dim, (cfg.head_dim + cfg.v_head_dim) * a)


# An extend step of at most this many queries a sequence runs flash-decoding (the cache read
# once for all of them: MTP's or a draft's tokens, as vLLM routes requests of at most
# 1 + num_speculative_tokens queries to its decode kernels); a longer one (a chunk of a chunked
# prefill) runs prefill's block loop over the cache with the causal offset S - T.
DECODE_FORM_MAX_QUERIES = 16


def attention_form(cfg: ModelConfig, wl: Workload) -> str:
    """The kernel a step runs: prefill's block loop, or flash-decoding over the cache for decode
    and for an extend step's few queries (MLA's: FlashMLA over the latent, as DeepSeek decodes
    its multi-token-prediction queries; a longer MLA chunk: the block loop over keys and values
    expanded from the latents, as its chunked prefill runs; `kvjax.analytic.mla`)."""
    if wl.phase == "prefill":
        return "prefill"
    if wl.phase == EXTEND and wl.query_len > DECODE_FORM_MAX_QUERIES:
        return "prefill"
    if wl.phase == EXTEND and cfg.is_mla and cfg.mla_decode != "absorbed":
        return "prefill"  # naive MLA's extend expands the latents: MHA's block loop
    return "decode"


def plan(
    cfg: ModelConfig,
    wl: Workload,
    onchip_bytes: float | None = None,
    cores: int | None = None,
    block_q: int = 0,
    block_k: int = 0,
    splits: int = 0,
    l2_bytes: float | None = None,
) -> FlashPlan:
    """The kernel's tiles: given, or from the chip's on-chip memory per core (Dao 2022's rule),
    or 128 x 128 when neither is known; decode splits: given, or enough chunks of at least B_c
    positions that B * K * splits programs cover the chip's cores, rounded down to a power of
    two as kernels tile (one chunk without a chip)."""
    for field, value in (("block_q", block_q), ("block_k", block_k), ("splits", splits)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise KvjaxError(f"{field}={value!r} must be an integer >= 0 (0: derived)")
    shape = attention_shape(cfg, attention_form(cfg, wl))
    if onchip_bytes:
        elements = onchip_bytes / _act_bytes(cfg)
        derived_k = min(MAX_BLOCK, _pow2_floor(elements / (4 * shape.key_width)))
        derived_q = min(derived_k, _pow2_floor(shape.key_width))
    else:
        derived_q = derived_k = DEFAULT_BLOCK
    bq, bk = block_q or derived_q, block_k or derived_k
    positions = attended_positions(cfg, wl)
    if attention_form(cfg, wl) == "decode" and not splits:
        programs = wl.batch * shape.kv_heads
        want = math.ceil(cores / programs) if cores else 1
        splits = _pow2_floor(max(1, min(want, math.ceil(positions / bk))))  # as kernels tile
    # one head's K and V for every position in half the on-chip memory (the rest: Q, O, scores)
    kv_head_bytes = positions * (shape.key_width + shape.value_width) * _act_bytes(cfg)
    fits = bool(onchip_bytes) and kv_head_bytes <= onchip_bytes / 2
    return FlashPlan(bq, bk, splits or 1, kv_on_chip=fits, l2_bytes=l2_bytes, cores=cores or 0)


def plan_for_chip(cfg: ModelConfig, wl: Workload, chip=None, **tiles) -> FlashPlan:
    """`plan` with the chip's on-chip memory, cores and L2 (none known without a chip)."""
    return plan(
        cfg,
        wl,
        getattr(chip, "onchip_bytes_per_core", None),
        getattr(chip, "num_cores", None),
        l2_bytes=getattr(chip, "l2_bytes", None),
        **tiles,
    )


def hbm_kv_positions(
    T: int,
    S: int,
    flash: FlashPlan,
    group: int,
    kv_heads: int,
    kv_per_position: float,
    window: int = 0,
    sinks: int = 0,
    chunk: int = 0,
    causal: bool = True,
) -> tuple[float, str]:
    """Key positions of one KV head (of one sequence) that prefill reads from HBM, and which
    rule set it.

    - K/V on chip (a TPU's VMEM holds a head's): each key once.
    - No L2 known: every query head's query block re-reads its band (Dao 2022, Theorem 2:
      group x the block loop's loads).
    - With an L2 of capacity C (the GPU kernels FA2/FA3 run): the `cores` programs resident at
      once stream the same K/V blocks, so one wave reads each block of its band from HBM once
      for all its programs and the G query heads that share the KV head (they run side by side
      in the grid). A wave holds p = cores // G query blocks of a KV head: HBM loads the band
      of a query tile p x B_r rows tall. When the K/V of the KV heads resident at once also fit
      in half the L2 (the rest streams Q and O), the next wave finds them there: each key once.
    FlashAttention-3 on an H100 (50 MB L2) at S = 8192, H = 128: 4 MB per head, 2 or 3 heads
    live: each key once, so HBM sees Q, K, V and O once and the kernel is compute-bound."""
    bq, bk = flash.block_q, flash.block_k
    if chunk:  # the keys of the chunks the queries fall in, from the first one's start
        once = S - (S - T) // chunk * chunk
    else:  # one query tile of all T rows: the keys any query sees, in whole key blocks
        once = block_pairs(T, S, T, bk, window, sinks, 0, causal)[1]
    if flash.kv_on_chip:
        return once, "on chip"
    if not flash.l2_bytes or not flash.cores:
        return group * block_pairs(T, S, bq, bk, window, sinks, chunk, causal)[1], "per program"
    q_blocks = ceil_div(T, bq)
    live_heads = min(kv_heads, ceil_div(flash.cores, group * q_blocks) + 1)
    if live_heads * once * kv_per_position <= flash.l2_bytes / 2:
        return once, "L2 holds the heads' K/V"
    tile = max(1, flash.cores // group) * bq
    if chunk and chunk % tile:  # a wave's rows in whole chunks, or a divisor of one
        tile = chunk if tile >= chunk else math.gcd(tile, chunk)
    return block_pairs(T, S, min(tile, T), bk, window, sinks, chunk, causal)[1], "per wave"


def attended_positions(cfg: ModelConfig, wl: Workload, sliding: bool = False) -> int:
    """Key positions the last query attends: S, the window W of a sliding layer (and its sink
    tokens), or the keys of its own chunk in a chunked layer."""
    window = cfg.sliding_window if sliding else 0
    if window and cfg.chunked_attention:  # Llama 4: the keys of the query's own chunk
        return (wl.context - 1) % window + 1
    return min(wl.context, window + cfg.sink_tokens) if window else wl.context


def flash_attention_cost(
    cfg: ModelConfig, wl: Workload, flash: FlashPlan, sliding: bool = False, causal: bool = True
) -> FlashCost:
    """The fused attention of one layer (prefill or decode) under the plan `flash`; `causal`
    False: every query attends every key (an encoder's, or a benchmark's non-causal case).
    Decode with T > 1 queries a sequence (an extend step, MTP's or a draft's tokens) reads the
    cache once for all of them."""
    shape = attention_shape(cfg, attention_form(cfg, wl))
    window = cfg.sliding_window if sliding else 0
    chunk = window if window and cfg.chunked_attention else 0
    window = 0 if chunk else window
    B, N, Kh = wl.batch, shape.query_heads, shape.kv_heads
    Hk, Hv, a = shape.key_width, shape.value_width, _act_bytes(cfg)
    S, T = wl.context, wl.query_len
    per_pair = 2 * Hk + 2 * Hv
    sinks = cfg.sink_tokens if window else 0
    exact = B * (exact_pairs(T, S, window, sinks, chunk) if causal else T * S)
    q_bytes, o_bytes = B * T * N * Hk * a, B * T * N * Hv * a
    if attention_form(cfg, wl) == "prefill":
        bq, bk = flash.block_q, flash.block_k
        computed, _ = block_pairs(T, S, bq, bk, window, sinks, chunk, causal)
        computed *= B
        # Prefill K/V in the compute dtype (the projections' output; an extend's from the cache
        # as stored, with a 1-byte cache's scales; MLA's expanded from the latents), read from
        # HBM as `hbm_kv_positions` says: once, once per wave of resident programs, or once per
        # query block and query head.
        kv_per_position = (Hk + Hv) * a
        if wl.phase == EXTEND and not cfg.is_mla:
            kv_per_position = shape.kv_bytes_per_position + 2 * scale_bytes_per_row(cfg)
        positions, _ = hbm_kv_positions(
            T, S, flash, N // Kh, B * Kh, kv_per_position, window, sinks, chunk, causal
        )
        kv_read = B * Kh * positions * kv_per_position
        attention = KernelCost(
            kernels.ATTENTION,
            flops=N * computed * per_pair,
            bytes=q_bytes + kv_read + o_bytes,
            transcendentals=N * computed,
        )
        return FlashCost(attention + _sinks(cfg, B * T * N), None, flash, exact, computed)
    # the keys some query attends: the last query's (`attended_positions`) for one query; a
    # window's band widens by T - 1 for T queries
    positions = key_union(T, S, window, sinks, chunk)
    # read once for all G heads, with a 1-byte cache's per-row scales (token_head, group), as
    # the extend above and the unfused decode read them
    per_position = shape.kv_bytes_per_position + (0 if cfg.is_mla else 2 * scale_bytes_per_row(cfg))
    cache = B * Kh * positions * per_position
    partials = B * T * N * flash.splits * (Hv + 2) * SCORE_BYTES if flash.splits > 1 else 0
    # Flash-decoding's partials go to the combine kernel through the L2 when they fit in half
    # of it: HBM sees neither their write nor their read.
    spilled = partials if partials and partials > (flash.l2_bytes or 0) / 2 else 0
    computed = B * T * positions
    attention = KernelCost(
        kernels.ATTENTION,
        flops=N * computed * per_pair,
        bytes=q_bytes + cache + (spilled if partials else o_bytes),
        transcendentals=N * computed,
        kv_bytes=cache,
    )
    attention = attention + _sinks(cfg, B * T * N)
    combine = None
    if partials:  # rescale each split's output by exp(m_i - m), sum, divide by the summed l
        combine = KernelCost(
            kernels.ATTN_COMBINE,
            flops=B * T * N * flash.splits * (2 * Hv + 4),
            bytes=spilled + o_bytes,
            transcendentals=B * T * N * flash.splits,
        )
    return FlashCost(attention, combine, flash, exact, computed)


def _sinks(cfg: ModelConfig, rows: int) -> KernelCost:
    """gpt-oss's sink logits in a fused kernel: the N logits read, and per query row the sink
    in the running max and exp(sink - max) in the denominator (2 FLOPs, 1 exp)."""
    if not cfg.sink_logits:
        return KernelCost(kernels.ATTENTION, 0.0, 0.0)
    w = cfg.weight_bytes_per_element
    return KernelCost(
        kernels.ATTENTION,
        flops=2 * rows,
        bytes=cfg.num_heads * w,
        transcendentals=rows,
        weight_bytes=cfg.num_heads * w,
    )
