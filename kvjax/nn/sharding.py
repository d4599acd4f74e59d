"""Megatron-style tensor parallelism (and data parallelism) of the Transformer with jax.sharding.

The SPMD partitioner does the work: parameters and the KV cache are placed with `NamedSharding`s
on a mesh, a few `with_sharding_constraint`s inside the model pin the activations, and XLA inserts
the collectives. Mesh axes:

- "data": the batch (dp-way; no collectives at inference),
- "kv": KV heads, gcd(tp, K)-way,
- "grp": query heads within a group, tp / gcd(tp, K)-way: when tp > K each KV head is replicated
  over "grp", so a device holds K / gcd(tp, K) KV heads (kvjax.analytic.parallel's closed form).

Query head n = k * G + g (the model's (K, G) order), so splitting the N * H rows of q_proj in tp
contiguous blocks over ("kv", "grp") gives device (i, j) the heads of KV heads block i and group
block j, exactly the queries that read the KV heads it holds. The MLP is split over d_ff (gate_up
and up by rows, down by columns), the embedding and LM head over the vocabulary. Each layer's
o_proj and down products then end in partial sums that XLA all-reduces.

gate_up is one (2F, D) matrix [gate; up]; split by rows, one device would get gate rows and
another up rows. `shard_model` therefore reorders its rows into tp blocks [gate_d; up_d] and tells
the MLP (`gate_up_blocks`), which splits its output per block; the product is unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from kvjax.devices import batch_per_replica
from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig

DATA, KV, GRP = "data", "kv", "grp"
MODEL = (KV, GRP)  # the tensor-parallel axes together: tp contiguous blocks, "kv" major
AXES = (DATA, KV, GRP)


def mesh_shape(cfg: ModelConfig, tp: int, dp: int = 1) -> tuple[int, int, int]:
    """(dp, kv, grp) for `tp`-way tensor and `dp`-way data parallelism, or a KvjaxError naming
    what does not divide and the tp values that would."""
    for name, value in (("tp", tp), ("dp", dp)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise KvjaxError(f"{name}={value!r} must be a positive integer")
    if cfg.is_hybrid and tp > 1:
        if set(cfg.layer_kinds) - {"A", "D"}:
            raise KvjaxError(
                f"tp={tp}: splitting Mamba-2's or LFM2's layers (layer_kinds="
                f"{cfg.layer_kinds!r}) over devices is not implemented (Gated DeltaNet's is); "
                f"use tp=1 with data parallelism (dp) and expert parallelism"
            )
        if cfg.state_groups % tp:
            raise KvjaxError(
                f"tp={tp} does not divide state_groups={cfg.state_groups} (DeltaNet's q/k "
                f"heads, split with their value heads)"
            )
    # MLA: the heads split over both axes together; no KV heads (the latent is replicated)
    K = 1 if cfg.is_mla else cfg.num_kv_heads
    allowed = [
        t
        for t in range(1, cfg.num_heads + 1)
        if cfg.num_heads % t == 0
        and (K % t == 0 or t % K == 0)
        and cfg.d_ff % t == 0
        and cfg.vocab_size % t == 0
        and (not cfg.is_moe or cfg.moe_d_ff % t == 0)
        and cfg.shared_d_ff % t == 0
    ]
    why = []
    if cfg.num_heads % tp:
        why.append(f"tp={tp} does not divide num_heads={cfg.num_heads}")
    if K % tp and tp % K:
        why.append(
            f"tp={tp} and num_kv_heads={K} do not divide one another (a device would hold part "
            "of a KV head's group; kvjax.analytic.parallel models that case in closed form only)"
        )
    if cfg.d_ff % tp:
        why.append(f"tp={tp} does not divide d_ff={cfg.d_ff}")
    if cfg.vocab_size % tp:
        why.append(f"tp={tp} does not divide vocab_size={cfg.vocab_size}")
    if cfg.is_moe and cfg.moe_d_ff % tp:
        why.append(f"tp={tp} does not divide moe_d_ff={cfg.moe_d_ff}")
    if cfg.shared_d_ff % tp:
        why.append(f"tp={tp} does not divide the shared experts' width {cfg.shared_d_ff}")
    if why:
        raise KvjaxError(
            f"{cfg.name}: {'; '.join(why)}; the sharded model allows tp in "
            f"{{{', '.join(map(str, allowed))}}}"
        )
    kv = math.gcd(tp, K)
    return dp, kv, tp // kv


def make_mesh(cfg: ModelConfig, tp: int, dp: int = 1, devices: Sequence | None = None) -> Mesh:
    """The ("data", "kv", "grp") mesh over dp * tp devices, with Auto axis types (the SPMD
    partitioner propagates shardings; `jax.make_mesh` defaults to Explicit, which would make
    every op name its output sharding)."""
    shape = mesh_shape(cfg, tp, dp)
    if devices is None:
        devices = jax.devices()
    need = dp * tp
    if len(devices) < need:
        raise KvjaxError(
            f"tp={tp} x dp={dp} needs {need} devices; jax sees {len(devices)} "
            f"({devices[0].platform}). On a CPU, start Python with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={need}"
        )
    return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * 3, devices=list(devices)[:need])


def abstract_mesh(cfg: ModelConfig, tp: int, dp: int = 1) -> jax.sharding.AbstractMesh:
    """The same mesh without devices: enough to read shard shapes (bytes per device)."""
    return jax.sharding.AbstractMesh(mesh_shape(cfg, tp, dp), AXES, axis_types=(AxisType.Auto,) * 3)


def tp_size(mesh: Mesh) -> int:
    return mesh.shape[KV] * mesh.shape[GRP]


# -- placement ------------------------------------------------------------------------------------
def param_spec(path: tuple[str, ...], ndim: int, expert_parallel: bool = False) -> P:
    """The PartitionSpec of one parameter, from its name in the model. MLA: the query and the
    key/value up-projections split by head, the latent down-projection (kv_a_proj, q_a_proj)
    replicated. Routed experts [E, out, in]: each one's width split like the dense MLP's, or
    under expert parallelism whole experts over "data"."""
    name = path[-1]
    if name in EXPERT_PARAMS:
        if expert_parallel:
            return P(DATA, *([None] * (ndim - 1)))
        return {
            "expert_gate_up": P(None, MODEL, None),
            "expert_down": P(None, None, MODEL),
            "expert_gate_up_bias": P(None, MODEL),
        }.get(name, P(*([None] * ndim)))
    if name in ("k_up", "v_up"):
        return P(MODEL, None, None)  # [N, U or W, A]
    # Gated DeltaNet: rows grouped by q/k head (and the conv's in tp blocks), heads' gates
    if name in ("in_proj_qkvz", "in_proj_ba", "linear_conv"):
        return P(MODEL, None)
    if name in ("dt_bias", "A_log"):
        return P(MODEL)
    if name == "linear_out_proj":
        return P(None, MODEL)
    if name in ("q_proj", "q_b_proj", "gate_up", "up", "embed", "lm_head"):
        return P(MODEL, None)  # split over output rows (vocab rows for embed / lm_head)
    if name in ("k_proj", "v_proj"):
        return P(KV, None)  # KV heads split over "kv", replicated over "grp"
    if name in ("o_proj", "down"):
        return P(None, MODEL)  # split over input columns: partial sums, all-reduced
    if name == "q_bias":
        return P(MODEL)
    if name in ("k_bias", "v_bias"):
        return P(KV)
    return P(*([None] * ndim))  # norm scales: replicated


EXPERT_PARAMS = ("expert_gate_up", "expert_down", "expert_gate_up_bias", "expert_down_bias")


def cache_spec() -> P:
    """K and V [B, K, S, H]: batch over "data", KV heads over "kv", replicated over "grp"."""
    return P(DATA, KV, None, None)


def _interleave_gate_up(w_EF: jax.Array, blocks: int) -> jax.Array:
    """[gate; up] (2F rows) -> [gate_0; up_0; gate_1; up_1; ...] in `blocks` blocks."""
    two_f, d = w_EF.shape
    f = two_f // 2
    return w_EF.reshape(2, blocks, f // blocks, d).transpose(1, 0, 2, 3).reshape(two_f, d)


def check_expert_parallel(cfg: ModelConfig, tp: int, dp: int) -> None:
    """Expert parallelism runs over data-parallel attention: experts over "data", tp = 1."""
    if not cfg.is_moe:
        raise KvjaxError(f"expert_parallel: {cfg.name} has no experts (num_experts=0)")
    if tp != 1:
        raise KvjaxError(
            f"expert_parallel with tp={tp}: experts are spread over the data-parallel attention "
            f"axis (dp), with tp=1"
        )
    if cfg.num_experts % dp:
        raise KvjaxError(f"expert_parallel: dp={dp} does not divide num_experts={cfg.num_experts}")


def shard_model(model, mesh: Mesh, expert_parallel: bool = False):
    """The model placed on `mesh`: parameters sharded (a new model; `model` is not changed).
    `expert_parallel`: the routed experts spread over "data" (dp = ep, tp = 1), each MoE layer
    dispatching its tokens with all-to-alls (`kvjax.nn.moe`)."""
    cfg: ModelConfig = model.cfg
    tp = tp_size(mesh)
    mesh_shape(cfg, tp, mesh.shape[DATA])  # a clear error before anything moves
    if expert_parallel:
        check_expert_parallel(cfg, tp, mesh.shape[DATA])
    sharded = nnx.clone(model)  # the caller's model keeps its weights and row order
    for mlp in _gated_mlps(sharded):
        if mlp.gate_up_blocks != 1:
            raise KvjaxError("shard_model needs an unsharded model (gate_up_blocks=1)")
        if not hasattr(mlp, "expert_gate_up"):
            mlp.gate_up[...] = _interleave_gate_up(mlp.gate_up[...], tp)
        elif not expert_parallel:  # the routed experts [E, 2F, D]: each one's rows in blocks
            blocks = jax.vmap(_interleave_gate_up, (0, None))
            mlp.expert_gate_up[...] = blocks(mlp.expert_gate_up[...], tp)
            if (bias := getattr(mlp, "expert_gate_up_bias", None)) is not None:
                bias[...] = blocks(bias[..., None], tp)[..., 0]
    for mixer in _conv_blocked(sharded):
        if mixer.conv_blocks != 1:
            raise KvjaxError("shard_model needs an unsharded model (conv_blocks=1)")
        mixer.linear_conv[...] = _conv_in_blocks(mixer.linear_conv[...], mixer.heads, tp)
    set_layout(sharded, tp, expert_parallel)
    graphdef, state = nnx.split(sharded)

    def place(path, x):
        spec = param_spec(_names(path), x.ndim, expert_parallel)
        return jax.device_put(x, NamedSharding(mesh, spec))

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(place, state))


def _conv_in_blocks(w_XW: jax.Array, heads: tuple[int, int, int, int], blocks: int) -> jax.Array:
    """DeltaNet's conv rows [q (K H); k (K H); v (J W)] -> [q_0; k_0; v_0; q_1; k_1; v_1; ...]."""
    K, G, H, W = heads
    q, k, v = w_XW[: K * H], w_XW[K * H : 2 * K * H], w_XW[2 * K * H :]
    parts = [t.reshape(blocks, -1, t.shape[-1]) for t in (q, k, v)]
    return jnp.concatenate(parts, axis=1).reshape(w_XW.shape)


def _conv_blocked(model) -> list:
    return [m for _, m in nnx.iter_graph(model) if hasattr(m, "conv_blocks")]


def set_layout(model, tp: int, expert_parallel: bool = False) -> None:
    """Tell the model's modules how their weights are laid out (the values are `shard_model`'s
    to reorder; an abstract model only needs this): [gate; up] rows in tp blocks, or the routed
    experts spread over "data"."""
    for mlp in _gated_mlps(model):
        if expert_parallel and hasattr(mlp, "expert_gate_up"):
            mlp.expert_axis = DATA
        else:
            mlp.gate_up_blocks = tp
    for mixer in _conv_blocked(model):
        mixer.conv_blocks = tp


def _gated_mlps(model) -> list:
    """Every module whose [gate; up] rows are split in blocks: dense MLPs, MoE experts, shared
    experts."""
    return [m for _, m in nnx.iter_graph(model) if hasattr(m, "gate_up_blocks")]


def model_mesh(model) -> Mesh | None:
    """The kvjax mesh the model's parameters are placed on (by `shard_model`), else None."""
    leaves = jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))
    sharding = getattr(leaves[0], "sharding", None) if leaves else None
    if isinstance(sharding, NamedSharding) and tuple(sharding.mesh.axis_names) == AXES:
        return sharding.mesh
    return None


def _names(path) -> tuple[str, ...]:
    out = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                out.append(str(getattr(key, attr)))
                break
    return tuple(n for n in out if n != "value")


def init_cache(model, batch_size: int, max_len: int, mesh: Mesh):
    """An empty KV cache made directly in its shards (never whole on one device)."""
    batch_per_replica(batch_size, mesh.shape[DATA], ("batch_size", "dp"))
    abstract = jax.eval_shape(lambda: model.init_cache(batch_size, max_len))
    shardings = cache_shardings(abstract, mesh)
    return jax.jit(lambda: model.init_cache(batch_size, max_len), out_shardings=shardings)()


def cache_shardings(cache, mesh: Mesh):
    if hasattr(cache, "state"):  # a hybrid: its attention cache, and per-sequence states
        # by sequence, and under tp DeltaNet's conv channels (in tp blocks) and state heads;
        # Mamba-2's and LFM2's are refused over tp (mesh_shape), so their model axes are 1
        conv = NamedSharding(mesh, P(DATA, None, MODEL))
        heads = NamedSharding(mesh, P(DATA, MODEL))
        return dataclasses.replace(
            cache,
            kv=cache_shardings(cache.kv, mesh),
            conv=tuple(conv for _ in cache.conv),
            state=tuple(None if x is None else heads for x in cache.state),
        )
    if hasattr(cache, "latent"):  # MLA: latents and RoPE keys split over sequences only
        rows = NamedSharding(mesh, P(DATA))
        return dataclasses.replace(
            cache,
            latent=tuple(rows for _ in cache.latent),
            k_rope=tuple(rows for _ in cache.k_rope),
            pos=NamedSharding(mesh, P(DATA)),
        )
    kv = NamedSharding(mesh, cache_spec())
    # scales: per token per KV head [B, K, S] as K and V are split; per tensor [] replicated
    scale = NamedSharding(mesh, P(DATA, KV, None) if cache.scales == "token_head" else P())
    return dataclasses.replace(  # keeps the cache's static fields (windows, scale kind)
        cache,
        k=tuple(kv for _ in cache.k),
        v=tuple(kv for _ in cache.v),
        k_scale=tuple(scale for _ in cache.k_scale),
        v_scale=tuple(scale for _ in cache.v_scale),
        pos=NamedSharding(mesh, P(DATA)),
    )


# -- inside the model ----------------------------------------------------------------------------
def mesh_active() -> bool:
    """Whether a kvjax mesh is set (`jax.set_mesh`): the sharded program is being traced."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and tuple(mesh.axis_names) == AXES


def constrain(x: jax.Array, *axes) -> jax.Array:
    """Pin an activation's sharding when a kvjax mesh is active (`jax.set_mesh`); otherwise
    return it untouched, so the single-device program (and its traced cost) is unchanged."""
    if not mesh_active():
        return x
    return jax.lax.with_sharding_constraint(x, P(*axes))
