"""The KV cache: per layer K and V of layout (B, K, S, H), plus each sequence's position.

(B, K, S, H) keeps a kv head's positions contiguous, so decode attention reads each head's S x H
block without a transpose (DESIGN.md: (B, S, K, H) was ~10x slower on CPU).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from kvjax import kernels
from kvjax.errors import KvjaxError

MAX_POSITIONS = 2**31 - 1  # positions are int32


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    k: tuple[jax.Array, ...]  # per layer, [B, K, S, H] in the config's KV dtype
    v: tuple[jax.Array, ...]
    pos: jax.Array  # [B] int32: positions filled so far (the next token's position)

    @classmethod
    def zeros(
        cls, num_layers: int, batch_size: int, num_kv_heads: int, max_len: int, head_dim: int, dtype
    ) -> KVCache:
        for name, value in (("batch_size", batch_size), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise KvjaxError(f"{name}={value!r} must be a positive integer")
        if max_len > MAX_POSITIONS:
            raise KvjaxError(
                f"max_len={max_len} exceeds the model's int32 positions (at most {MAX_POSITIONS})"
            )
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        return cls(
            k=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
            v=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
            pos=jnp.zeros((batch_size,), jnp.int32),
        )

    @property
    def batch_size(self) -> int:
        return self.k[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    @property
    def num_layers(self) -> int:
        return len(self.k)

    @property
    def nbytes(self) -> int:
        return sum(x.size * x.dtype.itemsize for x in (*self.k, *self.v))

    def write_prefix(self, layer: int, k_BTKH: jax.Array, v_BTKH: jax.Array) -> KVCache:
        """Prefill: rows 0..T-1 of one layer (positions are set by `with_positions`)."""
        with jax.named_scope(kernels.layer_scope(layer)):  # a layout change, outside the kernel
            k_BKTH = jnp.swapaxes(k_BTKH, 1, 2)
            v_BKTH = jnp.swapaxes(v_BTKH, 1, 2)
        with jax.named_scope(f"{kernels.layer_scope(layer)}/{kernels.KV_WRITE}"):
            k_BKTH = k_BKTH.astype(self.k[layer].dtype)
            v_BKTH = v_BKTH.astype(self.v[layer].dtype)
            k = jax.lax.dynamic_update_slice(self.k[layer], k_BKTH, (0, 0, 0, 0))
            v = jax.lax.dynamic_update_slice(self.v[layer], v_BKTH, (0, 0, 0, 0))
        return dataclasses.replace(
            self,
            k=self.k[:layer] + (k,) + self.k[layer + 1 :],
            v=self.v[:layer] + (v,) + self.v[layer + 1 :],
        )

    def with_positions(self, pos_B: jax.Array) -> KVCache:
        return dataclasses.replace(self, pos=pos_B.astype(jnp.int32))

    def append(self, k_new: tuple[jax.Array, ...], v_new: tuple[jax.Array, ...]) -> KVCache:
        """Decode: write one row per sequence per layer ([B, K, H]) at `pos`, then advance pos.

        Only B*K*H elements per layer are written; jitted with the cache donated, XLA updates
        the buffers in place.
        """
        b = jnp.arange(self.batch_size)
        ks, vs = [], []
        for layer, (kc, vc, kn, vn) in enumerate(zip(self.k, self.v, k_new, v_new, strict=True)):
            with jax.named_scope(f"{kernels.layer_scope(layer)}/{kernels.KV_WRITE}"):
                ks.append(kc.at[b, :, self.pos, :].set(kn.astype(kc.dtype)))
                vs.append(vc.at[b, :, self.pos, :].set(vn.astype(vc.dtype)))
        return KVCache(k=tuple(ks), v=tuple(vs), pos=self.pos + 1)
