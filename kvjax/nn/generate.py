"""Greedy and temperature decoding with jitted prefill and decode steps.

The cache is donated to every step that writes it (prefill and the row append), so XLA updates it
in place; the attention step only reads it.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvjax.errors import KvjaxError
from kvjax.nn import sharding
from kvjax.nn.kv_cache import KVCache
from kvjax.nn.transformer import Transformer


def _sample(logits_BV: jax.Array, temperature: float, key: jax.Array | None) -> jax.Array:
    if temperature == 0.0:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, logits_BV / temperature, axis=-1).astype(jnp.int32)


class CompiledSteps:
    """The jitted steps of one model: prefill (cache donated), attend (cache read), append
    (cache donated), extend (T tokens on a cache, donated). Also what the timing and trace
    views compile."""

    def __init__(self, model: Transformer):
        self.graphdef, self.state = nnx.split(model)
        g = self.graphdef

        @partial(jax.jit, donate_argnums=(2,))
        def prefill(state, tokens_BT, cache, lengths_B):
            return nnx.merge(g, state).prefill(tokens_BT, cache, lengths_B)

        @jax.jit
        def attend(state, tokens_B, cache):
            return nnx.merge(g, state).decode_logits(tokens_B, cache)

        @partial(jax.jit, donate_argnums=(0,))
        def append(cache, new_k, new_v):
            return cache.append(new_k, new_v)

        @partial(jax.jit, donate_argnums=(2,))
        def extend(state, tokens_BT, cache):
            return nnx.merge(g, state).extend(tokens_BT, cache)

        self.prefill, self.attend, self.append, self.extend = prefill, attend, append, extend

    def decode(self, tokens_B: jax.Array, cache: KVCache):
        logits_BV, new_k, new_v = self.attend(self.state, tokens_B, cache)
        return logits_BV, self.append(cache, new_k, new_v)


def generate(
    model: Transformer,
    prompt_BT: jax.Array,
    steps: int,
    *,
    temperature: float = 0.0,
    rng: jax.Array | None = None,
    lengths_B: jax.Array | None = None,
    max_len: int | None = None,
    use_cache: bool = True,
) -> jax.Array:
    """`steps` new tokens per sequence, [B, steps].

    Greedy at temperature 0, else sampled with `rng`. Prompts of different lengths are
    right-padded and given as `lengths_B`. `use_cache=False` reruns the full forward for every
    token (the reference the cached path is tested against).
    """
    prompt_BT = jnp.asarray(prompt_BT, jnp.int32)
    if prompt_BT.ndim != 2:
        raise KvjaxError(f"prompt_BT must be [B, T], got shape {tuple(prompt_BT.shape)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise KvjaxError(f"steps={steps!r} must be a positive integer")
    if temperature < 0:
        raise KvjaxError(f"temperature={temperature} must be >= 0")
    if temperature > 0 and rng is None:
        raise KvjaxError("temperature > 0 needs rng=jax.random.key(...)")
    B, T = prompt_BT.shape
    lengths = np.full((B,), T) if lengths_B is None else np.asarray(lengths_B)
    if lengths.shape != (B,) or lengths.min() < 1 or lengths.max() > T:
        raise KvjaxError(f"lengths_B must be {B} integers in 1 .. T={T}, got {lengths.tolist()}")
    needed = int(lengths.max()) + steps - 1
    max_len = max(T, needed) if max_len is None else max_len
    cfg = model.cfg  # a cache whose every layer rolls over its window never fills
    span = cfg.sliding_window + cfg.sink_tokens
    rolls = cfg.num_sliding_layers == cfg.num_layers and max_len >= span
    if (needed > max_len and not rolls) or T > max_len:
        raise KvjaxError(
            f"max_len={max_len} is too short: the prompt (T={T}) plus {steps} steps needs "
            f"{max(needed, T)} positions"
        )
    keys = jax.random.split(rng, steps) if temperature > 0 else [None] * steps
    if not use_cache:
        return _generate_uncached(model, prompt_BT, lengths, steps, temperature, keys)

    mesh = sharding.model_mesh(model)
    if mesh is None:
        return _generate_cached(model, prompt_BT, lengths, steps, temperature, keys, max_len, None)
    with jax.set_mesh(mesh):  # a sharded model: its activations and cache on the same mesh
        return _generate_cached(model, prompt_BT, lengths, steps, temperature, keys, max_len, mesh)


def _generate_cached(model, prompt_BT, lengths, steps, temperature, keys, max_len, mesh):
    B = prompt_BT.shape[0]
    compiled = CompiledSteps(model)
    if mesh is None:
        cache = model.init_cache(B, max_len)
    else:
        cache = sharding.init_cache(model, B, max_len, mesh)
    lengths_j = jnp.asarray(lengths, jnp.int32)
    logits_BTV, cache = compiled.prefill(compiled.state, prompt_BT, cache, lengths_j)
    last_BV = logits_BTV[jnp.arange(B), lengths_j - 1]
    out = [_sample(last_BV, temperature, keys[0])]
    for step in range(1, steps):
        logits_BV, cache = compiled.decode(out[-1], cache)
        out.append(_sample(logits_BV, temperature, keys[step]))
    return jnp.stack(out, axis=1)


def _generate_uncached(model, prompt_BT, lengths, steps, temperature, keys):
    forward = nnx.jit(lambda m, t: m(t))
    seqs = [list(np.asarray(prompt_BT[b, : lengths[b]])) for b in range(prompt_BT.shape[0])]
    out = []
    for step in range(steps):
        last = []
        for seq in seqs:  # each sequence alone: no padding to get wrong
            logits_1TV = forward(model, jnp.asarray([seq], jnp.int32))
            last.append(logits_1TV[0, -1])
        tokens_B = _sample(jnp.stack(last), temperature, keys[step])
        for seq, tok in zip(seqs, np.asarray(tokens_B), strict=True):
            seq.append(int(tok))
        out.append(tokens_B)
    return jnp.stack(out, axis=1)
