"""MHA -> GQA/MQA checkpoint conversion (Ainslie et al., 2023): the K and V projection heads are
grouped (query heads k*G .. k*G+G-1 read KV head k, as in Hugging Face's repeat_kv) and each group
becomes one head, by mean-pooling (the paper's best), keeping the first head, or a random init.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kvjax.errors import KvjaxError
from kvjax.nn import Transformer

METHODS = ("mean", "first", "random")


def _pool(w_EI: jax.Array, bias_E, k_from: int, k_to: int, head_dim: int, method: str, key):
    """(k_from*H, I) -> (k_to*H, I): each group of k_from/k_to heads becomes one."""
    group = k_from // k_to
    w_KGHI = w_EI.reshape(k_to, group, head_dim, -1)
    b_KGH = None if bias_E is None else bias_E.reshape(k_to, group, head_dim)
    if method == "mean":
        w, b = w_KGHI.mean(axis=1), None if b_KGH is None else b_KGH.mean(axis=1)
    elif method == "first":
        w, b = w_KGHI[:, 0], None if b_KGH is None else b_KGH[:, 0]
    else:  # random, at the scale of the original heads
        std = jnp.std(w_KGHI)
        w = std * jax.random.normal(key, w_KGHI[:, 0].shape, w_EI.dtype)
        b = None if b_KGH is None else jnp.zeros_like(b_KGH[:, 0])
    return w.reshape(k_to * head_dim, -1), None if b is None else b.reshape(-1)


def convert_kv_heads(
    model: Transformer, num_kv_heads: int, method: str = "mean", seed: int = 0
) -> Transformer:
    """A new model with `num_kv_heads` KV heads; every other weight is copied unchanged."""
    cfg = model.cfg
    if method not in METHODS:
        raise KvjaxError(f"method={method!r} is not supported; allowed: {', '.join(METHODS)}")
    if num_kv_heads > cfg.num_kv_heads or cfg.num_kv_heads % num_kv_heads:
        raise KvjaxError(
            f"num_kv_heads={num_kv_heads} must divide the model's num_kv_heads="
            f"{cfg.num_kv_heads} (conversion merges groups of heads)"
        )
    new_cfg = cfg.replace(num_kv_heads=num_kv_heads)  # validates against num_heads
    new = Transformer(new_cfg, rngs=nnx.Rngs(seed))
    old_state = nnx.state(model, nnx.Param)
    new_state = nnx.state(new, nnx.Param)
    flat_old = dict(nnx.to_flat_state(old_state))
    keys = jax.random.split(jax.random.key(seed), 4 * cfg.num_layers)
    pool = {"k_proj": 0, "v_proj": 1, "k_bias": 2, "v_bias": 3}
    for path, var in nnx.to_flat_state(new_state):
        old, name = flat_old[path][...], path[-1]
        if name in pool:  # ("layers", i, "attn", name)
            key = keys[4 * path[1] + pool[name]]
            if name.endswith("proj"):
                var[...] = _pool(
                    old, None, cfg.num_kv_heads, num_kv_heads, cfg.head_dim, method, key
                )[0]
            else:
                dummy = jnp.zeros((cfg.kv_dim, 1), old.dtype)
                var[...] = _pool(
                    dummy, old, cfg.num_kv_heads, num_kv_heads, cfg.head_dim, method, key
                )[1]
        else:
            var[...] = old
    nnx.update(new, new_state)
    return new
