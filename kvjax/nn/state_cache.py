"""A hybrid's cache: the KV cache of its attention layers beside the flat states of its
state layers: per D or H layer a conv cache [B, w-1, X] (the last w-1 inputs of the short causal
convolution, in the activation dtype) and a recurrent state (f32: DeltaNet [B, J, dk, dv], Mamba-2
[B, J, P, N]); per C layer (LFM2) a conv cache only. The states do not grow with S: a decode step
reads and rewrites them whole (`kvjax.analytic.hybrid.state_layer_bytes` counts the same bytes).

Offers the `KVCache` protocol the model and the runners drive (`layer`, `layer_window`,
`write_prefix`, `with_positions`, `append`, `pos`, `batch_size`, `max_len`, `nbytes`), indexed by
model layer, plus `state_layer` / `write_state` for the mixers. `append(new_k, new_v)` takes per
model layer what that layer writes: an attention layer its K and V rows (as `KVCache.append`), a
state layer its new conv cache (new_k) and state (new_v), an H layer (attention and Mamba-2) the
pairs (k row, conv) and (v row, state).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig
from kvjax.model.hybrid import ATTENTION_KINDS, STATE_KINDS, conv_channels
from kvjax.nn.kv_cache import KVCache, check_cache_size
from kvjax.nn.layers import act_dtype, kv_dtype


def state_shape(cfg: ModelConfig, kind: str, batch_size: int) -> tuple[int, ...] | None:
    """The recurrent state of one layer: DeltaNet [B, J, dk, dv], Mamba-2 [B, J, P, N]."""
    if kind == "D":
        return (batch_size, cfg.state_heads, cfg.state_key_dim, cfg.state_value_dim)
    if kind == "H":
        return (batch_size, cfg.state_heads, cfg.state_value_dim, cfg.state_key_dim)
    return None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HybridCache:
    kv: KVCache  # the attention layers' (entry j: model layer attn_layers[j])
    conv: tuple[jax.Array, ...]  # per state layer (entry j: model layer state_layers[j])
    state: tuple[jax.Array | None, ...]  # per state layer; None for a C layer
    attn_layers: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))
    state_layers: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch_size: int, max_len: int) -> HybridCache:
        check_cache_size(batch_size, max_len)
        kinds = [cfg.layer_kind(i) for i in range(cfg.num_layers)]
        attn = tuple(i for i, k in enumerate(kinds) if k in ATTENTION_KINDS)
        states = tuple(i for i, k in enumerate(kinds) if k != "A")
        if not attn:
            raise KvjaxError(
                f"layer_kinds={cfg.layer_kinds!r} has no attention layer (A or H): kvjax's model "
                "keeps positions in the attention layers' cache; add one"
            )
        kv = KVCache.zeros(
            len(attn),
            batch_size,
            cfg.num_kv_heads,
            max_len,
            cfg.head_dim,
            kv_dtype(cfg),
            scales=cfg.kv_scale_kind,
            layer_ids=attn,
        )
        w = cfg.conv_kernel - 1
        conv = tuple(
            jnp.zeros((batch_size, w, conv_channels(cfg, kinds[i])), act_dtype(cfg)) for i in states
        )
        state = tuple(
            None
            if kinds[i] not in STATE_KINDS
            else jnp.zeros(state_shape(cfg, kinds[i], batch_size), jnp.float32)
            for i in states
        )
        return cls(kv, conv, state, attn, states)

    # -- the KVCache protocol, by model layer ----------------------------------------------------
    @property
    def pos(self) -> jax.Array:
        return self.kv.pos

    @property
    def batch_size(self) -> int:
        return self.kv.batch_size

    @property
    def max_len(self) -> int:
        return self.kv.max_len

    @property
    def num_layers(self) -> int:
        return max(self.attn_layers + self.state_layers) + 1

    @property
    def nbytes(self) -> int:
        arrays = [x for x in (*self.conv, *self.state) if x is not None]
        return self.kv.nbytes + sum(x.size * x.dtype.itemsize for x in arrays)

    @property
    def state_nbytes(self) -> int:
        """The flat part: conv caches and recurrent states."""
        return self.nbytes - self.kv.nbytes

    def _attn(self, layer: int) -> int:
        return self.attn_layers.index(layer)

    def layer(self, layer: int) -> tuple:
        return self.kv.layer(self._attn(layer))

    def layer_window(self, layer: int) -> int:
        return self.kv.layer_window(self._attn(layer))

    def write_prefix(self, layer: int, k_BTKH, v_BTKH, lengths_B=None) -> HybridCache:
        kv = self.kv.write_prefix(self._attn(layer), k_BTKH, v_BTKH, lengths_B)
        return dataclasses.replace(self, kv=kv)

    def with_positions(self, pos_B: jax.Array) -> HybridCache:
        return dataclasses.replace(self, kv=self.kv.with_positions(pos_B))

    def write_rows(self, layer: int, k_BTKH, v_BTKH) -> HybridCache:
        """Extend: an attention layer's T rows at pos .. pos + T - 1 (`KVCache.write_rows`)."""
        return dataclasses.replace(self, kv=self.kv.write_rows(self._attn(layer), k_BTKH, v_BTKH))

    # -- speculative decoding: what a rejected draft rolls back to --------------------------------
    def snapshot(self) -> tuple:
        """The flat states and the positions: an extend step over draft tokens overwrites the
        states (they cannot be recomputed backwards), so a verifier keeps this and restores it
        when drafts are rejected, then extends by the accepted tokens."""
        return self.conv, self.state, self.kv.pos

    def restore(self, snapshot: tuple) -> HybridCache:
        """The states and positions of `snapshot`; the attention rows written after it lie past
        the positions and are overwritten by the next write."""
        conv, state, pos = snapshot
        return dataclasses.replace(self, conv=conv, state=state, kv=self.kv.with_positions(pos))

    # -- the state layers ------------------------------------------------------------------------
    def state_layer(self, layer: int) -> tuple[jax.Array, jax.Array | None]:
        """(conv cache, recurrent state) of model layer `layer`."""
        j = self.state_layers.index(layer)
        return self.conv[j], self.state[j]

    def write_state(self, layer: int, conv_BWX: jax.Array, state) -> HybridCache:
        j = self.state_layers.index(layer)
        conv = self.conv[:j] + (conv_BWX.astype(self.conv[j].dtype),) + self.conv[j + 1 :]
        if state is not None:
            state = state.astype(self.state[j].dtype)
        return dataclasses.replace(
            self, conv=conv, state=self.state[:j] + (state,) + self.state[j + 1 :]
        )

    def append(self, new_k: tuple, new_v: tuple) -> HybridCache:
        """Decode: every layer's writes (see the module docstring), then pos + 1."""
        rows_k, rows_v, out = [], [], self
        for i, (k, v) in enumerate(zip(new_k, new_v, strict=True)):
            attention, state = i in self.attn_layers, i in self.state_layers
            if attention and state:  # H: (k row, conv), (v row, state)
                (k, conv), (v, s) = k, v
            elif state:
                conv, s = k, v
            if attention:
                rows_k.append(k)
                rows_v.append(v)
            if state:
                out = out.write_state(i, conv, s)
        return dataclasses.replace(out, kv=self.kv.append(tuple(rows_k), tuple(rows_v)))
