"""Each decode kernel's own schedule, read from its code: the programs it launches and their work.

A published decode row ran one implementation, and that implementation, not kvjax, chose how
many programs (CTAs) to launch, how many query rows a tile packs and how much of the cache each
program walks. `schedule(text, shape, cores)` returns that choice for a row's `implementation`
text, its shape and its chip's cores (SMs), as the implementation's own split rule makes it:

- `flash-attention-2` (and Flash-Decoding, its split-KV path of 2023): `num_splits_heuristic`:
  no split once the batch x heads x query-blocks fill 0.8 of the SMs it is told of, else the
  smallest eligible split within 0.85 of the best wave efficiency; told `multiProcessorCount`
  before v2.5.7 and twice that since (its kernels run two programs an SM). Query length 1 with
  GQA is reshaped so a KV head's query heads are the rows of one 64-row tile.
- `flash-attention-3`: the same efficiency rule on the SM count (no eligibility filter, nothing
  split below 5 key blocks), 128-row query tiles, 176-key blocks (128 paged without TMA, 224 in
  fp8), the GQA group packed into the rows when split.
- `flashmla`: persistent: SMs / KV heads / query tiles parts, each a payload of
  ceil(blocks / parts) + 5 blocks (5: its fixed cost a request), filled greedily request by
  request; one wave by construction.
- `flashinfer-tc` (FlashInfer's decode on its tensor-core prefill kernel): a grid of at most 2
  programs an SM; the KV split only where the batch leaves room, in the smallest chunk (>= 128
  tokens) that fits; 16-row query tiles for a packed length <= 16, 64 to 64, 128 beyond.

Each entry cites the lines it comes from (`Rule.cites`: `owner/repo@commit:path:line`) and holds
no fitted number. What the model reads of a schedule (`Schedule.stretch`, `Schedule.padding`):
the busiest core's share of the cache walk over the mean core's (a core walks its programs'
blocks in turn: the waves, the last wave's idle cores, a split's ragged tail, a persistent
part's fixed cost), on the memory side as on the compute side; and the query rows a tile
computes over those it needs. A row whose implementation no rule names takes kvjax's own plan
(`kvjax.analytic.flash.plan`: power-of-two splits until the programs cover the cores), and its
schedule says so (`implementation == KVJAX`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from kvjax.errors import KvjaxError

KVJAX = "kvjax"  # no rule names the row's implementation: kvjax's own plan
FA = "Dao-AILab/flash-attention"
FA_HEAD = f"{FA}@0251105a2fb19d2957484b7f023cd8c115286ced"
FA_V232 = f"{FA}@7f31e7c16a58227e04e0a7aed9ca0066ec8126fe"  # v2.3.2 (2023-10-08)
FA_V256 = f"{FA}@f692b98d805850983f14deec7a9104583c58b107"  # last before 2 x SMs (v2.5.6)
FLASHMLA = "deepseek-ai/FlashMLA@9241ae3ef9bac614dd25e45e507e089f888280e0"
FLASHMLA_0 = "deepseek-ai/FlashMLA@414a2f3eedeb5ad3c4a6e89d8641e059519cacc9"
FLASHINFER = "flashinfer-ai/flashinfer@fb28d7242b3506a2348265962041acc1fb56cca4"


@dataclass(frozen=True)
class DecodeShape:
    """What a decode kernel's planner sees: the batch, queries a sequence, heads, the key width,
    the cache's length, the KV dtype, and whether the cache is paged (and its page)."""

    batch: int
    queries: int
    query_heads: int
    kv_heads: int
    head_dim: int
    seq_kv: int
    dtype: str = "bf16"
    page_size: int = 0  # 0: contiguous (or not stated)

    @property
    def group(self) -> int:
        return self.query_heads // self.kv_heads


@dataclass(frozen=True)
class Schedule:
    """One launch as its implementation plans it: its programs, each program's query rows and
    cache blocks, and the busiest program's walk."""

    implementation: str  # the rule's key, or KVJAX
    programs: int  # programs (CTAs) launched, empty ones included
    splits: int  # chunks of one sequence's cache (1: not split)
    block_m: int  # query rows a tile computes
    rows: int  # query rows a tile needs (a KV head's packed queries, or one head's)
    block_n: int  # keys a cache block
    busiest_blocks: float  # cache blocks the busiest program walks (+ a persistent fixed cost)
    total_blocks: float  # cache blocks every program walks together
    persistent: bool = False
    compute_dtype: str = ""  # the inner products' dtype ("": the row's)
    resident: int = 1  # programs a core the rule plans for (its split rule's SM multiple)

    def stretch(self, cores: int) -> float:
        """The busiest core's walk over the mean core's (>= 1 up to ragged rounding): a core
        runs ceil(programs / cores) programs in turn."""
        if self.total_blocks <= 0 or cores <= 0:
            return 1.0
        per_core = math.ceil(self.programs / cores) * self.busiest_blocks
        return max(1.0, per_core * cores / self.total_blocks)

    @property
    def padding(self) -> float:
        """Query rows a tile computes over the rows it needs (>= 1)."""
        return math.ceil(self.rows / self.block_m) * self.block_m / self.rows


@dataclass(frozen=True)
class Rule:
    """An implementation's planner: the rows it covers (`pattern` on the row's `implementation`
    text), what it plans for a shape on a chip of `cores` SMs, and where it is written."""

    key: str
    pattern: str
    plan: Callable[[DecodeShape, int], Schedule]
    cites: tuple[str, ...]
    version: str


def wave_split(bnm: int, sms: int, blocks: int, max_splits: int, eligible_only: bool) -> int:
    """FlashAttention's split rule: the smallest split whose wave efficiency (programs over
    whole waves of `sms`) is within 0.85 of the best; FA2 skips a split that walks as many
    blocks per split as one fewer (`eligible_only`)."""
    cap = min(max_splits, sms, blocks)
    effs = []
    for s in range(1, cap + 1):
        ok = s == 1 or math.ceil(blocks / s) != math.ceil(blocks / (s - 1))
        waves = bnm * s / sms
        effs.append(waves / math.ceil(waves) if ok or not eligible_only else 0.0)
    best = max(effs)
    return next((s for s, e in enumerate(effs, 1) if e >= 0.85 * best), 1)


def _split_schedule(
    key, s: DecodeShape, splits, block_m, rows, block_n, m_blocks, dtype="", resident=1
):
    blocks = math.ceil(s.seq_kv / block_n)
    per_split = math.ceil(blocks / splits)
    heads = s.kv_heads if rows > s.queries else s.query_heads
    programs = s.batch * heads * m_blocks * splits
    return Schedule(
        key,
        programs,
        splits,
        block_m,
        rows,
        block_n,
        per_split,
        s.batch * heads * m_blocks * blocks,
        compute_dtype=dtype,
        resident=resident,
    )


def _fa2(key: str, sms_factor: int) -> Callable[[DecodeShape, int], Schedule]:
    """FA2's split-KV planner, told `sms_factor` x the SMs (2 since v2.5.7: two programs an SM)."""

    def plan(s: DecodeShape, cores: int) -> Schedule:
        block_n = 256 if s.head_dim <= 64 else 128 if s.head_dim <= 128 else 64
        swapped = s.queries == 1 and s.group > 1
        rows = s.group if swapped else s.queries  # the swap: a KV head's heads are the rows
        m_blocks = math.ceil(rows / 64)
        heads = s.kv_heads if swapped else s.query_heads
        bnm = s.batch * heads * m_blocks
        sms = cores * sms_factor
        blocks = math.ceil(s.seq_kv / block_n)
        splits = 1 if bnm >= 0.8 * sms else wave_split(bnm, sms, blocks, 128, True)
        return _split_schedule(key, s, splits, 64, rows, block_n, m_blocks, "", sms_factor)

    return plan


def _fa3(s: DecodeShape, cores: int) -> Schedule:
    fp8 = s.dtype == "fp8"
    paged_no_tma = s.page_size not in (0, None) and s.page_size % 128 != 0
    block_n = 224 if fp8 else 128 if paged_no_tma else 176
    blocks = math.ceil(s.seq_kv / block_n)
    m_blocks = math.ceil(s.queries * s.group / 128)  # planned as packed
    total = s.batch * s.kv_heads * m_blocks
    if total >= 0.8 * cores or blocks <= 4:
        splits = 1  # (a KV head over 50 MB at a full grid splits too: no decode row reaches it)
    else:
        splits = wave_split(total, cores, blocks, 128, False)
    pack = s.group > 1 and (splits > 1 or paged_no_tma or _fa3_packs(s.queries, s.group))
    rows = s.queries * s.group if pack else s.queries
    m_blocks = math.ceil(rows / 128)
    return _split_schedule("flash-attention-3", s, splits, 128, rows, block_n, m_blocks, s.dtype)


def _fa3_packs(q: int, g: int) -> bool:
    def up(x):
        return math.ceil(x / 128) * 128

    return q / up(q) < 0.9 * (q * g) / up(q * g)


def _flashmla(s: DecodeShape, cores: int) -> Schedule:
    rows = s.queries * s.group
    m_blocks = math.ceil(rows / 64)
    parts = max(1, cores // s.kv_heads // m_blocks)
    per_request = math.ceil(s.seq_kv / 64)
    overhead = 5
    payload = math.ceil(s.batch * (per_request + overhead) / parts) + overhead
    busiest, left, pieces = 0.0, [per_request] * s.batch, [0] * s.batch
    part, i = 0, 0
    while i < s.batch and part < parts:  # the greedy fill, request by request
        remain, part_load = payload, 0.0
        while i < s.batch:
            if remain >= left[i] + overhead:  # the rest of request i
                remain -= left[i] + overhead
                part_load += left[i] + overhead
                pieces[i] += 1
                i += 1
            else:  # a piece of it, and the part is full
                take = remain - overhead
                if take > 0:
                    left[i] -= take
                    part_load += take + overhead
                    pieces[i] += 1
                break
        busiest = max(busiest, part_load)
        part += 1
    programs = m_blocks * s.kv_heads * parts
    total = m_blocks * s.kv_heads * s.batch * per_request
    return Schedule(
        "flashmla",
        programs,
        max(pieces),
        64,
        rows,
        64,
        busiest,  # every query tile and KV head of a part walks the part's blocks
        total,
        persistent=True,
        compute_dtype="bf16",
        resident=1,  # __launch_bounds__(256, 1, 1): one part an SM
    )


def _flashinfer_tc(s: DecodeShape, cores: int) -> Schedule:
    packed = s.queries * s.group
    tile = 128 if packed > 64 else 64 if packed > 16 else 16
    q_tiles = math.ceil(packed / tile)
    cap = 2 * cores // s.kv_heads  # max_batch_size_if_split
    page = s.page_size or 1
    pages = math.ceil(s.seq_kv / page)
    lo = max(128 // page, 1)
    chunk = pages  # the smallest chunk (in pages) whose work items fit the grid, else unsplit
    for c in range(lo, pages + 1):
        if s.batch * q_tiles * math.ceil(pages / c) <= cap:
            chunk = c
            break
    splits = math.ceil(pages / chunk)
    tokens = chunk * page
    programs = s.batch * q_tiles * splits * s.kv_heads
    return Schedule(
        "flashinfer-tc",
        programs,
        splits,
        tile,
        packed,
        tokens,
        1.0,
        s.batch * q_tiles * s.kv_heads * s.seq_kv / tokens,
        compute_dtype="bf16" if s.dtype == "fp8" else s.dtype,  # fp8 KV dequantized to 16 bits
        resident=2,  # PrefillPlan's num_blocks_per_sm
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "flash-attention-3",
        r"FlashAttention-3",
        _fa3,
        (
            f"{FA_HEAD}:hopper/heuristics.h:25",
            f"{FA_HEAD}:hopper/heuristics.h:9",
            f"{FA_HEAD}:hopper/flash_api.cpp:442",
            f"{FA_HEAD}:hopper/tile_size.h:31",
            f"{FA_HEAD}:hopper/tile_scheduler.hpp:66",
        ),
        "HEAD",
    ),
    Rule(
        "flash-decoding",
        r"^Flash-Decoding$",
        _fa2("flash-decoding", 1),
        (
            f"{FA_V232}:csrc/flash_attn/flash_api.cpp:212",
            f"{FA_V232}:csrc/flash_attn/flash_api.cpp:1098",
        ),
        "2.3.2 (the release of the blog's week)",
    ),
    Rule(
        "flash-attention-2.5",
        r"FlashAttention-2\.5\b",
        _fa2("flash-attention-2.5", 1),
        (
            f"{FA_V256}:csrc/flash_attn/flash_api.cpp:235",
            f"{FA_V256}:csrc/flash_attn/flash_api.cpp:285",
        ),
        "2.5.0-2.5.6: told multiProcessorCount",
    ),
    Rule(
        "flash-attention-2",
        r"FlashAttention-2\b",
        _fa2("flash-attention-2", 2),
        (
            f"{FA_HEAD}:csrc/flash_attn/flash_api.cpp:281",
            f"{FA_HEAD}:csrc/flash_attn/flash_api.cpp:335",
            f"{FA_HEAD}:csrc/flash_attn/flash_api.cpp:1319",
        ),
        ">= 2.5.7: told 2 x multiProcessorCount",
    ),
    Rule(
        "flashmla",
        r"FlashMLA",
        _flashmla,
        (
            f"{FLASHMLA}:csrc/api/dense_decode.h:78",
            f"{FLASHMLA}:csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu:62",
            f"{FLASHMLA}:csrc/sm90/decode/dense/splitkv_mla.cuh:1339",
            f"{FLASHMLA_0}:csrc/flash_api.cpp:38",
        ),
        "HEAD (the same rule since the first commit)",
    ),
    Rule(
        "flashinfer-tc",
        r"FlashInfer \(tensor core\)",
        _flashinfer_tc,
        (
            f"{FLASHINFER}:include/flashinfer/attention/scheduler.cuh:788",
            f"{FLASHINFER}:include/flashinfer/attention/scheduler.cuh:101",
            f"{FLASHINFER}:include/flashinfer/utils.cuh:408",
        ),
        "HEAD",
    ),
)
BY_KEY = {r.key: r for r in RULES}


def rule_for(text: str | None) -> Rule | None:
    """The rule whose pattern a row's `implementation` text matches first (None: no rule)."""
    for rule in RULES:
        if re.search(rule.pattern, text or ""):
            return rule
    return None


def schedule(text: str | None, shape: DecodeShape, cores: int) -> Schedule | None:
    """The schedule the row's implementation plans on a chip of `cores` SMs (None: no rule
    names it; the caller takes kvjax's plan)."""
    for field in ("batch", "queries", "query_heads", "kv_heads", "seq_kv"):
        if getattr(shape, field) < 1:
            raise KvjaxError(f"{field}={getattr(shape, field)} must be >= 1")
    if shape.query_heads % shape.kv_heads:
        raise KvjaxError(
            f"num_heads={shape.query_heads} is not divisible by num_kv_heads={shape.kv_heads}"
        )
    rule = rule_for(text)
    return rule.plan(shape, max(1, cores)) if rule else None
