"""The whole decode step timed as it is served: attend over the cache (read only), then the
donated append, on the machine at hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kvjax import analytic
from kvjax.analytic import Workload
from kvjax.config import ModelConfig
from kvjax.errors import KvjaxError
from kvjax.measured.kernels import check_fits, random_array
from kvjax.measured.timing import TimingStats, time_loop


def time_decode_step(cfg: ModelConfig, wl: Workload, budget_s: float = 2.0) -> TimingStats:
    """The whole decode step (attend over a random cache, then the donated append)."""
    from flax import nnx

    from kvjax.nn import CompiledSteps, KVCache, Transformer

    if wl.phase != "decode":
        raise KvjaxError("time_decode_step needs phase='decode'")
    needed = analytic.weight_bytes(cfg) + analytic.kv_cache_bytes(cfg, wl.context, wl.batch)
    check_fits(f"the {cfg.name} decode step (weights + KV cache)", needed)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    steps = CompiledSteps(model)
    cache = model.init_cache(wl.batch, wl.context - 1)
    keys = jax.random.split(jax.random.key(1), 2 * cache.num_layers)
    cache = KVCache(
        k=tuple(random_array(keys[i], x.shape, x.dtype) for i, x in enumerate(cache.k)),
        v=tuple(random_array(keys[-1 - i], x.shape, x.dtype) for i, x in enumerate(cache.v)),
        pos=jnp.zeros((wl.batch,), jnp.int32),
    )
    tokens = jax.random.randint(jax.random.key(2), (wl.batch,), 0, cfg.vocab_size, jnp.int32)

    def step(cache):
        _, new_k, new_v = steps.attend(steps.state, tokens, cache)
        # rewind to keep writing inside the cache: every step is the same step
        return steps.append(cache, new_k, new_v).with_positions(jnp.zeros_like(cache.pos))

    stats, _ = time_loop(step, cache, budget_s=budget_s)
    return stats
