"""The serving engine's device programs (`kvjax.measured.engine`) over one slotted `KVCache` of
max_batch slots: `attend` (a decode over every slot, the cache read only, greedy tokens),
`append` (the new rows written by a separate donated jit: on XLA:CPU attending and writing in
one jit copied the cache, DESIGN.md), `extend` (a chunk of one slot's prompt, the slot sliced out
of the cache) and `write_slot` (the chunk's rows written back, donated)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial


def slotted_steps(graphdef, on_trace: Callable[[], None]) -> tuple[Callable, ...]:
    """(attend, append, extend, write_slot) of the model `graphdef` describes, jitted; each
    calls `on_trace` when jax traces it (a new shape or dtype), so compilations can be counted."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    @jax.jit
    def attend(state, tokens_B, cache):
        on_trace()
        logits_BV, new_k, new_v = nnx.merge(graphdef, state).decode_logits(tokens_B, cache)
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32), new_k, new_v

    @partial(jax.jit, donate_argnums=(0,))
    def append(cache, new_k, new_v):
        on_trace()
        return cache.append(new_k, new_v)

    @jax.jit
    def extend(state, tokens_1T, cache, slot, pos, valid):
        on_trace()
        one = dataclasses.replace(
            cache,
            k=tuple(jax.lax.dynamic_slice_in_dim(k, slot, 1) for k in cache.k),
            v=tuple(jax.lax.dynamic_slice_in_dim(v, slot, 1) for v in cache.v),
            pos=pos[None],
        )
        logits_1TV, one = nnx.merge(graphdef, state).extend(tokens_1T, one)
        token = jnp.argmax(logits_1TV[0, valid - 1]).astype(jnp.int32)
        return token, one.k, one.v

    @partial(jax.jit, donate_argnums=(0,))
    def write_slot(cache, slot, k_rows, v_rows):
        on_trace()
        return dataclasses.replace(
            cache,
            k=tuple(
                jax.lax.dynamic_update_slice_in_dim(k, r, slot, 0)
                for k, r in zip(cache.k, k_rows, strict=True)
            ),
            v=tuple(
                jax.lax.dynamic_update_slice_in_dim(v, r, slot, 0)
                for v, r in zip(cache.v, v_rows, strict=True)
            ),
        )

    return attend, append, extend, write_slot
