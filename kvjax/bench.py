"""Measure: the kernels the trace names, each jitted alone with a config's shapes, and the whole
decode step, timed on the machine at hand and placed on its measured roofline.

Every kernel here calls the model's own function (`linear`, `rms_norm`, `decode_scores`, ...),
so what is timed is what is traced. Inputs are random (never zeros) and rotated among enough
sets that a memory-bound kernel streams from memory, not from cache. Closed-form costs are per
layer (`analytic.layer_kernels`); the bound is max(FLOPs / peak, bytes / bandwidth) against the
measured ceilings, and against a named chip's preset when one is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from kvjax import analytic, roofline
from kvjax.analytic import KernelCost, Workload
from kvjax.config import ModelConfig
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.nn.attention import attend_cache, attend_causal, decode_av, decode_scores, decode_softmax
from kvjax.nn.layers import act_dtype, kv_dtype, linear, rms_norm, weight_dtype
from kvjax.timing import TimingStats, available_memory_bytes, time_fn, time_loop

ROTATION_BYTES = 256 * 2**20  # input sets rotated until they exceed this (far above any LLC)
MAX_SETS = 16


@dataclass(frozen=True)
class KernelBench:
    name: str
    fn: Callable[..., Any]
    make_args: Callable[[int], tuple]  # seed -> one input set
    closed: KernelCost


def _rand(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def kernel_benches(cfg: ModelConfig, wl: Workload) -> dict[str, KernelBench]:
    """One layer's kernels (and the LM head) as standalone functions with their input makers."""
    B, T, S = wl.batch, wl.query_len, wl.context
    D, N, K, H, F, V = (
        cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size,
    )  # fmt: skip
    G = cfg.group_size
    a, w, kv = act_dtype(cfg), weight_dtype(cfg), kv_dtype(cfg)
    closed = analytic.layer_kernels(cfg, wl) | analytic.head_kernels(cfg, wl)
    out: dict[str, KernelBench] = {}

    def add(name, fn, shapes, closed_cost=None):
        def make(seed):
            keys = jax.random.split(jax.random.key(seed), len(shapes))
            return tuple(
                s(keys[i]) if callable(s) else _rand(keys[i], *s) for i, s in enumerate(shapes)
            )

        out[name] = KernelBench(name, jax.jit(fn), make, closed_cost or closed[name])

    add("norm/attn", partial(rms_norm, eps=cfg.norm_eps), [((B, T, D), a), ((D,), w)])
    add("attn/q_proj", linear, [((B, T, D), a), ((N * H, D), w)])
    add("attn/k_proj", linear, [((B, T, D), a), ((K * H, D), w)])
    add("attn/v_proj", linear, [((B, T, D), a), ((K * H, D), w)])
    if wl.phase == "decode":
        C = S - 1
        pos = lambda key: jnp.full((B,), C, jnp.int32)  # noqa: E731 (every cached row valid)
        add("attn/scores", decode_scores, [((B, K, G, H), a), ((B, K, H), a), ((B, K, C, H), kv)])
        add(
            "attn/softmax",
            partial(decode_softmax, head_dim=H, dtype=a),
            [((B, K, G, C), jnp.float32), ((B, K, G), jnp.float32), pos],
        )
        add(
            "attn/av",
            decode_av,
            [((B, K, G, C), a), ((B, K, G), a), ((B, K, H), a), ((B, K, C, H), kv)],
        )
        attention_args = [
            ((B, K, G, H), a), ((B, K, H), a), ((B, K, H), a),
            ((B, K, C, H), kv), ((B, K, C, H), kv), pos,
        ]  # fmt: skip
        add("attention", attend_cache, attention_args, analytic.attention_cost(cfg, wl))
    else:
        add(
            "attention",
            attend_causal,
            [((B, T, K, G, H), a), ((B, T, K, H), a), ((B, T, K, H), a)],
            analytic.attention_cost(cfg, wl),
        )
    add("attn/o_proj", linear, [((B, T, N * H), a), ((D, N * H), w)])
    if cfg.gated_mlp:
        add("mlp/gate_up", linear, [((B, T, D), a), ((2 * F, D), w)])
    else:
        add("mlp/up", linear, [((B, T, D), a), ((F, D), w)])
    add("mlp/down", linear, [((B, T, F), a), ((D, F), w)])
    add("lm_head", partial(linear, out_dtype=jnp.float32), [((B, T, D), a), ((V, D), w)])
    return out


def _input_bytes(args: tuple) -> int:
    return sum(x.size * x.dtype.itemsize for x in args)


def _check_fits(what: str, needed: float) -> None:
    free = available_memory_bytes()
    if free is not None and needed > 0.8 * free:
        raise KvjaxError(
            f"{what} needs {needed / 2**30:.2f} GiB but the device has {free / 2**30:.2f} GiB "
            "free (80% usable); choose a smaller model, batch or context"
        )


def time_kernel(kb: KernelBench, budget_s: float = 1.0, rotation_bytes: int = ROTATION_BYTES):
    """Median time of one kernel, rotating input sets so their total exceeds `rotation_bytes`."""
    shapes_bytes = kb.closed.bytes  # close to the inputs' size; checked before allocating
    _check_fits(f"kernel {kb.name}", shapes_bytes)
    first = kb.make_args(0)
    per_set = max(1, _input_bytes(first))
    n_sets = int(min(MAX_SETS, max(1, math.ceil(rotation_bytes / per_set))))
    free = available_memory_bytes()
    if free is not None:
        n_sets = max(1, min(n_sets, int(0.5 * free // per_set)))
    sets = [first] + [kb.make_args(i) for i in range(1, n_sets)]
    return time_fn(kb.fn, sets, budget_s=budget_s)


def time_decode_step(cfg: ModelConfig, wl: Workload, budget_s: float = 2.0) -> TimingStats:
    """The whole decode step (attend over a random cache, then the donated append)."""
    from flax import nnx

    from kvjax.nn import CompiledSteps, KVCache, Transformer

    if wl.phase != "decode":
        raise KvjaxError("time_decode_step needs phase='decode'")
    needed = analytic.weight_bytes(cfg) + analytic.kv_cache_bytes(cfg, wl.context, wl.batch)
    _check_fits(f"the {cfg.name} decode step (weights + KV cache)", needed)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    steps = CompiledSteps(model)
    cache = model.init_cache(wl.batch, wl.context - 1)
    keys = jax.random.split(jax.random.key(1), 2 * cache.num_layers)
    cache = KVCache(
        k=tuple(_rand(keys[i], x.shape, x.dtype) for i, x in enumerate(cache.k)),
        v=tuple(_rand(keys[-1 - i], x.shape, x.dtype) for i, x in enumerate(cache.v)),
        pos=jnp.zeros((wl.batch,), jnp.int32),
    )
    tokens = jax.random.randint(jax.random.key(2), (wl.batch,), 0, cfg.vocab_size, jnp.int32)

    def step(cache):
        _, new_k, new_v = steps.attend(steps.state, tokens, cache)
        # rewind to keep writing inside the cache: every step is the same step
        return steps.append(cache, new_k, new_v).with_positions(jnp.zeros_like(cache.pos))

    stats, _ = time_loop(step, cache, budget_s=budget_s)
    return stats


def place(
    name: str,
    closed: KernelCost,
    stats: TimingStats,
    ceilings: ChipSpec,
    dtype: str,
    chip: ChipSpec | None = None,
    layers: int = 1,
) -> dict[str, Any]:
    """One measured point on the measured roofline (and on a named chip's, if given)."""
    flops, bytes_ = closed.flops * layers, closed.bytes * layers
    peak, bw = ceilings.peak(dtype), ceilings.bandwidth_bytes_per_s
    bound_s = roofline.bound_time_s(flops, bytes_, peak, bw)
    point = {
        "kernel": name,
        "median_s": stats.median_s,
        "min_s": stats.min_s,
        "iqr_s": stats.iqr_s,
        "runs": stats.runs,
        "closed_flops": flops,
        "closed_bytes": bytes_,
        "bound_s": bound_s,
        "bound": roofline.bound_side(flops, bytes_, peak, bw),
        "achieved_flops_per_s": flops / stats.median_s,
        "achieved_bytes_per_s": bytes_ / stats.median_s,
        "fraction_of_bound": bound_s / stats.median_s,
        "device": stats.device,
    }
    if chip is not None:
        point["chip_bound_s"] = roofline.bound_time_s(
            flops, bytes_, chip.peak(dtype), chip.bandwidth_bytes_per_s
        )
    return point


def bench_point(
    cfg: ModelConfig,
    wl: Workload,
    ceilings: ChipSpec,
    *,
    kernels: list[str] | None = None,
    include_step: bool = True,
    budget_s: float = 1.0,
    chip: ChipSpec | None = None,
) -> list[dict[str, Any]]:
    """Measured points of one (config, workload): the chosen kernels and the whole step."""
    dtype = analytic.compute_dtype(cfg)
    benches = kernel_benches(cfg, wl)
    wanted = kernels or list(benches)
    unknown = [k for k in wanted if k not in benches and k != "step"]
    if unknown:
        raise KvjaxError(
            f"unknown kernel(s) {', '.join(unknown)}; allowed: {', '.join(benches)}, step"
        )
    traced = traced_bytes_per_kernel(cfg, wl)
    points = []
    for name in wanted:
        if name == "step":
            continue
        stats = time_kernel(benches[name], budget_s=budget_s)
        points.append(place(name, benches[name].closed, stats, ceilings, dtype, chip))
    if include_step and wl.phase == "decode" and (kernels is None or "step" in kernels):
        stats = time_decode_step(cfg, wl, budget_s=2 * budget_s)
        step = analytic.step_cost(cfg, wl)
        closed = KernelCost("step", step.flops, step.bytes)
        points.append(place("step", closed, stats, ceilings, dtype, chip))
    for p in points:
        p["num_kv_heads"] = cfg.num_kv_heads
        p["traced_bytes"] = traced.get(p["kernel"])
    return points


def traced_bytes_per_kernel(cfg: ModelConfig, wl: Workload) -> dict[str, float]:
    """XLA's lowered bytes of one layer's kernels (and of the whole step), for the bench table."""
    from kvjax.cost import trace_step

    trace = trace_step(cfg, wl.phase, wl.batch, wl.context, layers="one")
    per_layer = {}
    for k in trace.kernels:
        if k.layer in (None, 0):  # one copy of each layer kernel, plus the head kernels
            per_layer[k.kernel] = per_layer.get(k.kernel, 0.0) + k.bytes
    per_layer["attention"] = sum(per_layer.get(n, 0.0) for n in analytic.ATTENTION_KERNELS)
    per_layer["step"] = trace.total.bytes
    return per_layer
