"""MLA's cache (DeepSeek-V2/V3): per layer the normed latents c [B, S, A] and the shared RoPE keys
k_r [B, S, P], (A + P) elements a position whatever the number of heads, and each sequence's
position. Letters: `kvjax.kernels`; the attention that reads it is `kvjax.nn.mla`'s."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from kvjax import kernels
from kvjax.model.config import ModelConfig
from kvjax.nn.kv_cache import check_cache_size, write_rows
from kvjax.nn.sharding import mesh_active


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LatentCache:
    """MLA's cache: per layer the latents [B, S, A] and the RoPE keys [B, S, P] (one array each,
    read by the scores and, for the latent, by av too: one layout serves both), and positions."""

    latent: tuple[jax.Array, ...]
    k_rope: tuple[jax.Array, ...]
    pos: jax.Array

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch_size: int, max_len: int, dtype) -> LatentCache:
        check_cache_size(batch_size, max_len)
        L, A, P = cfg.num_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        return cls(
            latent=tuple(jnp.zeros((batch_size, max_len, A), dtype) for _ in range(L)),
            k_rope=tuple(jnp.zeros((batch_size, max_len, P), dtype) for _ in range(L)),
            pos=jnp.zeros((batch_size,), jnp.int32),
        )

    @property
    def batch_size(self) -> int:
        return self.latent[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.latent[0].shape[1]

    @property
    def num_layers(self) -> int:
        return len(self.latent)

    @property
    def nbytes(self) -> int:
        return sum(x.size * x.dtype.itemsize for x in (*self.latent, *self.k_rope))

    def layer(self, i: int) -> tuple[jax.Array, jax.Array]:
        return self.latent[i], self.k_rope[i]

    def layer_window(self, i: int) -> int:
        return 0  # MLA with sliding windows is refused by the config

    def write_prefix(
        self, layer: int, c_BTA: jax.Array, k_rope_BTP: jax.Array, lengths_B=None
    ) -> LatentCache:
        """Prefill: rows 0..T-1 of one layer (positions are set by `with_positions`)."""
        with jax.named_scope(f"{kernels.layer_scope(layer)}/{kernels.KV_WRITE}"):
            c = jax.lax.dynamic_update_slice(
                self.latent[layer], c_BTA.astype(self.latent[layer].dtype), (0, 0, 0)
            )
            kr = jax.lax.dynamic_update_slice(
                self.k_rope[layer], k_rope_BTP.astype(self.k_rope[layer].dtype), (0, 0, 0)
            )
        return dataclasses.replace(
            self,
            latent=self.latent[:layer] + (c,) + self.latent[layer + 1 :],
            k_rope=self.k_rope[:layer] + (kr,) + self.k_rope[layer + 1 :],
        )

    def with_positions(self, pos_B: jax.Array) -> LatentCache:
        return dataclasses.replace(self, pos=pos_B.astype(jnp.int32))

    def append(self, c_new: tuple[jax.Array, ...], kr_new: tuple[jax.Array, ...]) -> LatentCache:
        """Decode: write one row per sequence per layer ([B, A] and [B, P]) at `pos`."""
        b = jnp.arange(self.batch_size)
        cs, krs = [], []
        for layer, (cc, kc, cn, kn) in enumerate(
            zip(self.latent, self.k_rope, c_new, kr_new, strict=True)
        ):
            with jax.named_scope(f"{kernels.layer_scope(layer)}/{kernels.KV_WRITE}"):
                if mesh_active():  # per-row updates: the partitioner keeps them on their device
                    cs.append(write_rows(cc, cn, self.pos, axis=0))
                    krs.append(write_rows(kc, kn, self.pos, axis=0))
                    continue
                cs.append(cc.at[b, self.pos, :].set(cn.astype(cc.dtype)))
                krs.append(kc.at[b, self.pos, :].set(kn.astype(kc.dtype)))
        return LatentCache(latent=tuple(cs), k_rope=tuple(krs), pos=self.pos + 1)
