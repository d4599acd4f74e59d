"""Closed forms of an MHA/GQA/MQA attention layer's kernels, projections to o_proj, in the order
kvjax's model runs them (`kvjax.nn.attention`): the projections, their norms and RoPE, the
cache's write, the scores, the softmax and a.v, each derived from the model's dataflow in the
phase it runs (decode, prefill, extend); the trace in `kvjax.traced` is the judge. Pure Python.
Letters: `kvjax.kernels`.

Decode attends S positions: C = S - 1 read from the cache plus the new token's own k, v (kvjax's
model attends the read-only cache and the new row separately, and appends the row afterwards).

A sliding layer (window W > 0) holds min(S - 1, W) rows in decode: once it holds W it rolls
(token t in slot t mod W), reads all W slots and masks the one holding the token W back: the
scores and av of C = W rows, plus the mask's 2BW compares and a jnp.remainder (7 ops per
position and 3 on the divisor), which the write's slot t mod W costs again. In prefill its mask
is banded (5 more ops per T x S entry: a second tril, its negation, the and) when W < T, and a
prompt longer than the window fills the rolling buffer by a gather (per slot: 10 ops of index
arithmetic and two gathers' 6 bounds checks each; a select per gathered element; 3 on the
divisor).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvjax import kernels
from kvjax.analytic.costs import EXTEND, SCORE_BYTES, KernelCost, Workload
from kvjax.analytic.primitives import (
    _act_bytes,
    _matmul,
    _rmsnorm,
    decode_softmax,
    extend_softmax,
    l2_norm_cost,
    prefill_softmax,
    rope_cost,
    sink_logits_cost,
    softcap_cost,
    temperature_cost,
)
from kvjax.analytic.quant import dequantize_cost, quantize_flops, scale_bytes_per_row
from kvjax.model.config import ModelConfig


@dataclass(frozen=True)
class _Layer:
    """One attention layer's sizes in a step: the workload's B, T and S (S the slots read where
    a sliding layer rolls), the window and its sinks, and the bytes of weights, activations
    and cache entries."""

    B: int
    T: int
    S: int
    window: int
    sinks: int
    rolling: bool
    w: float
    a: float
    kv: float

    @property
    def span(self) -> int:  # a rolling layer's slots
        return self.window + self.sinks


def _layer(cfg: ModelConfig, wl: Workload, window: int) -> _Layer:
    B, T, S = wl.batch, wl.query_len, wl.context
    sinks = cfg.sink_tokens if window else 0  # a sliding layer's kept first tokens
    span = window + sinks
    rolling = bool(window) and (S - 1 if wl.phase == "decode" else S + 1) >= span
    if wl.phase == "decode" and rolling:
        S = span + 1  # the W (+ sink) slots read and the new token
    w, a, kv = cfg.weight_bytes_per_element, _act_bytes(cfg), cfg.kv_bytes_per_element
    return _Layer(B, T, S, window, sinks, rolling, w, a, kv)


def gqa_attention_kernels(
    cfg: ModelConfig, wl: Workload, window: int = 0, sliding: bool = False, rope: bool = True
) -> list[KernelCost]:
    """The attention kernels of an MHA/GQA/MQA layer, projections to o_proj, in execution order
    (`window`: a sliding layer's W; `rope` False: a NoPE layer)."""
    L = _layer(cfg, wl, window)
    M = L.B * L.T
    k = projection_kernels(cfg, M, L, sliding, rope)
    if wl.phase == "decode":
        kv_write, scores, softmax, av = _decode_attention(cfg, L)
    elif wl.phase == EXTEND:
        kv_write, scores, softmax, av = extend_attention(cfg, wl)
    else:
        kv_write, scores, softmax, av = _prefill_attention(cfg, L)
    N, H = cfg.num_heads, cfg.head_dim
    o_proj = _matmul(kernels.O_PROJ, M, N * H, cfg.d_model, L.w, L.a, bias=cfg.o_bias)
    if cfg.attn_output_gate:
        from kvjax.analytic.hybrid import attn_gate_cost

        return [*k, kv_write, scores, softmax, av, attn_gate_cost(cfg, M), o_proj]
    return [*k, kv_write, scores, softmax, av, o_proj]


def projection_kernels(
    cfg: ModelConfig, M: int, L: _Layer, sliding: bool, rope: bool
) -> list[KernelCost]:
    """q, k and v projected (q with Qwen3-Next's output gate), their norms (OLMo 2's over the
    whole projection, Qwen3's and Gemma 3's per head) and RoPE (or Llama 4's temperature on its
    NoPE layers)."""
    D, N, K, H = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    w, a = L.w, L.a
    gate = 2 if cfg.attn_output_gate else 1  # Qwen3-Next: q_proj also emits the output gate
    k = [
        _matmul(kernels.Q_PROJ, M, D, gate * N * H, w, a, bias=cfg.qkv_bias),
        _matmul(kernels.K_PROJ, M, D, K * H, w, a, bias=cfg.qkv_bias),
        _matmul(kernels.V_PROJ, M, D, K * H, w, a, bias=cfg.qkv_bias),
    ]
    if cfg.qk_norm_full:  # OLMo 2: q normed over its N*H, k over its K*H (their own scales)
        q_norm, k_norm = (_rmsnorm(kernels.QK_NORM, M, n * H, w, a) for n in (N, K))
        k.append(q_norm + k_norm)
    elif cfg.qk_norm:  # every q and k head normed over H: M*(N + K) rows, two scale vectors
        k.append(_rmsnorm(kernels.QK_NORM, M * (N + K), H, w, a, cfg.norm_plus_one, weights=2))
    scaled = cfg.rope_linear_factor != 1.0 and not (sliding and cfg.rope_local_theta)
    if rope:  # a NoPE layer (SmolLM3, Llama 4) rotates nothing
        width = cfg.rope_width
        table = cfg.rope_table(sliding)
        af = table and cfg.rope_attention_factor != 1.0
        cost = rope_cost(M, N + K, width, a, scaled, table, af)
        if width < H:  # partial rotary: the rotated part and the rest joined again (a concat)
            cost = cost + KernelCost(kernels.ROPE, 0.0, 2 * M * (N + K) * H * a)
        k.append(cost)
        if cfg.qk_l2_norm:  # Llama 4: after RoPE, unscaled
            k.append(l2_norm_cost(M * (N + K), H, a))
    elif cfg.temperature_floor:  # Llama 4's NoPE layers
        k.append(temperature_cost(M, N * H, a))
    return k


def _decode_attention(cfg: ModelConfig, L: _Layer) -> list[KernelCost]:
    """A decode step's write of the new row and its attention over the cache and itself."""
    B, S, span = L.B, L.S, L.span
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    R = B * N  # attention rows (one per query head per sequence) per query position
    a, kv = L.a, L.kv
    widen_kv = kv != a  # cache entries converted to the compute dtype before the products
    scales = cfg.kv_scale_kind  # a 1-byte cache's: quantized on write, dequantized on read
    scale_row = scale_bytes_per_row(cfg)  # a K or V row's scales (token_head, group)
    C = S - 1  # key rows read by the product over the cache
    # Per layer two scatters (K and V) of B rows at (b, pos[b]); wrapping negative indices
    # costs 3 ops per index per scatter: 6B for pos, and 6B for b unless B = 1 (a constant).
    # the slot, t mod W; with sinks t below s, else s + (t - s) mod W: 4 more ops a sequence
    remainder = (7 * B + 3 + (4 * B if L.sinks else 0)) if L.rolling else 0
    # token_head scales: two more scatters, their indices wrapped alike
    scale_index = (6 * B + (6 * B if B > 1 else 0)) if scales == "token_head" else 0
    kv_write = KernelCost(
        kernels.KV_WRITE,
        flops=6 * B
        + (6 * B if B > 1 else 0)
        + (2 * B * K * H if widen_kv else 0)
        + remainder
        + quantize_flops(cfg, B * K * H, B * K, a)
        + scale_index,
        bytes=2 * B * K * H * (a + kv) + 2 * B * K * scale_row,
        kv_bytes=2 * B * K * H * kv + 2 * B * K * scale_row,
    )
    cache_rows = B * K * C * H  # elements of K (or V) read from the cache
    dq_flops, dq_bytes = dequantize_cost(cfg, cache_rows, B * K * C, a)
    convert = (cache_rows if widen_kv else 0) + dq_flops
    convert_bytes = (cache_rows * (kv + a) if widen_kv else 0) + dq_bytes
    # scores: q . K_cache (f32 out) and q . k_new, the new token's own score.
    scores = KernelCost(
        kernels.SCORES,
        flops=2 * R * C * H + 2 * R * H + convert,
        bytes=2 * R * H * a
        + cache_rows * (a if widen_kv else kv)
        + convert_bytes
        + B * K * H * a
        + R * S * SCORE_BYTES,
        kv_bytes=cache_rows * kv + B * K * C * scale_row,
    )
    softmax = decode_softmax(R, B, S, a)
    if cfg.sink_logits:
        softmax = softmax + sink_logits_cost(cfg, R, True, L.w)
    if cfg.attn_softcap:  # every score, the new token's own included
        softmax = softmax + softcap_cost(kernels.SOFTMAX, R * S)
    if L.rolling and cfg.chunked_attention:  # the chunk's slots: below t mod W (compare: base)
        softmax = softmax + KernelCost(kernels.SOFTMAX, remainder, 0.0)
    elif L.rolling:  # the slot about to be overwritten masked: != and & per slot, t mod W
        softmax = softmax + KernelCost(kernels.SOFTMAX, 2 * B * span + remainder, 0.0)
    # out = P . V_cache + p_self * v_new (an outer product) and their sum.
    av = KernelCost(
        kernels.AV,
        flops=2 * R * C * H + 2 * R * H + R * H + convert,
        bytes=R * C * a
        + cache_rows * (a if widen_kv else kv)
        + convert_bytes
        + R * H * a
        + R * a
        + B * K * H * a
        + R * H * a
        + 3 * R * H * a,
        kv_bytes=cache_rows * kv + B * K * C * scale_row,
    )
    return [kv_write, scores, softmax, av]


def _prefill_attention(cfg: ModelConfig, L: _Layer) -> list[KernelCost]:
    """A prefill's write of the T new rows (one dynamic-update-slice each for K and V; a sliding
    layer keeps its window's) and its attention over the prompt, banded for a window."""
    B, T, S, window, span = L.B, L.T, L.S, L.window, L.span
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    M, R = B * T, B * N
    a, kv = L.a, L.kv
    widen_kv = kv != a
    scale_row = scale_bytes_per_row(cfg)
    held = min(T, span) if window else T  # rows a sliding layer keeps
    # token_head scales are gathered too: two more gathers (6 checks a slot, 1 select each)
    per_slot = 2 * K * H + 22 + (2 * K + 12 if cfg.kv_scale_kind == "token_head" else 0)
    # sinks: slots below s take their own token (a compare a slot, a select per sequence's)
    sink_slots = (span + B * span) if L.sinks else 0
    gather = B * span * per_slot + 3 + sink_slots if L.rolling and T > span else 0
    kept = 2 * B * held * K * (H * kv + scale_row)
    kv_write = KernelCost(
        kernels.KV_WRITE,
        flops=(2 * M * K * H if widen_kv else 0)
        + gather
        + quantize_flops(cfg, M * K * H, M * K, a),
        bytes=2 * M * K * H * a + kept,
        kv_bytes=kept,
    )
    E = R * T * S  # the full T x S score matrix of every head
    scores = KernelCost(
        kernels.SCORES,
        flops=2 * E * H,
        bytes=M * N * H * a + B * S * K * H * a + E * SCORE_BYTES,
    )
    softmax = prefill_softmax(R, T, S, a)
    if cfg.sink_logits:
        softmax = softmax + sink_logits_cost(cfg, R * T, False, L.w)
    if cfg.attn_softcap:
        softmax = softmax + softcap_cost(kernels.SOFTMAX, E)
    if window and window < T:  # the band: i - j < W (or j < s: a compare a key, an or)
        band = 5 * T * S + (T + T * S if L.sinks else 0)
        if cfg.chunked_attention:  # j // W == i // W: a constant, and-ed with the causal mask
            band = T * S
        softmax = softmax + KernelCost(kernels.SOFTMAX, band, 0.0)
    av = KernelCost(
        kernels.AV,
        flops=2 * E * H,
        bytes=E * a + B * S * K * H * a + M * N * H * a,
    )
    return [kv_write, scores, softmax, av]


def extend_attention(cfg: ModelConfig, wl: Workload) -> list[KernelCost]:
    """An extend step's write and attention (`kvjax.nn.transformer.Transformer.extend`): the T
    new rows of K and V scattered into the cache at pos .. pos + T - 1 (3 ops an element wrap
    each scatter's negative indices: the slots, B x T, and the sequences' b, B of them unless
    B = 1, a constant),
    then the T queries attend all S rows of the cache, each masked to the rows up to itself:
    the full T x S scores, as prefill computes them (a cache in another dtype than the compute
    dtype is converted on read, as decode does). A 1-byte cache (closed form only: the model's
    extend refuses it) quantizes the rows it writes, writes their scales, and dequantizes what
    it reads by the same rules as decode (`kvjax.analytic.quant`)."""
    B, T, S = wl.batch, wl.query_len, wl.context
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    M, R, E = B * T, B * N, B * N * T * S
    a, kv = _act_bytes(cfg), cfg.kv_bytes_per_element
    widen = kv != a
    scale_row = scale_bytes_per_row(cfg)
    rows = 2 * M * K * H  # K and V elements written
    kv_write = KernelCost(
        kernels.KV_WRITE,
        flops=2 * (3 * M + (3 * B if B > 1 else 0))
        + (rows if widen else 0)
        + quantize_flops(cfg, M * K * H, M * K, a),
        bytes=rows * (a + kv) + 2 * M * K * scale_row,
        kv_bytes=rows * kv + 2 * M * K * scale_row,
    )
    cache = B * K * S * H  # elements of K (or V) read
    dq_flops, dq_bytes = dequantize_cost(cfg, cache, B * K * S, a)
    convert = (cache if widen else 0) + dq_flops
    convert_bytes = (cache * (kv + a) if widen else 0) + dq_bytes
    read = cache * (a if widen else kv) + convert_bytes
    cache_bytes = cache * kv + B * K * S * scale_row
    scores = KernelCost(
        kernels.SCORES,
        flops=2 * E * H + convert,
        bytes=M * N * H * a + read + E * SCORE_BYTES,
        kv_bytes=cache_bytes,
    )
    softmax = extend_softmax(R, B, T, S, a)
    if cfg.sink_logits:
        softmax = softmax + sink_logits_cost(cfg, R * T, False, cfg.weight_bytes_per_element)
    if cfg.attn_softcap:
        softmax = softmax + softcap_cost(kernels.SOFTMAX, E)
    av = KernelCost(
        kernels.AV,
        flops=2 * E * H + convert,
        bytes=E * a + read + M * N * H * a,
        kv_bytes=cache_bytes,
    )
    return [kv_write, scores, softmax, av]
