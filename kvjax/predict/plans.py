"""What a kernel's own plan adds to its prediction, never to its bound: a block loop's pipeline
fill, and a decode kernel's schedule (its programs, the query rows its tiles compute, the
busiest core's walk: `kvjax.predict.implementations`), for a corpus row as its implementation
plans it and for a model's step as kvjax's plan (`kvjax.analytic.flash.plan`) runs it."""

from __future__ import annotations

import math

from kvjax.analytic import flash
from kvjax.analytic.costs import Workload
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig
from kvjax.predict import implementations
from kvjax.predict.corpus import Row

MMA_ROWS = 64  # the rows of one tensor-core tile kvjax's decode plan packs its query rows into


def pipeline_fill(cost: flash.FlashCost, batch: int, queries: int) -> float:
    """(n + 1) / n: the compute term's stretch for a block loop whose programs each run n key
    blocks (on average; a causal band's are shorter). Its software pipeline has two stages (the
    next K/V block's load beside the current block's matmuls and softmax, as FlashAttention-2
    and -3 and cuDNN run it), and n blocks through a two-stage pipeline take n + 1 stage times:
    the first block's load is waited for and the last block's O written after it. A constant of
    the structure, not fitted: a sequence of 512 in 128-key blocks pays 1/4 more, one of 16,384
    1/128; n counts whole tiles of pairs, so a program of less than one tile (a short sequence's
    partial block) pays its one stage twice, 2 at most."""
    plan = cost.plan
    programs = batch * math.ceil(queries / plan.block_q)  # per query head
    blocks = cost.computed_pairs / (plan.block_q * plan.block_k)
    return 1.0 + min(1.0, programs / blocks) if blocks > 0 else 1.0


def attention_fill(cfg: ModelConfig, wl: Workload, chip: ChipSpec) -> float:
    """`pipeline_fill` of a step's fused attention where it runs prefill's block loop (its
    full-attention layers' plan), 1 where it runs flash-decoding (a memory-bound split whose
    loads the pipeline overlaps)."""
    if flash.attention_form(cfg, wl) != "prefill":
        return 1.0
    plan = flash.plan_for_chip(cfg, wl, chip)
    return pipeline_fill(flash.flash_attention_cost(cfg, wl, plan), wl.batch, wl.query_len)


def decode_schedule(row: Row, cfg: ModelConfig, T: int, chip: ChipSpec):
    """The schedule the row's implementation plans (`implementations.schedule`; None: no rule
    names it)."""
    shape = flash.attention_shape(cfg, "decode")
    dshape = implementations.DecodeShape(
        row.batch,
        T,
        shape.query_heads,
        shape.kv_heads,
        shape.key_width,
        row.seq_kv,
        row.dtype,
        row.values.get("page_size") or 0,
    )
    return implementations.schedule(row.implementation, dshape, chip.num_cores or 1)


def kvjax_schedule(
    cfg: ModelConfig, wl: Workload, tiles: flash.FlashPlan, T: int, sliding: bool = False
):
    """kvjax's own plan (`flash.plan`) as a schedule: B x K x splits programs, a KV head's G x T
    query rows packed into 64-row tiles, each split a ceil(blocks / splits) walk over the key
    blocks the last query attends (a sliding layer's window)."""
    shape = flash.attention_shape(cfg, "decode")
    blocks = math.ceil(flash.attended_positions(cfg, wl, sliding) / tiles.block_k)
    heads = wl.batch * shape.kv_heads
    return implementations.Schedule(
        implementations.KVJAX,
        heads * tiles.splits,
        tiles.splits,
        MMA_ROWS,
        shape.query_heads // shape.kv_heads * T,
        tiles.block_k,
        math.ceil(blocks / tiles.splits),
        heads * blocks,
    )


def attention_stretch(cfg: ModelConfig, wl: Workload, chip: ChipSpec) -> float:
    """The busiest core's walk over the mean core's (`Schedule.stretch`) for a step's fused
    attention where it runs flash-decoding, in kvjax's plan on the chip's cores (what the
    `attention_decode` class was fitted with, each row in its own implementation's); 0 where it
    runs prefill's block loop (the class's waves of tiles are not counted inside a step)."""
    if flash.attention_form(cfg, wl) != "decode":
        return 0.0
    tiles = flash.plan_for_chip(cfg, wl, chip)
    return kvjax_schedule(cfg, wl, tiles, wl.query_len).stretch(chip.num_cores or 1)
