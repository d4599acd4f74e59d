"""The sharded program as `kvjax.traced.sharded` compiles it, from abstract shapes: the model set up
as `kvjax.nn.sharding.shard_model` sets up a real one (row blocks, expert axis), its parameters,
tokens and cache carrying their shardings, the step split into the jits `CompiledSteps` serves it
as, and the bytes each device holds (no devices needed: an abstract mesh)."""

from __future__ import annotations

import math

import jax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kvjax.devices import batch_per_replica
from kvjax.model.config import ModelConfig
from kvjax.nn import sharding as sh
from kvjax.nn.transformer import abstract_model
from kvjax.traced.by_kind import by_layer_kind
from kvjax.traced.step import step_fn


def sharded_step(
    cfg: ModelConfig, mesh, phase: str, batch: int, context: int, expert_parallel: bool = False
):
    """`kvjax.traced.step.step_fn` of the model set up as `shard_model` sets up a real one, its
    abstract args carrying their shardings: (function, args, graphdef)."""
    model = _sharded_abstract_model(cfg, mesh, expert_parallel)
    step, (state, tokens, cache) = step_fn(cfg, phase, batch, context, model=model)
    tokens_spec = P(sh.DATA) if phase == "decode" else P(sh.DATA, None)
    args = (
        _with_shardings(state, _param_shardings(state, mesh, expert_parallel)),
        _with_shardings(tokens, NamedSharding(mesh, tokens_spec)),
        _with_shardings(cache, sh.cache_shardings(cache, mesh)),
    )
    return step, args, nnx.graphdef(model)


def _sharded_abstract_model(cfg: ModelConfig, mesh, expert_parallel: bool = False):
    model = abstract_model(cfg)
    sh.set_layout(model, mesh.shape[sh.KV] * mesh.shape[sh.GRP], expert_parallel)
    return model


def _param_shardings(state, mesh, expert_parallel: bool = False):
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(
            mesh, sh.param_spec(sh._names(path), x.ndim, expert_parallel)
        ),
        state,
    )


def _with_shardings(tree, shardings):
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def shard_bytes(tree) -> int:
    """Bytes one device holds of the abstract sharded arrays in `tree` (shardings are even, so
    every device holds the same)."""
    return sum(
        math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
        for x in jax.tree_util.tree_leaves(tree)
    )


def sharded_memory(
    cfg: ModelConfig, tp: int, dp: int, batch: int, context: int, expert_parallel: bool = False
) -> dict:
    """Per-device weights and KV cache (context rows) of the sharded model, read from the
    shardings it is placed with; no devices needed (an abstract mesh). Read from one and two
    layers of each kind the model has, extrapolated (`kvjax.traced.by_kind.by_layer_kind`)."""
    mesh = sh.abstract_mesh(cfg, tp, dp)
    batch_per_replica(batch, dp)
    return by_layer_kind(cfg, lambda c: _held(c, mesh, batch, context, expert_parallel))[0]


def _held(cfg: ModelConfig, mesh, batch: int, context: int, expert_parallel: bool) -> dict:
    model = _sharded_abstract_model(cfg, mesh, expert_parallel)
    state = nnx.state(model)
    cache = jax.eval_shape(lambda: model.init_cache(batch, context))
    kv = sh.cache_shardings(cache, mesh)
    return {
        "weight_bytes_per_device": shard_bytes(
            _with_shardings(state, _param_shardings(state, mesh, expert_parallel))
        ),
        "kv_cache_bytes_per_device": shard_bytes(  # the cached rows, not the positions
            _with_shardings(_rows(cache), _rows(kv))
        ),
    }


def _rows(cache):
    """The cache's per-token arrays: K and V, or MLA's latents and RoPE keys (of a hybrid, its
    attention layers')."""
    cache = getattr(cache, "kv", cache)
    return (cache.latent, cache.k_rope) if hasattr(cache, "latent") else (cache.k, cache.v)


def served_pieces(
    cfg: ModelConfig, mesh, phase: str, batch: int, context: int, expert_parallel: bool = False
):
    """The jits `CompiledSteps` runs for one step, as (function, abstract args, donated args):
    decode = attend (the cache only read) + append (the cache donated); prefill with the cache
    donated. Compiled together, XLA:CPU would copy the cache (DESIGN.md)."""
    step, (state, tokens, cache), graphdef = sharded_step(
        cfg, mesh, phase, batch, context, expert_parallel
    )
    if phase != "decode":
        return [(step, (state, tokens, cache), (2,))]

    def attend(state, tokens, cache):
        return nnx.merge(graphdef, state).decode_logits(tokens, cache)

    def append(cache, new_k, new_v):
        return cache.append(new_k, new_v)

    with jax.set_mesh(mesh):
        _, new_k, new_v = jax.eval_shape(attend, state, tokens, cache)

    rows_k, rows_v = _row_shardings(mesh, cache, new_k, new_v)
    new_k, new_v = _with_shardings(new_k, rows_k), _with_shardings(new_v, rows_v)
    return [(attend, (state, tokens, cache), ()), (append, (cache, new_k, new_v), (0,))]


def _row_shardings(mesh, cache, new_k, new_v):
    """The decode step's new rows as the cache holds them: K/V rows [B, K, H] over "data" and
    "kv", MLA's latents [B, A] by sequence; a hybrid's state layers their conv inputs [B, C, X]
    (DeltaNet's channels in tp blocks) and states [B, J, ...] split by head."""

    def kv_row(x):
        spec = P(sh.DATA, sh.KV, None) if x.ndim == 3 else P(sh.DATA, *[None] * (x.ndim - 1))
        return NamedSharding(mesh, spec)

    if not hasattr(cache, "state"):
        return jax.tree_util.tree_map(kv_row, new_k), jax.tree_util.tree_map(kv_row, new_v)
    conv = NamedSharding(mesh, P(sh.DATA, None, sh.MODEL))
    heads = NamedSharding(mesh, P(sh.DATA, sh.MODEL))
    out_k, out_v = [], []
    for i, (k, v) in enumerate(zip(new_k, new_v, strict=True)):
        attention, state = i in cache.attn_layers, i in cache.state_layers
        if attention and state:  # H: (row, conv), (row, state)
            out_k.append((kv_row(k[0]), conv))
            out_v.append((kv_row(v[0]), heads if v[1] is not None else None))
        elif state:
            out_k.append(conv)
            out_v.append(heads if v is not None else None)
        else:
            out_k.append(kv_row(k))
            out_v.append(kv_row(v))
    return tuple(out_k), tuple(out_v)
