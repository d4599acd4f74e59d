"""Kernels timed alone: each kernel of one layer (and the LM head) jitted by itself with a config's
shapes, under its `kvjax.kernels` name.

Every kernel here calls the model's own function (`linear`, `rms_norm`, `decode_scores`, ...),
so what is timed is what is traced. Inputs are random (never zeros) and rotated among enough
sets that a memory-bound kernel streams from memory, not from cache. Closed-form costs are per
layer (`analytic.layer_kernels`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from kvjax import analytic, kernels
from kvjax.analytic import KernelCost, Workload
from kvjax.analytic.moe import model_workload
from kvjax.errors import KvjaxError
from kvjax.measured.timing import (
    TimingStats,
    available_memory_bytes,
    random_array,
    random_inputs,
    time_fn,
)
from kvjax.model.config import ModelConfig
from kvjax.nn import flash, flash_mla, mla, moe
from kvjax.nn.attend import (
    attend_cache,
    attend_causal,
    attend_extend,
    decode_av,
    decode_scores,
    decode_softmax,
)
from kvjax.nn.layers import act_dtype, kv_dtype, linear, rms_norm, weight_dtype

ROTATION_BYTES = 256 * 2**20  # input sets rotated until they exceed this (far above any LLC)
MAX_SETS = 16


@dataclass(frozen=True)
class KernelBench:
    name: str
    fn: Callable[..., Any]
    make_args: Callable[[int], tuple]  # seed -> one input set
    closed: KernelCost
    executed_as: str | None = None  # a fused attention: what runs it here (`flash_execution`)


def kernel_benches(cfg: ModelConfig, wl: Workload, chip=None) -> dict[str, KernelBench]:
    """One layer's kernels (and the LM head) as standalone functions with their input makers;
    `chip` (a `ChipSpec`) tiles a fused attention's closed form as the kernel is run for it."""
    B, T = wl.batch, wl.query_len
    D, F, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    a, w = act_dtype(cfg), weight_dtype(cfg)
    is_moe = cfg.layer_is_moe(cfg.num_layers - 1)  # an MoE model's benches: an MoE layer's
    wl = model_workload(cfg, wl)  # at the model's own expert reads (M*k gathers)
    closed = analytic.layer_kernels(cfg, wl, moe=is_moe, chip=chip) | analytic.head_kernels(cfg, wl)
    out: dict[str, KernelBench] = {}

    fused = cfg.attention_kernel == "flash"

    def add(name, fn, shapes, closed_cost=None, executed_as=None):
        if fused and name in (*kernels.ATTENTION_PARTS, kernels.ATTENTION) and not executed_as:
            return  # the unfused attention's kernels: a fused model runs `_add_flash`'s instead

        def make(seed):
            # a shape is (dims, dtype), drawn by `random_array`, or a callable of its own seed
            # (a numpy SeedSequence) that makes the input: positions, fixed expert picks
            keys = random_inputs(seed, len(shapes))
            return tuple(
                s(keys[i]) if callable(s) else random_array(keys[i], *s)
                for i, s in enumerate(shapes)
            )

        out[name] = KernelBench(name, jax.jit(fn), make, closed_cost or closed[name], executed_as)

    norm = partial(rms_norm, eps=cfg.norm_eps, plus_one=cfg.norm_plus_one)
    add(kernels.NORM_ATTN, norm, [((B, T, D), a), ((D,), w)])
    if cfg.is_mla:
        _add_mla(cfg, wl, add)
    else:
        _add_gqa(cfg, wl, add)
    if fused:
        _add_flash(cfg, wl, add, closed)
    if is_moe:
        _add_moe(cfg, wl, add)
        F = cfg.shared_d_ff  # the shared experts: the mlp/ kernels
    if F and cfg.gated_mlp:
        add(kernels.GATE_UP, linear, [((B, T, D), a), ((2 * F, D), w)])
    elif F:
        add(kernels.UP, linear, [((B, T, D), a), ((F, D), w)])
    if F:
        add(kernels.DOWN, linear, [((B, T, F), a), ((D, F), w)])
    add(kernels.LM_HEAD, partial(linear, out_dtype=jnp.float32), [((B, T, D), a), ((V, D), w)])
    return out


def _add_gqa(cfg: ModelConfig, wl: Workload, add) -> None:
    """MHA/GQA/MQA attention's kernels, projections to o_proj."""
    B, T, S = wl.batch, wl.query_len, wl.context
    D, N, K, H, G = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.group_size
    a, w, kv = act_dtype(cfg), weight_dtype(cfg), kv_dtype(cfg)
    add(kernels.Q_PROJ, linear, [((B, T, D), a), ((N * H, D), w)])
    add(kernels.K_PROJ, linear, [((B, T, D), a), ((K * H, D), w)])
    add(kernels.V_PROJ, linear, [((B, T, D), a), ((K * H, D), w)])
    if cfg.qk_norm:

        def qk_norm(q, k, q_scale, k_scale):
            norm = partial(rms_norm, eps=cfg.norm_eps, plus_one=cfg.norm_plus_one)
            return norm(q, q_scale), norm(k, k_scale)

        add(
            kernels.QK_NORM,
            qk_norm,
            [((B, T, K, G, H), a), ((B, T, K, H), a), ((H,), w), ((H,), w)],
        )
    # gpt-oss's sink logits, as the model's softmax takes them ([K, G], a constant here)
    sink = jnp.zeros((K, G), w) if cfg.sink_logits else None
    if wl.phase == "decode":
        _add_gqa_decode(cfg, wl, add, sink)
    elif wl.phase == "extend":  # T queries over the S cache rows that now hold them
        held = lambda seed: jnp.full((B,), S - T, jnp.int32)  # noqa: E731 (S - T cached before)
        add(
            kernels.ATTENTION,
            partial(attend_extend, scale=cfg.attn_scale, sink_logits_KG=sink),
            [((B, T, K, G, H), a), ((B, K, H, S), kv), ((B, K, S, H), kv), held],
            analytic.attention_cost(cfg, wl),
        )
    else:
        add(
            kernels.ATTENTION,
            partial(
                attend_causal, scale=cfg.attn_scale, softcap=cfg.attn_softcap, sink_logits_KG=sink
            ),
            [((B, T, K, G, H), a), ((B, T, K, H), a), ((B, T, K, H), a)],
            analytic.attention_cost(cfg, wl),
        )
    add(kernels.O_PROJ, linear, [((B, T, N * H), a), ((D, N * H), w)])


def _add_gqa_decode(cfg: ModelConfig, wl: Workload, add, sink) -> None:
    """Decode's scores, softmax and av over a cache of S - 1 rows (every row valid), each alone
    and as the one attention; `sink`: gpt-oss's sink logits, or None."""
    B, S = wl.batch, wl.context
    K, H, G = cfg.num_kv_heads, cfg.head_dim, cfg.group_size
    a, kv = act_dtype(cfg), kv_dtype(cfg)
    C = S - 1
    pos = lambda seed: jnp.full((B,), C, jnp.int32)  # noqa: E731 (every cached row valid)
    # a 1-byte cache's scales: per token per KV head [B, K, C], or one per tensor
    kind = cfg.kv_scale_kind
    scale = [] if kind == "none" else [((B, K, C) if kind == "token_head" else (), jnp.float32)]
    add(
        kernels.SCORES,
        decode_scores,
        [((B, K, G, H), a), ((B, K, H), a), ((B, K, H, C), kv), *scale],
    )
    add(
        kernels.SOFTMAX,
        partial(
            decode_softmax,
            head_dim=H,
            dtype=a,
            scale=cfg.attn_scale,
            softcap=cfg.attn_softcap,
            sink_logits_KG=sink,
        ),
        [((B, K, G, C), jnp.float32), ((B, K, G), jnp.float32), pos],
    )
    add(
        kernels.AV,
        decode_av,
        [((B, K, G, C), a), ((B, K, G), a), ((B, K, H), a), ((B, K, C, H), kv), *scale],
    )
    attention_args = [*_gqa_decode_inputs(cfg, wl, pos), *(scale * 2)]

    def attention(q, kn, vn, kc, vc, pos_B, *scales):
        k_scale, v_scale = scales or (None, None)
        return attend_cache(
            q, kn, vn, kc, vc, pos_B, 0, k_scale, v_scale, cfg.attn_scale, cfg.attn_softcap, 0, sink
        )

    add(kernels.ATTENTION, attention, attention_args, analytic.attention_cost(cfg, wl))


def _add_moe(cfg: ModelConfig, wl: Workload, add) -> None:
    """The router and the experts' products as the model runs them (`kvjax.nn.moe`): each token
    against its k experts, gathered; the routing fixed to distinct experts per token."""
    M, D, E, k, F = wl.tokens, cfg.d_model, cfg.num_experts, cfg.experts_per_token, cfg.moe_d_ff
    a, w = act_dtype(cfg), weight_dtype(cfg)

    def picks(seed):  # token m takes experts m*k .. m*k + k - 1 (mod E)
        return (jnp.arange(M)[:, None] * k + jnp.arange(k)[None, :]) % E

    def gate_up(x, w_all, idx):
        return moe.experts_gate_up(x, moe.read_experts_array(w_all, idx, cfg))

    def down(h, w_all, idx):
        return moe.experts_down(h, moe.read_experts_array(w_all, idx, cfg))

    add(kernels.MOE_ROUTER, moe.router_logits, [((M, D), a), ((E, D), w)])
    add(kernels.MOE_GATE_UP, gate_up, [((M, D), a), ((E, 2 * F, D), w), picks])
    add(kernels.MOE_DOWN, down, [((M, k, F), a), ((E, D, F), w), picks])


def _add_mla(cfg: ModelConfig, wl: Workload, add) -> None:
    """MLA's kernels (`kvjax.nn.mla`'s own functions), projections to o_proj, in the config's
    decode form; in prefill the latents' expansion (its attention is MHA's, over U + P keys)."""
    B, T, S = wl.batch, wl.query_len, wl.context
    D, N, H, A, P = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    U, W, Q = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.q_lora_rank
    a, w, kv = act_dtype(cfg), weight_dtype(cfg), kv_dtype(cfg)
    if Q:
        add(kernels.Q_A_PROJ, linear, [((B, T, D), a), ((Q, D), w)])
        add(kernels.NORM_Q_A, partial(rms_norm, eps=cfg.norm_eps), [((B, T, Q), a), ((Q,), w)])
        add(kernels.Q_B_PROJ, linear, [((B, T, Q), a), ((N * H, Q), w)])
    else:
        add(kernels.Q_PROJ, linear, [((B, T, D), a), ((N * H, D), w)])
    add(kernels.KV_A_PROJ, linear, [((B, T, D), a), ((A + P, D), w)])
    add(kernels.NORM_KV_A, partial(rms_norm, eps=cfg.norm_eps), [((B, T, A), a), ((A,), w)])
    if wl.phase == "prefill":
        add(kernels.KV_B_PROJ, mla.expand_prefix, [((B, T, A), a), ((N, U, A), w), ((N, W, A), w)])
    elif cfg.mla_decode == "naive":
        C = S - 1
        pos = lambda seed: jnp.full((B,), C, jnp.int32)  # noqa: E731 (every cached row valid)
        add(
            kernels.KV_B_PROJ,
            mla.expand_latents,
            [((B, C, A), kv), ((B, A), a), ((N, U, A), w), ((N, W, A), w)],
        )
        attention_args = [
            ((B, N, U), a),
            ((B, N, P), a),
            ((B, C, N, U), a),
            ((B, C, N, W), a),
            ((B, N, U), a),
            ((B, N, W), a),
            ((B, C, P), kv),
            ((B, P), a),
            pos,
        ]
        add(
            kernels.ATTENTION,
            partial(mla.naive_attention, head_dim=H),
            attention_args,
            analytic.attention_cost(cfg, wl),
        )
    else:
        C = S - 1
        pos = lambda seed: jnp.full((B,), C, jnp.int32)  # noqa: E731 (every cached row valid)
        add(kernels.Q_ABSORB, mla.absorb_query, [((B, N, U), a), ((N, U, A), w)])
        cache = [((N, B, A), a), *_latent_decode_inputs(cfg, wl)]  # the query head-major
        add(kernels.SCORES, lambda *x: mla.absorbed_scores(*x)[:2], cache)
        add(
            kernels.SOFTMAX,
            partial(decode_softmax, head_dim=H, dtype=a),
            [((B, N, C), jnp.float32), ((B, N), jnp.float32), pos],
        )
        add(kernels.AV, mla.absorbed_av, [((B, N, C), a), ((B, N), a), ((B, A), a), ((B, C, A), a)])
        add(kernels.V_UP, mla.up_values, [((B, N, A), a), ((N, W, A), w)])
        add(
            kernels.ATTENTION,
            partial(mla.absorbed_attention, head_dim=H),
            [*cache, pos],
            analytic.attention_cost(cfg, wl),
        )
    add(kernels.O_PROJ, linear, [((B, T, N * W), a), ((D, N * W), w)])


def flash_execution(cfg: ModelConfig, phase: str) -> str:
    """What runs a fused attention on this backend: a Pallas kernel interpreted on a CPU (its
    values are the kernel's, its time is the interpreter's), cuDNN or Triton on a GPU, and
    XLA's `dot_product_attention` composite (scores through memory, not fused) on a CPU."""
    backend = jax.default_backend()
    if phase == "decode":
        return "pallas interpret" if backend == "cpu" else f"pallas {backend}"
    impl = flash.prefill_impl()[0]
    if impl == "pallas":
        return "pallas interpret" if backend == "cpu" else f"pallas {backend}"
    return "xla composite (not fused)" if impl == "xla" else impl


def _add_flash(cfg: ModelConfig, wl: Workload, add, closed: dict[str, KernelCost]) -> None:
    """The fused attention as the model runs it (`kvjax.nn.flash`), against the closed form's
    fused kernel and flash-decoding's combine summed (`kvjax.analytic.flash`; without a chip
    128 x 128 tiles and the cache in one split, as the model runs on this host by default)."""
    B, T, S, N = wl.batch, wl.query_len, wl.context, cfg.num_heads
    a = act_dtype(cfg)
    parts = [closed[n] for n in (kernels.ATTENTION, kernels.ATTN_COMBINE) if n in closed]
    cost = KernelCost(
        kernels.ATTENTION,
        sum(k.flops for k in parts),
        sum(k.bytes for k in parts),
        transcendentals=sum(k.transcendentals for k in parts),
    )
    runs = flash_execution(cfg, wl.phase)
    scale = cfg.attn_scale
    if wl.phase == "prefill":
        if cfg.is_mla:  # MHA over the up-projected keys [k_nope, k_rope], values padded to them
            Hk, K, G = cfg.head_dim, N, 1
            scale = 1.0 / math.sqrt(cfg.head_dim)
        else:
            Hk, K, G = cfg.head_dim, cfg.num_kv_heads, cfg.group_size
        fn = partial(flash.flash_causal, scale=scale)
        add(
            kernels.ATTENTION,
            fn,
            [((B, T, K, G, Hk), a), ((B, T, K, Hk), a), ((B, T, K, Hk), a)],
            cost,
            runs,
        )
        return
    C = S - 1
    pos = lambda seed: jnp.full((B,), C, jnp.int32)  # noqa: E731 (every cached row valid)
    if cfg.is_mla:
        fn = partial(flash_mla.flash_decode_latent, scale=1.0 / math.sqrt(cfg.head_dim))
        args = [((B, N, cfg.kv_lora_rank), a), *_latent_decode_inputs(cfg, wl), pos]
    else:
        fn = partial(flash.flash_decode, scale=scale, softcap=cfg.attn_softcap)
        args = _gqa_decode_inputs(cfg, wl, pos)
    add(kernels.ATTENTION, fn, args, cost, runs)


def _latent_decode_inputs(cfg: ModelConfig, wl: Workload) -> list:
    """MLA's absorbed decode inputs after the latent query, over S - 1 cached rows: the query's
    RoPE part, the new latent and RoPE key, the cached latents and RoPE keys."""
    B, C, N = wl.batch, wl.context - 1, cfg.num_heads
    A, P = cfg.kv_lora_rank, cfg.qk_rope_head_dim
    a, kv = act_dtype(cfg), kv_dtype(cfg)
    return [((B, N, P), a), ((B, A), a), ((B, P), a), ((B, C, A), kv), ((B, C, P), kv)]


def _gqa_decode_inputs(cfg: ModelConfig, wl: Workload, pos) -> list:
    """One decode's inputs over S - 1 cached rows: q, the new k and v, the cached K (B, K, H, C)
    and V (B, K, C, H), and `pos`, the positions' maker."""
    B, C = wl.batch, wl.context - 1
    K, G, H = cfg.num_kv_heads, cfg.group_size, cfg.head_dim
    a, kv = act_dtype(cfg), kv_dtype(cfg)
    q, rows = ((B, K, G, H), a), ((B, K, H), a)
    return [q, rows, rows, ((B, K, H, C), kv), ((B, K, C, H), kv), pos]


def _input_bytes(args: tuple) -> int:
    return sum(x.size * x.dtype.itemsize for x in args)


def check_fits(what: str, needed: float) -> None:
    free = available_memory_bytes()
    if free is not None and needed > 0.8 * free:
        raise KvjaxError(
            f"{what} needs {needed / 2**30:.2f} GiB but the device has {free / 2**30:.2f} GiB "
            "free (80% usable); choose a smaller model, batch or context"
        )


def input_sets(kb: KernelBench, rotation_bytes: int = ROTATION_BYTES) -> list[tuple]:
    """Random input sets of a kernel, enough that their total exceeds `rotation_bytes` (each
    call streams its inputs from memory, not from a cache); refused first if they cannot fit."""
    check_fits(f"kernel {kb.name}", kb.closed.bytes)  # about the inputs' size
    first = kb.make_args(0)
    per_set = max(1, _input_bytes(first))
    n_sets = int(min(MAX_SETS, max(1, math.ceil(rotation_bytes / per_set))))
    free = available_memory_bytes()
    if free is not None:
        n_sets = max(1, min(n_sets, int(0.5 * free // per_set)))
    return [first] + [kb.make_args(i) for i in range(1, n_sets)]


def time_kernel(
    kb: KernelBench, budget_s: float = 1.0, rotation_bytes: int = ROTATION_BYTES
) -> TimingStats:
    """Median time of one kernel over its rotated input sets."""
    return time_fn(kb.fn, input_sets(kb, rotation_bytes), budget_s=budget_s)
