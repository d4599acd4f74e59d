"""The step as it is served, on the machine at hand: decode = attend over the cache (read only),
then the donated append; prefill = the prompt into a donated cache; extend = T tokens on a
donated cache holding S - T. Used by the step timing
below and by the in-situ profile (`kvjax.measured.profile`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kvjax import analytic
from kvjax.analytic import Workload
from kvjax.errors import KvjaxError
from kvjax.measured.kernels import check_fits
from kvjax.measured.timing import TimingStats, random_array, random_inputs, time_loop
from kvjax.model.config import ModelConfig
from kvjax.traced.step import cache_len

REWINDS = 256  # fresh position arrays made at a time for the decode step's rewind


@dataclass
class ServedStep:
    """One step of a model with random weights and a random cache, ready to run repeatedly:
    `carry = step(carry)`. `jits` maps each jitted function's name to it and its example
    arguments (to read its compiled module)."""

    step: Callable[[Any], Any]
    carry: Any
    jits: dict[str, tuple[Any, tuple]]


def _with_pos(cache, pos_B):
    """The cache with positions `pos_B` (None: no positions, to flatten the arrays alone); a
    hybrid's (`kvjax.nn.state_cache.HybridCache`) are its attention layers' KV cache's."""
    if hasattr(cache, "kv"):
        return dataclasses.replace(cache, kv=dataclasses.replace(cache.kv, pos=pos_B))
    return dataclasses.replace(cache, pos=pos_B)


def served_step(cfg: ModelConfig, wl: Workload, seed: int = 0) -> ServedStep:
    """The step of `wl.phase` as `kvjax.nn.generate` runs it. Refused before anything is
    allocated if the weights and cache do not fit this device's free memory."""
    from flax import nnx

    from kvjax.nn import CompiledSteps, Transformer

    rows = cache_len(wl.phase, wl.context)
    needed = analytic.weight_bytes(cfg) + analytic.cache_bytes(cfg, rows, wl.batch)
    check_fits(f"the {cfg.name} {wl.phase} step (weights + cache)", needed)
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    steps = CompiledSteps(model)
    empty = model.init_cache(wl.batch, rows)
    # every cache array random (K and V, or MLA's latents and RoPE keys), positions 0
    arrays, treedef = jax.tree_util.tree_flatten(_with_pos(empty, None))
    keys = random_inputs(seed + 1, len(arrays))
    cache = _with_pos(
        jax.tree_util.tree_unflatten(
            treedef, [random_array(k, x.shape, x.dtype) for k, x in zip(keys, arrays, strict=True)]
        ),
        jnp.zeros((wl.batch,), jnp.int32),
    )
    ids = jnp.asarray(
        np.random.default_rng(seed + 2).integers(
            0, cfg.vocab_size, (wl.batch, wl.query_len), dtype=np.int32
        )
    )
    if wl.phase == "decode":
        tokens_B = ids[:, 0]
        # Every step is the same step: positions are rewound to 0 to keep writing inside the
        # cache. The append donates the cache, positions included, so each step takes a fresh
        # zeros array made beforehand (no device work inside the timed step).
        rewinds = iter([])

        def step(cache):
            nonlocal rewinds
            _, new_k, new_v = steps.attend(steps.state, tokens_B, cache)
            pos_B = next(rewinds, None)
            if pos_B is None:
                rewinds = iter([jnp.zeros((wl.batch,), jnp.int32) for _ in range(REWINDS)])
                pos_B = next(rewinds)
            return _with_pos(steps.append(cache, new_k, new_v), pos_B)

        _, new_k, new_v = jax.eval_shape(steps.attend, steps.state, tokens_B, cache)
        jits = {
            "attend": (steps.attend, (steps.state, tokens_B, cache)),
            "append": (steps.append, (cache, new_k, new_v)),
        }
    elif wl.phase == "extend":
        # T new tokens on S - T cached, the cache of S rows donated; each step is the same step:
        # positions are rewound to S - T from fresh arrays made beforehand, as decode's are
        held = jnp.int32(wl.context - wl.query_len)
        rewinds = iter([])

        def step(cache):
            nonlocal rewinds
            pos_B = next(rewinds, None)
            if pos_B is None:
                rewinds = iter([jnp.full((wl.batch,), held) for _ in range(REWINDS)])
                pos_B = next(rewinds)
            return steps.extend(steps.state, ids, _with_pos(cache, pos_B))[1]

        cache = _with_pos(cache, jnp.full((wl.batch,), held))
        jits = {"extend": (steps.extend, (steps.state, ids, cache))}
    else:
        lengths_B = jnp.full((wl.batch,), wl.context, jnp.int32)

        def step(cache):
            return steps.prefill(steps.state, ids, cache, lengths_B)[1]

        jits = {"prefill": (steps.prefill, (steps.state, ids, cache, lengths_B))}
    return ServedStep(step, cache, jits)


def time_decode_step(cfg: ModelConfig, wl: Workload, budget_s: float = 2.0) -> TimingStats:
    """The whole decode step (attend over a random cache, then the donated append), or the
    extend step (T tokens written and attended on a random cache, donated)."""
    if wl.phase not in ("decode", "extend"):
        raise KvjaxError(f"time_decode_step needs phase='decode' or 'extend' (got {wl.phase!r})")
    served = served_step(cfg, wl)
    stats, _ = time_loop(served.step, served.carry, budget_s=budget_s)
    return stats
