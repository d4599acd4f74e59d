"""The KV cache: per layer K of layout (B, K, H, S) and V of layout (B, K, S, H), plus each
sequence's position.

The layouts were decided by measurement (2-core CPU, f32, B=1, S=32768, 32 query heads of 128,
each alternative timed interleaved in one process, KV bytes / time against a `jnp.sum` read):
- K stored (B, K, H, S) makes the scores q(G, H) @ K(H, S) with S contiguous: 0.96-1.08 of the
  read rate at K=32 (G=1) against 0.53-0.63 for (B, K, S, H); 0.49 against 0.39 at K=8 (G=4);
  the whole decode attention 8-14% faster at K=8 and K=32.
- V stays (B, K, S, H): p(G, S) @ V(S, H) reads 0.53 of the read rate at K=8 against 0.08 for
  (B, K, H, S). At K=32 (G=1, MHA) (B, K, H, S) would read 1.04 against 0.43: the GQA case decides.
- (B, S, K, H) made decode attention ~10x slower (DESIGN.md). Neither layout brings a G=4
  product past ~0.5 of the read rate: XLA:CPU's small-M matrix products are the limit there.
The closed form's bytes and FLOPs do not depend on the layout; the lowered trace's do not either
(a dot reads its operands in any layout without a copy).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from kvjax import kernels
from kvjax.errors import KvjaxError

MAX_POSITIONS = 2**31 - 1  # positions are int32


def check_cache_size(batch_size: int, max_len: int) -> None:
    """A cache's batch and length, refused in one line before anything is allocated."""
    for name, value in (("batch_size", batch_size), ("max_len", max_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise KvjaxError(f"{name}={value!r} must be a positive integer")
    if max_len > MAX_POSITIONS:
        raise KvjaxError(
            f"max_len={max_len} exceeds the model's int32 positions (at most {MAX_POSITIONS})"
        )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Per layer K [B, K, H, L_i] and V [B, K, L_i, H]: L_i = max_len for a global layer, and for a
    sliding layer min(max_len, window). A sliding layer whose buffer is the whole window is
    *rolling* (`window[i] > 0`): token t is written to slot t mod window, and a decode step masks
    the slot about to be overwritten (the token `window` positions back); the others never wrap."""

    k: tuple[jax.Array, ...]  # per layer, [B, K, H, L_i] in the config's KV dtype
    v: tuple[jax.Array, ...]  # per layer, [B, K, L_i, H]
    pos: jax.Array  # [B] int32: positions filled so far (the next token's position)
    window: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))

    @classmethod
    def zeros(
        cls, num_layers: int, batch_size: int, num_kv_heads: int, max_len: int, head_dim: int,
        dtype, windows: tuple[int, ...] = (),
    ) -> KVCache:  # fmt: skip
        """`windows[i]`: layer i's sliding window (0: global); none given, every layer global."""
        check_cache_size(batch_size, max_len)
        windows = tuple(windows) or (0,) * num_layers
        lens = [min(max_len, w) if w else max_len for w in windows]

        def zeros(shape):
            return jnp.zeros(shape, dtype)

        return cls(
            k=tuple(zeros((batch_size, num_kv_heads, head_dim, n)) for n in lens),
            v=tuple(zeros((batch_size, num_kv_heads, n, head_dim)) for n in lens),
            pos=jnp.zeros((batch_size,), jnp.int32),
            window=tuple(w if w and max_len >= w else 0 for w in windows),
        )

    @property
    def batch_size(self) -> int:
        return self.k[0].shape[0]

    @property
    def max_len(self) -> int:
        """The positions a sequence can reach: the longest buffer, or unbounded (2^31 - 1) when
        every layer rolls."""
        if self.window and all(self.window):
            return MAX_POSITIONS
        return max(v.shape[2] for v, w in zip(self.v, self._windows(), strict=True) if not w)

    def _windows(self) -> tuple[int, ...]:
        return self.window or (0,) * len(self.k)

    @property
    def num_layers(self) -> int:
        return len(self.k)

    @property
    def nbytes(self) -> int:
        return sum(x.size * x.dtype.itemsize for x in (*self.k, *self.v))

    def layer(self, i: int) -> tuple[jax.Array, jax.Array]:
        return self.k[i], self.v[i]

    def layer_window(self, i: int) -> int:
        return self._windows()[i]

    def write_prefix(
        self, layer: int, k_BTKH: jax.Array, v_BTKH: jax.Array, lengths_B: jax.Array | None = None
    ) -> KVCache:
        """Prefill: rows 0..T-1 of one layer (positions are set by `with_positions`). A rolling
        layer given more tokens than its window keeps each sequence's last `window` real tokens,
        token t at slot t mod window (`lengths_B`: the real lengths of right-padded prompts)."""
        T, n = k_BTKH.shape[1], self.k[layer].shape[3]
        with jax.named_scope(kernels.layer_scope(layer)):  # a layout change, outside the kernel
            k_BKHT = jnp.transpose(k_BTKH, (0, 2, 3, 1))
            v_BKTH = jnp.swapaxes(v_BTKH, 1, 2)
        with jax.named_scope(f"{kernels.layer_scope(layer)}/{kernels.KV_WRITE}"):
            k_BKHT = k_BKHT.astype(self.k[layer].dtype)
            v_BKTH = v_BKTH.astype(self.v[layer].dtype)
            if T <= n:
                k = jax.lax.dynamic_update_slice(self.k[layer], k_BKHT, (0, 0, 0, 0))
                v = jax.lax.dynamic_update_slice(self.v[layer], v_BKTH, (0, 0, 0, 0))
            else:  # slot s holds the last real token t < length with t = s (mod n)
                if lengths_B is None:
                    lengths_B = jnp.full((k_BTKH.shape[0],), T, jnp.int32)
                last_B1 = lengths_B[:, None] - 1
                t_Bn = last_B1 - jnp.remainder(last_B1 - jnp.arange(n)[None, :], n)
                t_Bn = jnp.maximum(t_Bn, 0)  # slots no token reached yet: masked by position
                k = jnp.take_along_axis(k_BKHT, t_Bn[:, None, None, :], axis=3)
                v = jnp.take_along_axis(v_BKTH, t_Bn[:, None, :, None], axis=2)
        return dataclasses.replace(
            self,
            k=self.k[:layer] + (k,) + self.k[layer + 1 :],
            v=self.v[:layer] + (v,) + self.v[layer + 1 :],
        )

    def with_positions(self, pos_B: jax.Array) -> KVCache:
        return dataclasses.replace(self, pos=pos_B.astype(jnp.int32))

    def append(self, k_new: tuple[jax.Array, ...], v_new: tuple[jax.Array, ...]) -> KVCache:
        """Decode: write one row per sequence per layer ([B, K, H]) at `pos` (a rolling layer:
        at pos mod window), then advance pos.

        Only B*K*H elements per layer are written; jitted with the cache donated, XLA updates
        the buffers in place.
        """
        b = jnp.arange(self.batch_size)
        ks, vs = [], []
        for layer, (kc, vc, kn, vn) in enumerate(zip(self.k, self.v, k_new, v_new, strict=True)):
            with jax.named_scope(f"{kernels.layer_scope(layer)}/{kernels.KV_WRITE}"):
                w = self.layer_window(layer)
                slot = jnp.remainder(self.pos, w) if w else self.pos
                ks.append(kc.at[b, :, :, slot].set(kn.astype(kc.dtype)))
                vs.append(vc.at[b, :, slot, :].set(vn.astype(vc.dtype)))
        return dataclasses.replace(self, k=tuple(ks), v=tuple(vs), pos=self.pos + 1)
