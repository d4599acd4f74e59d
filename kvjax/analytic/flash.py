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
from kvjax.analytic.costs import SCORE_BYTES, KernelCost, Workload
from kvjax.analytic.primitives import _act_bytes
from kvjax.config import ModelConfig
from kvjax.errors import KvjaxError

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


def plan(
    cfg: ModelConfig, wl: Workload, onchip_bytes: float | None = None, cores: int | None = None,
    block_q: int = 0, block_k: int = 0, splits: int = 0,
) -> FlashPlan:  # fmt: skip
    """The kernel's tiles: given, or from the chip's on-chip memory per core (Dao 2022's rule),
    or 128 x 128 when neither is known; decode splits: given, or enough chunks of at least B_c
    positions that B * K * splits programs cover the chip's cores, rounded down to a power of
    two as kernels tile (one chunk without a chip)."""
    for field, value in (("block_q", block_q), ("block_k", block_k), ("splits", splits)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise KvjaxError(f"{field}={value!r} must be an integer >= 0 (0: derived)")
    shape = attention_shape(cfg, wl.phase)
    if onchip_bytes:
        elements = onchip_bytes / _act_bytes(cfg)
        derived_k = min(MAX_BLOCK, _pow2_floor(elements / (4 * shape.key_width)))
        derived_q = min(derived_k, _pow2_floor(shape.key_width))
    else:
        derived_q = derived_k = DEFAULT_BLOCK
    bq, bk = block_q or derived_q, block_k or derived_k
    positions = attended_positions(cfg, wl)
    if wl.phase == "decode" and not splits:
        programs = wl.batch * shape.kv_heads
        want = math.ceil(cores / programs) if cores else 1
        splits = _pow2_floor(max(1, min(want, math.ceil(positions / bk))))  # as kernels tile
    # one head's K and V for every position in half the on-chip memory (the rest: Q, O, scores)
    kv_head_bytes = positions * (shape.key_width + shape.value_width) * _act_bytes(cfg)
    fits = bool(onchip_bytes) and kv_head_bytes <= onchip_bytes / 2
    return FlashPlan(bq, bk, splits or 1, kv_on_chip=fits)


def attended_positions(cfg: ModelConfig, wl: Workload, sliding: bool = False) -> int:
    """Key positions the last query attends: S, or the window W of a sliding layer (and its
    sink tokens)."""
    window = cfg.sliding_window if sliding else 0
    return min(wl.context, window + cfg.sink_tokens) if window else wl.context


def exact_pairs(T: int, S: int, window: int = 0, sinks: int = 0) -> int:
    """Causal (query, key) pairs for T queries at the end of S positions: query t (0-based among
    S - T + t) sees S - T + t + 1 keys, at most `window`, plus the `sinks` first keys below its
    window. T(T+1)/2 when T = S, no window."""
    first = S - T + 1  # keys seen by the first query
    if not window or window >= S:
        return T * first + T * (T - 1) // 2
    return sum(min(first + t, window) + max(0, min(sinks, first + t - window))
               for t in range(T))  # fmt: skip


def block_pairs(
    T: int, S: int, bq: int, bk: int, window: int = 0, sinks: int = 0
) -> tuple[int, int]:
    """(pairs computed, key positions loaded summed over query blocks) of a block loop: a
    (query block, key block) tile is computed whole when any of its pairs is unmasked; the
    sinks' blocks join every query block's band."""
    pairs = loaded = 0
    offset = S - T
    sink_blocks = set(range((sinks - 1) // bk + 1)) if sinks and window else set()
    for q0 in range(0, T, bq):
        rows = min(bq, T - q0)
        hi = offset + q0 + rows - 1  # last key the block's last query sees
        lo = max(0, offset + q0 - window + 1) if window else 0  # first key its first query sees
        blocks = set(range(lo // bk, hi // bk + 1)) | {b for b in sink_blocks if b * bk <= hi}
        keys = sum(min(bk, S - b * bk) for b in blocks)
        pairs += rows * keys
        loaded += keys
    return pairs, loaded


def flash_attention_cost(
    cfg: ModelConfig, wl: Workload, flash: FlashPlan, sliding: bool = False
) -> FlashCost:
    """The fused attention of one layer (prefill or decode) under the plan `flash`."""
    shape = attention_shape(cfg, wl.phase)
    window = cfg.sliding_window if sliding else 0
    B, N, Kh = wl.batch, shape.query_heads, shape.kv_heads
    Hk, Hv, a = shape.key_width, shape.value_width, _act_bytes(cfg)
    S, T = wl.context, wl.query_len
    per_pair = 2 * Hk + 2 * Hv
    sinks = cfg.sink_tokens if window else 0
    exact = B * exact_pairs(T, S, window, sinks)
    q_bytes, o_bytes = B * T * N * Hk * a, B * T * N * Hv * a
    if wl.phase == "prefill" and window and cfg.chunked_attention:
        raise KvjaxError(
            "attention_kernel='flash' prefill over chunked layers (chunked_attention) is not "
            "modelled (its tiles follow a sliding band); use attention_kernel='xla'"
        )
    if wl.phase == "prefill":
        computed, loaded = block_pairs(T, S, flash.block_q, flash.block_k, window, sinks)
        computed *= B
        # Prefill K/V in the compute dtype (the projections' output); the loop walks every
        # query head (FA2), re-reading each KV head's blocks once per query block and head.
        kv_per_position = (Hk + Hv) * a
        if flash.kv_on_chip:
            kv_read = B * Kh * S * kv_per_position
        else:
            kv_read = B * N * loaded * kv_per_position
        attention = KernelCost(
            kernels.ATTENTION, flops=N * computed * per_pair,
            bytes=q_bytes + kv_read + o_bytes, transcendentals=N * computed,
        )  # fmt: skip
        return FlashCost(attention + _sinks(cfg, B * T * N), None, flash, exact, computed)
    positions = attended_positions(cfg, wl, sliding)
    cache = B * Kh * positions * shape.kv_bytes_per_position  # read once for all G heads
    partials = B * N * flash.splits * (Hv + 2) * SCORE_BYTES if flash.splits > 1 else 0
    computed = B * positions
    attention = KernelCost(
        kernels.ATTENTION, flops=N * computed * per_pair,
        bytes=q_bytes + cache + (partials if partials else o_bytes),
        transcendentals=N * computed, kv_bytes=cache,
    )  # fmt: skip
    attention = attention + _sinks(cfg, B * N)
    combine = None
    if partials:  # rescale each split's output by exp(m_i - m), sum, divide by the summed l
        combine = KernelCost(
            kernels.ATTN_COMBINE, flops=B * N * flash.splits * (2 * Hv + 4),
            bytes=partials + o_bytes, transcendentals=B * N * flash.splits,
        )  # fmt: skip
    return FlashCost(attention, combine, flash, exact, computed)


def _sinks(cfg: ModelConfig, rows: int) -> KernelCost:
    """gpt-oss's sink logits in a fused kernel: the N logits read, and per query row the sink
    in the running max and exp(sink - max) in the denominator (2 FLOPs, 1 exp)."""
    if not cfg.sink_logits:
        return KernelCost(kernels.ATTENTION, 0.0, 0.0)
    w = cfg.weight_bytes_per_element
    return KernelCost(
        kernels.ATTENTION, flops=2 * rows, bytes=cfg.num_heads * w, transcendentals=rows,
        weight_bytes=cfg.num_heads * w,
    )  # fmt: skip
