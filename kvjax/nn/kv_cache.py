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
from kvjax.nn.sharding import mesh_active

MAX_POSITIONS = 2**31 - 1  # positions are int32
QMAX = {"int8": 127.0, "float8_e4m3fn": 448.0}  # the largest value a 1-byte cache holds


def quantize(x, dtype, kind: str, scale=None, axis: int = -1):
    """`x` in the cache's dtype, and its scale: "token_head" an f32 absmax / QMAX of each row of
    H (`axis`), "tensor" the given scalar, "none" a plain cast. int8 is rounded and clipped;
    fp8 is cast (XLA rounds to nearest)."""
    if kind == "none":
        return x.astype(dtype), None
    qmax = QMAX[jnp.dtype(dtype).name]
    if kind == "token_head":
        scale = jnp.max(jnp.abs(x), axis=axis).astype(jnp.float32) / qmax
        safe = jnp.where(scale > 0, scale, 1.0)  # an all-zero row stays zero
        y = x.astype(jnp.float32) / jnp.expand_dims(safe, axis)
    else:
        y = x.astype(jnp.float32) / scale
    if jnp.dtype(dtype) == jnp.int8:
        y = jnp.clip(jnp.round(y), -qmax, qmax)
    return y.astype(dtype), scale


def dequantize(x, scale, dtype, axis: int):
    """The cache's `x` widened to `dtype` and multiplied by its scale (a scalar, or per row of H:
    broadcast over `axis`)."""
    x = x.astype(dtype)
    if scale is None:
        return x
    return x * (jnp.expand_dims(scale, axis) if scale.ndim else scale).astype(dtype)


def rolling_slot(pos_B: jax.Array, window: int, sinks: int = 0) -> jax.Array:
    """The slot of a rolling layer that token `pos` is written to: pos mod W, or with `sinks`
    (StreamingLLM's kept first tokens) the token itself below s and s + (pos - s) mod W after:
    the sinks never overwritten, the W slots after them a ring of the most recent tokens."""
    if not sinks:
        return jnp.remainder(pos_B, window)
    return jnp.where(pos_B < sinks, pos_B, sinks + jnp.remainder(pos_B - sinks, window))


def check_cache_size(batch_size: int, max_len: int) -> None:
    """A cache's batch and length, refused in one line before anything is allocated."""
    for name, value in (("batch_size", batch_size), ("max_len", max_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise KvjaxError(f"{name}={value!r} must be a positive integer")
    if max_len > MAX_POSITIONS:
        raise KvjaxError(
            f"max_len={max_len} exceeds the model's int32 positions (at most {MAX_POSITIONS})"
        )


def _scales(kind: str, batch_size: int, num_kv_heads: int, lens) -> tuple[jax.Array, ...]:
    if kind == "token_head":
        return tuple(jnp.zeros((batch_size, num_kv_heads, n), jnp.float32) for n in lens)
    if kind == "tensor":
        return tuple(jnp.ones((), jnp.float32) for _ in lens)
    return ()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Per layer K [B, K, H, L_i] and V [B, K, L_i, H]: L_i = max_len for a global layer, and for a
    sliding layer min(max_len, window + sinks). A sliding layer whose buffer is the whole window is
    *rolling* (`window[i] > 0`): token t is written to slot t mod window (with `sinks`, the first
    s tokens keep slots 0..s-1 and the ring follows them: `rolling_slot`), and a decode step masks
    the slot about to be overwritten (the token `window` positions back); the others never wrap."""

    k: tuple[jax.Array, ...]  # per layer, [B, K, H, L_i] in the config's KV dtype
    v: tuple[jax.Array, ...]  # per layer, [B, K, L_i, H]
    pos: jax.Array  # [B] int32: positions filled so far (the next token's position)
    window: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))
    # a 1-byte cache's f32 scales per layer: [B, K, L_i] ("token_head") or [] ("tensor")
    k_scale: tuple[jax.Array, ...] = ()
    v_scale: tuple[jax.Array, ...] = ()
    scales: str = dataclasses.field(default="none", metadata=dict(static=True))
    sinks: int = dataclasses.field(default=0, metadata=dict(static=True))
    # the model layer of each entry (a hybrid's attention layers: `state_cache.HybridCache`);
    # () the identity. Only the named scopes of the writes use it.
    layer_ids: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))

    @classmethod
    def zeros(
        cls,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype,
        windows: tuple[int, ...] = (),
        scales: str = "none",
        sinks: int = 0,
        layer_ids: tuple[int, ...] = (),
    ) -> KVCache:
        """`windows[i]`: layer i's sliding window (0: global); none given, every layer global.
        `scales`: a 1-byte cache's ("tensor": 1.0, as vLLM without calibration; "token_head").
        `sinks`: a sliding layer also keeps the first `sinks` tokens (s + W rows, see
        `rolling_slot`)."""
        check_cache_size(batch_size, max_len)
        windows = tuple(windows) or (0,) * num_layers
        lens = [min(max_len, w + sinks) if w else max_len for w in windows]

        def zeros(shape):
            return jnp.zeros(shape, dtype)

        return cls(
            k=tuple(zeros((batch_size, num_kv_heads, head_dim, n)) for n in lens),
            v=tuple(zeros((batch_size, num_kv_heads, n, head_dim)) for n in lens),
            pos=jnp.zeros((batch_size,), jnp.int32),
            window=tuple(w if w and max_len >= w + sinks else 0 for w in windows),
            k_scale=_scales(scales, batch_size, num_kv_heads, lens),
            v_scale=_scales(scales, batch_size, num_kv_heads, lens),
            scales=scales,
            sinks=sinks if any(w and max_len >= w + sinks for w in windows) else 0,
            layer_ids=tuple(layer_ids),
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
        arrays = (*self.k, *self.v, *self.k_scale, *self.v_scale)
        return sum(x.size * x.dtype.itemsize for x in arrays)

    def layer(self, i: int) -> tuple:
        """What attention reads: (K, V, K's scales, V's scales), the scales None when absent."""
        if self.scales == "none":
            return self.k[i], self.v[i], None, None
        return self.k[i], self.v[i], self.k_scale[i], self.v_scale[i]

    def layer_window(self, i: int) -> int:
        return self._windows()[i]

    def layer_sinks(self, i: int) -> int:
        """The sink slots of layer i: the cache's `sinks` on a rolling layer, else 0."""
        return self.sinks if self._windows()[i] else 0

    def write_prefix(
        self, layer: int, k_BTKH: jax.Array, v_BTKH: jax.Array, lengths_B: jax.Array | None = None
    ) -> KVCache:
        """Prefill: rows 0..T-1 of one layer (positions are set by `with_positions`). A rolling
        layer given more tokens than its window keeps each sequence's last `window` real tokens,
        token t at slot t mod window (`lengths_B`: the real lengths of right-padded prompts)."""
        T, n = k_BTKH.shape[1], self.k[layer].shape[3]
        scope = kernels.layer_scope(self.layer_ids[layer] if self.layer_ids else layer)
        with jax.named_scope(scope):  # a layout change, outside the kernel
            k_BKHT = jnp.transpose(k_BTKH, (0, 2, 3, 1))
            v_BKTH = jnp.swapaxes(v_BTKH, 1, 2)
        with jax.named_scope(f"{scope}/{kernels.KV_WRITE}"):
            ks, vs = (self.k_scale[layer], self.v_scale[layer]) if self.k_scale else (None, None)
            k_BKHT, ks_BKT = quantize(k_BKHT, self.k[layer].dtype, self.scales, ks, axis=2)
            v_BKTH, vs_BKT = quantize(v_BKTH, self.v[layer].dtype, self.scales, vs, axis=3)
            if T <= n:
                k = jax.lax.dynamic_update_slice(self.k[layer], k_BKHT, (0, 0, 0, 0))
                v = jax.lax.dynamic_update_slice(self.v[layer], v_BKTH, (0, 0, 0, 0))
                if self.scales == "token_head":
                    ks = jax.lax.dynamic_update_slice(ks, ks_BKT, (0, 0, 0))
                    vs = jax.lax.dynamic_update_slice(vs, vs_BKT, (0, 0, 0))
            else:  # slot s holds the last real token t < length with t = s (mod n)
                if lengths_B is None:
                    lengths_B = jnp.full((k_BTKH.shape[0],), T, jnp.int32)
                last_B1 = lengths_B[:, None] - 1
                s = self.layer_sinks(layer)  # sink slots i < s hold token i; the ring: mod n - s
                slots_n = jnp.arange(n)[None, :]
                t_Bn = last_B1 - jnp.remainder(last_B1 - slots_n, n - s)
                if s:
                    t_Bn = jnp.where(slots_n < s, slots_n, t_Bn)
                t_Bn = jnp.maximum(t_Bn, 0)  # slots no token reached yet: masked by position
                k = jnp.take_along_axis(k_BKHT, t_Bn[:, None, None, :], axis=3)
                v = jnp.take_along_axis(v_BKTH, t_Bn[:, None, :, None], axis=2)
                if self.scales == "token_head":
                    ks = jnp.take_along_axis(ks_BKT, t_Bn[:, None, :], axis=2)
                    vs = jnp.take_along_axis(vs_BKT, t_Bn[:, None, :], axis=2)
        out = dataclasses.replace(
            self,
            k=self.k[:layer] + (k,) + self.k[layer + 1 :],
            v=self.v[:layer] + (v,) + self.v[layer + 1 :],
        )
        if self.scales != "token_head":
            return out
        return dataclasses.replace(
            out,
            k_scale=self.k_scale[:layer] + (ks,) + self.k_scale[layer + 1 :],
            v_scale=self.v_scale[:layer] + (vs,) + self.v_scale[layer + 1 :],
        )

    def with_positions(self, pos_B: jax.Array) -> KVCache:
        return dataclasses.replace(self, pos=pos_B.astype(jnp.int32))

    def write_rows(self, layer: int, k_BTKH: jax.Array, v_BTKH: jax.Array) -> KVCache:
        """Extend: T rows per sequence of one layer at positions pos .. pos + T - 1 (each
        sequence at its own `pos`; positions are advanced by `with_positions`). Global layers of
        an unscaled cache only (`kvjax.nn.transformer.Transformer.extend` checks, and calls this
        inside the layer's named scope)."""
        B, T = k_BTKH.shape[:2]
        b_B1 = jnp.arange(B)[:, None]
        slot_BT = self.pos[:, None] + jnp.arange(T)[None, :]
        with jax.named_scope(kernels.KV_WRITE):  # called inside the layer's own scope
            # advanced indices around a slice: the updates are [B, T, K, H] for both layouts
            k = self.k[layer].at[b_B1, :, :, slot_BT].set(k_BTKH.astype(self.k[layer].dtype))
            v = self.v[layer].at[b_B1, :, slot_BT, :].set(v_BTKH.astype(self.v[layer].dtype))
        return dataclasses.replace(
            self,
            k=self.k[:layer] + (k,) + self.k[layer + 1 :],
            v=self.v[:layer] + (v,) + self.v[layer + 1 :],
        )

    def append(self, k_new: tuple[jax.Array, ...], v_new: tuple[jax.Array, ...]) -> KVCache:
        """Decode: write one row per sequence per layer ([B, K, H]) at `pos` (a rolling layer:
        at pos mod window), then advance pos.

        Only B*K*H elements per layer are written; jitted with the cache donated, XLA updates
        the buffers in place.
        """
        b = jnp.arange(self.batch_size)
        ks, vs, kss, vss = [], [], list(self.k_scale), list(self.v_scale)
        for layer, (kc, vc, kn, vn) in enumerate(zip(self.k, self.v, k_new, v_new, strict=True)):
            scope = kernels.layer_scope(self.layer_ids[layer] if self.layer_ids else layer)
            with jax.named_scope(f"{scope}/{kernels.KV_WRITE}"):
                w = self.layer_window(layer)
                slot = rolling_slot(self.pos, w, self.layer_sinks(layer)) if w else self.pos
                k_sc, v_sc = (kss[layer], vss[layer]) if kss else (None, None)
                kq, k_row = quantize(kn, kc.dtype, self.scales, k_sc)
                vq, v_row = quantize(vn, vc.dtype, self.scales, v_sc)
                if mesh_active():  # per-row updates: the partitioner keeps them on their device
                    ks.append(write_rows(kc, kq, slot, axis=2))
                    vs.append(write_rows(vc, vq, slot, axis=1))
                    if self.scales == "token_head":
                        kss[layer] = write_rows(k_sc, k_row, slot, axis=1)
                        vss[layer] = write_rows(v_sc, v_row, slot, axis=1)
                    continue
                ks.append(kc.at[b, :, :, slot].set(kq))
                vs.append(vc.at[b, :, slot, :].set(vq))
                if self.scales == "token_head":
                    kss[layer] = k_sc.at[b, :, slot].set(k_row)
                    vss[layer] = v_sc.at[b, :, slot].set(v_row)
        return dataclasses.replace(
            self,
            k=tuple(ks),
            v=tuple(vs),
            k_scale=tuple(kss),
            v_scale=tuple(vss),
            pos=self.pos + 1,
        )


def write_rows(cache: jax.Array, rows: jax.Array, pos_B: jax.Array, axis: int) -> jax.Array:
    """cache[b] with rows[b] written at position pos_B[b] of its `axis` (counted without the
    batch axis): a per-sequence update, which the SPMD partitioner keeps on each sequence's
    device under a batch-split mesh, where the scatter of `at[b, ..., pos]` all-gathers its
    indices and rows (8 all-gathers in a 2-layer decode step on 8 devices)."""

    def one(c, r, p):
        r = jnp.expand_dims(r, axis).astype(c.dtype)
        start = tuple(p if i == axis else 0 for i in range(c.ndim))
        return jax.lax.dynamic_update_slice(c, r, start)

    return jax.vmap(one)(cache, rows, pos_B)
