"""Closed forms of every kernel of a decoder step: FLOPs and bytes, per layer and per step.

Pure Python (no jax). Letters: `kvjax.kernels`. Byte counts are what a straightforward
implementation moves: every kernel reads its inputs and writes its output once; weights are read
once per step whatever B is; the scores (B*N*T*S, f32 for the softmax) and probabilities (compute
dtype) are real traffic. FLOPs are counted as XLA counts the model's operations (derivations next
to each kernel; the trace in `kvjax.traced` is the judge): matrix products 2*M*K*N, elementwise
steps one per element.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

from kvjax import kernels
from kvjax.analytic.costs import EXTEND, INDEX_BYTES, SCORE_BYTES, KernelCost, StepCost, Workload
from kvjax.analytic.primitives import (  # noqa: F401 (_act_bytes, rope_cost, l2_norm_cost: re-exported)
    _act_bytes,
    _matmul,
    _residual,
    _rmsnorm,
    act_cost,
    decode_softmax,
    extend_softmax,
    l2_norm_cost,
    norm_cost,
    prefill_softmax,
    rope_cost,
    sink_logits_cost,
    softcap_cost,
    temperature_cost,
)
from kvjax.analytic.quant import dequantize_cost, quantize_flops, scale_bytes_per_row
from kvjax.model.checks import check_extend
from kvjax.model.config import ModelConfig


def layer_kernels(
    cfg: ModelConfig, wl: Workload, sliding: bool = False, moe: bool = False, chip=None,
    rope: bool = True, kind: str = "A",
) -> dict[str, KernelCost]:  # fmt: skip
    """Every kernel of one decoder layer, in execution order (MLA's attention:
    `kvjax.analytic.mla`); `sliding`: a sliding-window layer of the config; `moe`: an MoE layer
    (`kvjax.analytic.moe`: router, experts, and the shared experts as the mlp/ kernels). With
    `cfg.attention_kernel == "flash"` scores, softmax and av are one fused kernel
    (`kvjax.analytic.flash`), tiled for `chip` (a `ChipSpec`; None: 128 x 128 tiles); `rope`
    False: a NoPE layer (no attn/rope kernel); `kind`: its `layer_kinds` letter (D, C: a state
    mixer instead of attention, H: the Mamba-2 heads beside it; `kvjax.analytic.hybrid`)."""
    if wl.phase == EXTEND:
        check_extend(cfg)  # the closed form covers what the model's extend step runs
    M, D, F = wl.tokens, cfg.d_model, cfg.d_ff
    w, a = cfg.weight_bytes_per_element, _act_bytes(cfg)
    if kind != "A":
        from kvjax.analytic.hybrid import combine_cost, mixer_kernels

        mixer = mixer_kernels(cfg, wl, kind)
    if kind in "DC":
        attention = mixer
    elif cfg.is_mla:
        from kvjax.analytic.mla import mla_attention_kernels

        attention = mla_attention_kernels(cfg, wl)
    else:
        attention = gqa_attention_kernels(
            cfg, wl, cfg.sliding_window if sliding else 0, sliding, rope
        )  # fmt: skip
    if cfg.attention_kernel == "flash":
        attention = _fused(cfg, wl, attention, sliding, chip)
    if kind == "H":  # Falcon-H1: both mixers read the normed x; their outputs are summed
        attention = [*mixer, *attention, combine_cost(cfg, M)]
    post_attn = [norm_cost(cfg, kernels.NORM_POST_ATTN, M, D, w, a)] if cfg.sandwich_norms else []
    pre = cfg.pre_norms  # OLMo 2 norms only the outputs
    k = [
        *([norm_cost(cfg, kernels.NORM_ATTN, M, D, w, a)] if pre else []),
        *attention,
        *post_attn,
        _residual(kernels.RESIDUAL_ATTN, M, D, a, cfg.residual_multiplier),
        # a parallel block (Cohere) feeds the MLP the same normed x: no norm of its own
        *([norm_cost(cfg, kernels.NORM_MLP, M, D, w, a)] if pre and not cfg.parallel_block else []),
    ]
    if moe:
        from kvjax.analytic.moe import moe_kernels

        F = cfg.shared_d_ff  # the shared experts: one gated MLP
        if F:
            k += mlp_kernels(cfg, M, D, F, w, a)
        k += moe_kernels(cfg, wl)
    else:
        k += mlp_kernels(cfg, M, D, F, w, a)
    if cfg.sandwich_norms:
        k.append(norm_cost(cfg, kernels.NORM_POST_MLP, M, D, w, a))
    k.append(_residual(kernels.RESIDUAL_MLP, M, D, a, cfg.residual_multiplier))
    return {c.name: c for c in k}


def _fused(cfg, wl, attention: list[KernelCost], sliding: bool, chip) -> list[KernelCost]:
    """The layer's attention kernels with scores, softmax and av replaced, where scores stood,
    by the fused kernel (and flash-decoding's combine)."""
    from kvjax.analytic import flash

    tiles = flash.plan_for_chip(cfg, wl, chip)
    fused = flash.flash_attention_cost(cfg, wl, tiles, sliding).kernels()
    out = []
    for cost in attention:
        if cost.name == kernels.SCORES:
            out += fused
        elif cost.name not in kernels.ATTENTION_PARTS:
            out.append(cost)
    return out


def mlp_kernels(cfg: ModelConfig, M: int, D: int, F: int, w: int, a: int) -> list[KernelCost]:
    """A dense MLP of width F: gate_up (or up), the activation, down."""
    bias = cfg.mlp_bias
    k = [
        _matmul(kernels.GATE_UP, M, D, 2 * F, w, a, bias=bias)
        if cfg.gated_mlp
        else _matmul(kernels.UP, M, D, F, w, a, bias=bias)
    ]
    k.append(act_cost(cfg, M, F, w, a))  # silu, gelu or xIELU (`primitives.act_cost`)
    k.append(_matmul(kernels.DOWN, M, F, D, w, a, bias=bias))
    return k


def gqa_attention_kernels(
    cfg: ModelConfig, wl: Workload, window: int = 0, sliding: bool = False, rope: bool = True
) -> list[KernelCost]:
    """The attention kernels of an MHA/GQA/MQA layer, projections to o_proj, in execution order.

    Decode attends S positions: C = S - 1 read from the cache plus the new token's own k, v
    (kvjax's model attends the read-only cache and the new row separately, and appends the row
    afterwards). Each count below is derived from the model's dataflow; the trace checks it.

    A sliding layer (`window` W > 0) holds min(S - 1, W) rows in decode: once it holds W it
    rolls (token t in slot t mod W), reads all W slots and masks the one holding the token W
    back: the scores and av of C = W rows, plus the mask's 2BW compares and a jnp.remainder
    (7 ops per position and 3 on the divisor), which the write's slot t mod W costs again. In
    prefill its mask is banded (5 more ops per T x S entry: a second tril, its negation, the
    and) when W < T, and a prompt longer than the window fills the rolling buffer by a gather
    (per slot: 10 ops of index arithmetic and two gathers' 6 bounds checks each; a select per
    gathered element; 3 on the divisor).
    """
    B, T, S = wl.batch, wl.query_len, wl.context
    sinks = cfg.sink_tokens if window else 0  # a sliding layer's kept first tokens
    span = window + sinks  # a rolling layer's slots
    rolling = bool(window) and (S - 1 if wl.phase == "decode" else S + 1) >= span
    if wl.phase == "decode" and rolling:
        S = span + 1  # the W (+ sink) slots read and the new token
    D, N, K, H = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    M = B * T
    R = B * N  # attention rows (one per query head per sequence) per query position
    w, a, kv = cfg.weight_bytes_per_element, _act_bytes(cfg), cfg.kv_bytes_per_element
    widen_kv = kv != a  # cache entries converted to the compute dtype before the products
    scales = cfg.kv_scale_kind  # a 1-byte cache's: quantized on write, dequantized on read
    scale_row = scale_bytes_per_row(cfg)  # a K or V row's scales (token_head, group)
    decode = wl.phase == "decode"
    C = S - 1 if decode else S  # key rows read by the product over the cache / prompt
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
        width = cfg.rope_width  # (R is the attention rows below)
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
    chunked = cfg.chunked_attention and bool(window)
    cap = cfg.attn_softcap
    if decode:
        # Per layer two scatters (K and V) of B rows at (b, pos[b]); wrapping negative indices
        # costs 3 ops per index per scatter: 6B for pos, and 6B for b unless B = 1 (a constant).
        # the slot, t mod W; with sinks t below s, else s + (t - s) mod W: 4 more ops a sequence
        remainder = (7 * B + 3 + (4 * B if sinks else 0)) if rolling else 0
        # token_head scales: two more scatters, their indices wrapped alike
        scale_index = (6 * B + (6 * B if B > 1 else 0)) if scales == "token_head" else 0
        kv_write = KernelCost(
            kernels.KV_WRITE,
            flops=6 * B + (6 * B if B > 1 else 0) + (2 * B * K * H if widen_kv else 0) + remainder
            + quantize_flops(cfg, B * K * H, B * K, a) + scale_index,
            bytes=2 * B * K * H * (a + kv) + 2 * B * K * scale_row,
            kv_bytes=2 * B * K * H * kv + 2 * B * K * scale_row,
        )  # fmt: skip
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
            softmax = softmax + sink_logits_cost(cfg, R, True, w)
        if cap:  # every score, the new token's own included
            softmax = softmax + softcap_cost(kernels.SOFTMAX, R * S)
        if rolling and chunked:  # the chunk's slots: below t mod W (the compare in the base)
            softmax = softmax + KernelCost(kernels.SOFTMAX, remainder, 0.0)
        elif rolling:  # the slot about to be overwritten masked: != and & per slot, t mod W
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
    elif wl.phase == EXTEND:
        kv_write, scores, softmax, av = _extend_attention(cfg, wl)
    else:
        # Prefill writes the T new rows into the cache (one dynamic-update-slice each for K, V).
        held = min(T, span) if window else T  # rows a sliding layer keeps
        # token_head scales are gathered too: two more gathers (6 checks a slot, 1 select each)
        per_slot = 2 * K * H + 22 + (2 * K + 12 if scales == "token_head" else 0)
        # sinks: slots below s take their own token (a compare a slot, a select per sequence's)
        sink_slots = (span + B * span) if sinks else 0
        gather = B * span * per_slot + 3 + sink_slots if rolling and T > span else 0
        kept = 2 * B * held * K * (H * kv + scale_row)
        kv_write = KernelCost(
            kernels.KV_WRITE,
            flops=(2 * M * K * H if widen_kv else 0)
            + gather
            + quantize_flops(cfg, M * K * H, M * K, a),
            bytes=2 * M * K * H * a + kept,
            kv_bytes=kept,
        )  # fmt: skip
        E = R * T * S  # the full T x S score matrix of every head
        scores = KernelCost(
            kernels.SCORES,
            flops=2 * E * H,
            bytes=M * N * H * a + B * S * K * H * a + E * SCORE_BYTES,
        )
        softmax = prefill_softmax(R, T, S, a)
        if cfg.sink_logits:
            softmax = softmax + sink_logits_cost(cfg, R * T, False, w)
        if cap:
            softmax = softmax + softcap_cost(kernels.SOFTMAX, E)
        if window and window < T:  # the band: i - j < W (or j < s: a compare a key, an or)
            band = 5 * T * S + (T + T * S if sinks else 0)
            if chunked:  # j // W == i // W: a constant, and-ed with the causal mask
                band = T * S
            softmax = softmax + KernelCost(kernels.SOFTMAX, band, 0.0)
        av = KernelCost(
            kernels.AV,
            flops=2 * E * H,
            bytes=E * a + B * S * K * H * a + M * N * H * a,
        )
    o_proj = _matmul(kernels.O_PROJ, M, N * H, D, w, a, bias=cfg.o_bias)
    if cfg.attn_output_gate:
        from kvjax.analytic.hybrid import attn_gate_cost

        av = [av, attn_gate_cost(cfg, M)]
    return [*k, kv_write, scores, softmax, *(av if cfg.attn_output_gate else [av]), o_proj]


def _extend_attention(cfg: ModelConfig, wl: Workload) -> list[KernelCost]:
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
        flops=2 * (3 * M + (3 * B if B > 1 else 0)) + (rows if widen else 0)
        + quantize_flops(cfg, M * K * H, M * K, a),
        bytes=rows * (a + kv) + 2 * M * K * scale_row,
        kv_bytes=rows * kv + 2 * M * K * scale_row,
    )  # fmt: skip
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
        kernels.AV, flops=2 * E * H + convert, bytes=E * a + read + M * N * H * a,
        kv_bytes=cache_bytes,
    )  # fmt: skip
    return [kv_write, scores, softmax, av]


def embed_kernel(cfg: ModelConfig, wl: Workload) -> KernelCost:
    """Row gather: reads M rows of the table (not all of it) and the ids, writes M x D.

    FLOPs as jnp.take lowers it: id wrapping and bounds checks (6 per id) and the select that
    fills out-of-range rows (one per output element).
    """
    M, D = wl.tokens, cfg.d_model
    w, a = cfg.weight_bytes_per_element, _act_bytes(cfg)
    scaled = cfg.scale_embeddings or cfg.embedding_multiplier != 1.0  # Gemma's sqrt(D), Granite's
    return KernelCost(
        kernels.EMBED,
        flops=M * D + 6 * M + (M * D if scaled else 0),
        bytes=M * D * w + M * INDEX_BYTES + M * D * a,
        weight_bytes=M * D * w,
    )


def head_kernels(cfg: ModelConfig, wl: Workload) -> dict[str, KernelCost]:
    """Final norm and the LM head (f32 logits for all T positions, as prefill returns them)."""
    M, D, V = wl.tokens, cfg.d_model, cfg.vocab_size
    w, a = cfg.weight_bytes_per_element, _act_bytes(cfg)
    out = {
        kernels.NORM_FINAL: norm_cost(cfg, kernels.NORM_FINAL, M, D, w, a),
        kernels.LM_HEAD: _matmul(kernels.LM_HEAD, M, D, V, w, a, out=SCORE_BYTES),
    }
    if cfg.logits_scaling != 1.0:  # Granite: a division of every logit (f32)
        out[kernels.LOGIT_SCALE] = KernelCost(kernels.LOGIT_SCALE, M * V, 2 * M * V * SCORE_BYTES)
    if cfg.final_softcap:
        out[kernels.LOGIT_SOFTCAP] = softcap_cost(kernels.LOGIT_SOFTCAP, M * V, SCORE_BYTES)
    return out


@lru_cache(maxsize=256)
def layer_kinds(cfg: ModelConfig) -> tuple[tuple[tuple[bool, bool, bool, str], int], ...]:
    """The layers of each kind, (sliding, MoE, RoPE, layer_kinds letter) and how many, in the
    order the layers first show them."""
    return tuple(Counter(
        (cfg.layer_is_sliding(i), cfg.layer_is_moe(i), cfg.layer_has_rope(i), cfg.layer_kind(i))
        for i in range(cfg.num_layers)
    ).items())  # fmt: skip


def step_kernels(cfg: ModelConfig, wl: Workload, chip=None) -> dict[str, KernelCost]:
    """Every kernel of the step, layer kernels summed over the L layers (global and sliding);
    `chip` tiles a fused attention (`layer_kernels`)."""
    out = {kernels.EMBED: embed_kernel(cfg, wl)}
    for (sliding, moe, rope, kind), count in layer_kinds(cfg):
        for name, cost in layer_kernels(cfg, wl, sliding, moe, chip, rope, kind).items():
            out[name] = out[name] + cost.scaled(count) if name in out else cost.scaled(count)
    out.update(head_kernels(cfg, wl))
    return out


def step_cost(cfg: ModelConfig, wl: Workload, chip=None) -> StepCost:
    return StepCost.total(step_kernels(cfg, wl, chip).values())


def attention_cost(cfg: ModelConfig, wl: Workload) -> KernelCost:
    """The attention of one layer (scores, softmax, av) as one unfused kernel."""
    ks = layer_kernels(cfg.replace(attention_kernel="xla"), wl)
    total = ks[kernels.ATTENTION_PARTS[0]]
    for name in kernels.ATTENTION_PARTS[1:]:
        total = total + ks[name]
    return KernelCost(
        kernels.ATTENTION, total.flops, total.bytes, total.transcendentals, 0.0, total.kv_bytes
    )
