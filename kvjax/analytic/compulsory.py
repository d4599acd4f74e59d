"""The bound's count of a fused attention, for any implementation: exact pairs, each
input read once and each output written once (`kvjax.analytic.flash` is one plan's count)."""

from __future__ import annotations

from kvjax import kernels
from kvjax.analytic.costs import EXTEND, KernelCost, Workload
from kvjax.analytic.flash import _sinks, attention_form, attention_shape
from kvjax.analytic.keys import key_union
from kvjax.analytic.pairs import exact_pairs
from kvjax.analytic.primitives import _act_bytes
from kvjax.analytic.quant import scale_bytes_per_row
from kvjax.model.config import ModelConfig


def compulsory_cost(
    cfg: ModelConfig, wl: Workload, sliding: bool = False, causal: bool = True
) -> KernelCost:
    """The bound's count of one layer's attention, for any implementation: the (query, key)
    pairs the mask allows (`exact_pairs`, no tile rounding, no padded rows) at 2 H_k + 2 H_v
    FLOPs per query head, and each input read once and each output written once: Q, the K/V of
    the key positions some query attends (`key_union`; as the kernel takes them: the
    projections' output in the compute dtype for a prefill, the cache as stored with a 1-byte
    cache's scales for decode and extend) and O. No re-read, no split partials: a kernel of any
    tile, schedule or split count does at least this (`flash_attention_cost` is one plan's
    count, never below it)."""
    form = attention_form(cfg, wl)
    shape = attention_shape(cfg, form)
    window = cfg.sliding_window if sliding else 0
    chunk = window if window and cfg.chunked_attention else 0
    window = 0 if chunk else window
    sinks = cfg.sink_tokens if window else 0
    B, N, Kh = wl.batch, shape.query_heads, shape.kv_heads
    Hk, Hv, a = shape.key_width, shape.value_width, _act_bytes(cfg)
    S, T = wl.context, wl.query_len
    pairs = B * (exact_pairs(T, S, window, sinks, chunk) if causal else T * S)
    if form == "prefill":
        per_position = (Hk + Hv) * a
        if wl.phase == EXTEND and not cfg.is_mla:
            per_position = shape.kv_bytes_per_position + 2 * scale_bytes_per_row(cfg)
    else:
        per_position = shape.kv_bytes_per_position + (
            0 if cfg.is_mla else 2 * scale_bytes_per_row(cfg)
        )
    kv = B * Kh * key_union(T, S, window, sinks, chunk, causal) * per_position
    q_bytes, o_bytes = B * T * N * Hk * a, B * T * N * Hv * a
    cost = KernelCost(
        kernels.ATTENTION,
        flops=N * pairs * (2 * Hk + 2 * Hv),
        bytes=q_bytes + kv + o_bytes,
        transcendentals=N * pairs,
        kv_bytes=kv,
    )
    return cost + _sinks(cfg, B * T * N)
