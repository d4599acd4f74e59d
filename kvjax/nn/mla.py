"""Multi-head latent attention (DeepSeek-V2/V3): its projections and both decode forms.

Letters: `kvjax.kernels` (A latent width, P RoPE width, U = H - P key width without RoPE, W value
width, Q query low rank). Each position caches c = norm(x @ W_kva)[:A] (the latent) and the shared
RoPE key k_r = rope((x @ W_kva)[A:]): (A + P) elements per layer, whatever N is.

Per head n, key and value are re-expanded from the latent: k_n = [c @ W_uk[n].T, k_r] and
v_n = c @ W_uv[n].T (Hugging Face's `kv_b_proj` is [W_uk; W_uv] per head, stored here as
`k_up` (N, U, A) and `v_up` (N, W, A), out x in per head: the layout in which XLA:CPU runs the
absorbed decode's v_up at B=1 as its faster matrix-vector products). Two ways to decode one token
over a cache of S positions:
- naive (Hugging Face): expand all S cached latents to per-head keys and values every step, then
  attend as MHA (`attn/kv_b_proj`, then `attn/scores` over U + P wide keys, `attn/av`);
- absorbed (DeepSeek's inference code, vLLM): q_n . k_n = (q_n,nope @ W_uk[n]) . c + q_n,r . k_r, so
  the query is folded into latent space once (`attn/q_absorb`), attention runs MQA-like over the
  cached latents themselves, and the value up-projection follows attention (`attn/v_up`).
Both are exact; `tests/test_nn_mla.py` checks they agree. Prefill (and the uncached forward) runs
the expanded form, as DeepSeek and vLLM do. The softmax scale is 1/sqrt(U + P)
(`ModelConfig.attn_scale`: DeepSeek's YaRN multiplies it by mscale^2). The cache of latents is
`kvjax.nn.latent_cache`; the fused decode kernel `kvjax.nn.flash_mla`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from kvjax import kernels
from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig
from kvjax.nn import flash, flash_mla
from kvjax.nn.attend import NEG_INF, decode_softmax
from kvjax.nn.layers import (
    apply_rope,
    layer_rope_tables,
    linear,
    param,
    read,
    rms_norm,
    rope_tables,
    weight_dtype,
)


@dataclasses.dataclass(frozen=True)
class LatentProjection:
    """One layer's projections of T tokens: the query split in its two parts, and the cache rows."""

    q_nope_BTNU: jax.Array
    q_rope_BTNP: jax.Array  # RoPE applied
    c_BTA: jax.Array  # the normed latent
    k_rope_BTP: jax.Array  # RoPE applied


class LatentAttention(nnx.Module):
    """MLA's projections and both decode forms (`cfg.mla_decode`)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        if cfg.attention_kernel == "flash":
            flash.check_supported(cfg)
            if cfg.mla_decode != "absorbed":
                raise KvjaxError(
                    "attention_kernel='flash' runs MLA's absorbed decode (attention over the "
                    f"latent); mla_decode={cfg.mla_decode!r} is not supported (allowed: "
                    "'absorbed', or attention_kernel='xla')"
                )
        self.cfg = cfg
        D, N, H, A, P = (
            cfg.d_model,
            cfg.num_heads,
            cfg.head_dim,
            cfg.kv_lora_rank,
            cfg.qk_rope_head_dim,
        )
        U, W, Q = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.q_lora_rank
        # Weights (out, in) as Hugging Face stores them; kv_b_proj split per head into k_up, v_up.
        if Q:
            self.q_a_proj = param(rngs, (Q, D), D, cfg)
            self.q_a_norm = nnx.Param(jnp.ones((Q,), weight_dtype(cfg)))
            self.q_b_proj = param(rngs, (N * H, Q), Q, cfg)
        else:
            self.q_proj = param(rngs, (N * H, D), D, cfg)
        self.kv_a_proj = param(rngs, (A + P, D), D, cfg)
        self.kv_a_norm = nnx.Param(jnp.ones((A,), weight_dtype(cfg)))
        self.k_up = param(rngs, (N, U, A), A, cfg)
        self.v_up = param(rngs, (N, W, A), A, cfg)
        self.o_proj = param(rngs, (D, N * W), N * W, cfg)

    def project(self, x_BTD: jax.Array, positions_BT: jax.Array) -> LatentProjection:
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        N, H, A, U = cfg.num_heads, cfg.head_dim, cfg.kv_lora_rank, cfg.qk_nope_head_dim
        if cfg.q_lora_rank:
            with jax.named_scope(kernels.Q_A_PROJ):
                qa_BTQ = linear(x_BTD, read(self.q_a_proj, cfg))
            with jax.named_scope(kernels.NORM_Q_A):
                qa_BTQ = rms_norm(qa_BTQ, read(self.q_a_norm, cfg), cfg.norm_eps)
            with jax.named_scope(kernels.Q_B_PROJ):
                q_BTE = linear(qa_BTQ, read(self.q_b_proj, cfg))
        else:
            with jax.named_scope(kernels.Q_PROJ):
                q_BTE = linear(x_BTD, read(self.q_proj, cfg))
        with jax.named_scope(kernels.KV_A_PROJ):
            kva_BTE = linear(x_BTD, read(self.kv_a_proj, cfg))
        # Splits are layout glue between kernels (slices; free once compiled).
        q_BTNH = q_BTE.reshape(B, T, N, H)
        q_nope_BTNU, q_rope_BTNP = q_BTNH[..., :U], q_BTNH[..., U:]
        c_BTA, k_rope_BTP = kva_BTE[..., :A], kva_BTE[..., A:]
        with jax.named_scope(kernels.NORM_KV_A):
            c_BTA = rms_norm(c_BTA, read(self.kv_a_norm, cfg), cfg.norm_eps)
        with jax.named_scope(kernels.ROPE):
            rope = layer_rope_tables(cfg, (cfg.rope_theta, 1.0), False, cfg.qk_rope_head_dim)
            cos, sin = rope_tables(positions_BT, cfg.qk_rope_head_dim, **rope)
            q_rope_BTNP = apply_rope(q_rope_BTNP, cos, sin)
            k_rope_BTP = apply_rope(k_rope_BTP, cos, sin)
        return LatentProjection(q_nope_BTNU, q_rope_BTNP, c_BTA, k_rope_BTP)

    # -- the protocol `kvjax.nn.transformer.Block` drives (shared with `Attention`) -------------
    def cache_rows(self, proj: LatentProjection) -> tuple[jax.Array, jax.Array]:
        """What a position leaves in the cache: (latent [B, T, A], RoPE key [B, T, P])."""
        return proj.c_BTA, proj.k_rope_BTP

    def causal(self, proj: LatentProjection, window: int = 0) -> jax.Array:
        """Full causal attention of T queries over the same T positions, keys and values expanded
        (prefill and the uncached forward): o [B, T, N, W]."""
        cfg = self.cfg
        if cfg.attention_kernel == "flash":
            return self._flash_causal(proj)
        T, dtype, f32 = proj.c_BTA.shape[1], proj.q_nope_BTNU.dtype, jnp.float32
        q_rope_BNTP = jnp.transpose(proj.q_rope_BTNP, (0, 2, 1, 3))  # layout, outside the kernels
        with jax.named_scope(kernels.KV_B_PROJ):
            k_BSNU, v_BSNW = expand_prefix(proj.c_BTA, read(self.k_up, cfg), read(self.v_up, cfg))
        with jax.named_scope(kernels.SCORES):
            s_BNTS = jnp.einsum(
                "BTNU,BSNU->BNTS", proj.q_nope_BTNU, k_BSNU, preferred_element_type=f32
            ) + jnp.einsum(
                "BNTP,BSP->BNTS", q_rope_BNTP, proj.k_rope_BTP, preferred_element_type=f32
            )
        with jax.named_scope(kernels.SOFTMAX):
            causal_TS = jnp.tril(jnp.ones((T, T), jnp.bool_))
            s_BNTS = jnp.where(causal_TS, s_BNTS * cfg.attn_scale, NEG_INF)
            p_BNTS = jax.nn.softmax(s_BNTS, axis=-1).astype(dtype)
        with jax.named_scope(kernels.AV):
            o_BNTW = jnp.einsum("BNTS,BSNW->BNTW", p_BNTS, v_BSNW)
        return jnp.transpose(o_BNTW, (0, 2, 1, 3))  # to BTNW, outside the kernels

    def _flash_causal(self, proj: LatentProjection) -> jax.Array:
        """Prefill fused: MHA over the up-projected keys [k_nope, k_rope] (U + P) and values,
        the values zero-padded to U + P for the kernel (as vLLM does for FlashAttention) and the
        output cut back to W."""
        cfg = self.cfg
        with jax.named_scope(kernels.KV_B_PROJ):
            k_BSNU, v_BSNW = expand_prefix(proj.c_BTA, read(self.k_up, cfg), read(self.v_up, cfg))
        B, T, N, U = k_BSNU.shape
        P, W = cfg.qk_rope_head_dim, cfg.v_head_dim
        # layout glue outside the kernel: the shared RoPE key beside each head's, V padded
        k_rope_BSNP = jnp.broadcast_to(proj.k_rope_BTP[:, :, None], (B, T, N, P))
        q_BTNH = jnp.concatenate([proj.q_nope_BTNU, proj.q_rope_BTNP], axis=-1)
        k_BSNH = jnp.concatenate([k_BSNU, k_rope_BSNP.astype(k_BSNU.dtype)], axis=-1)
        v_BSNH = jnp.pad(v_BSNW, ((0, 0), (0, 0), (0, 0), (0, U + P - W)))
        o_BTNH = flash.flash_causal(q_BTNH[:, :, :, None], k_BSNH, v_BSNH, scale=cfg.attn_scale)
        return o_BTNH[:, :, :, 0, :W]

    def over_cache(
        self, proj: LatentProjection, cache_arrays, pos_B: jax.Array, window: int = 0
    ) -> jax.Array:
        """One new query per sequence over its cached positions [0, pos) and itself: o [B, 1, N,
        W], in the config's decode form. The cache is only read (as `attend_cache`)."""
        c_cache_BSA, kr_cache_BSP = cache_arrays
        args = (
            proj.q_nope_BTNU[:, 0],
            proj.q_rope_BTNP[:, 0],
            proj.c_BTA[:, 0],
            proj.k_rope_BTP[:, 0],
            c_cache_BSA,
            kr_cache_BSP,
            pos_B,
        )
        if self.cfg.mla_decode == "naive":
            return self._naive(*args)[:, None]
        o_NBW = self._absorbed(*args)
        return jnp.transpose(o_NBW, (1, 0, 2))[:, None]  # to B1NW, outside the kernels

    def _naive(self, q_nope_BNU, q_rope_BNP, c_new_BA, kr_new_BP, c_cache_BSA, kr_cache_BSP, pos_B):
        cfg, dtype = self.cfg, q_nope_BNU.dtype
        with jax.named_scope(kernels.KV_B_PROJ):
            k_BSNU, v_BSNW, k_new_BNU, v_new_BNW = expand_latents(
                c_cache_BSA, c_new_BA, read(self.k_up, cfg), read(self.v_up, cfg)
            )
        with jax.named_scope(kernels.SCORES):
            s_BNS, s_self_BN = naive_scores(
                q_nope_BNU, q_rope_BNP, k_BSNU, k_new_BNU, kr_cache_BSP, kr_new_BP
            )
        with jax.named_scope(kernels.SOFTMAX):
            p_BNS, p_self_BN = decode_softmax(
                s_BNS, s_self_BN, pos_B, cfg.head_dim, dtype, scale=cfg.attn_scale
            )
        with jax.named_scope(kernels.AV):
            return naive_av(p_BNS, p_self_BN, v_BSNW, v_new_BNW)

    def _absorbed(
        self, q_nope_BNU, q_rope_BNP, c_new_BA, kr_new_BP, c_cache_BSA, kr_cache_BSP, pos_B
    ):
        """o [N, B, W] (head-major: the per-head products leave it so)."""
        cfg = self.cfg
        with jax.named_scope(kernels.Q_ABSORB):
            q_lat_NBA = absorb_query(q_nope_BNU, read(self.k_up, cfg))
        if cfg.attention_kernel == "flash":
            o_lat_BNA = flash_mla.flash_decode_latent(
                jnp.transpose(q_lat_NBA, (1, 0, 2)),
                q_rope_BNP,
                c_new_BA,
                kr_new_BP,
                c_cache_BSA,
                kr_cache_BSP,
                pos_B,
                scale=cfg.attn_scale,
            )
            with jax.named_scope(kernels.V_UP):
                return up_values(o_lat_BNA, read(self.v_up, cfg))
        with jax.named_scope(kernels.SCORES):
            s_BNS, s_self_BN, c_cache_BSA = absorbed_scores(
                q_lat_NBA, q_rope_BNP, c_new_BA, kr_new_BP, c_cache_BSA, kr_cache_BSP
            )
        with jax.named_scope(kernels.SOFTMAX):
            p_BNS, p_self_BN = decode_softmax(
                s_BNS, s_self_BN, pos_B, cfg.head_dim, q_nope_BNU.dtype, scale=cfg.attn_scale
            )
        with jax.named_scope(kernels.AV):
            o_lat_BNA = absorbed_av(p_BNS, p_self_BN, c_new_BA, c_cache_BSA)
        with jax.named_scope(kernels.V_UP):
            return up_values(o_lat_BNA, read(self.v_up, cfg))

    def output(self, o_BTNW: jax.Array) -> jax.Array:
        B, T = o_BTNW.shape[:2]
        o_BTE = o_BTNW.reshape(B, T, -1)
        with jax.named_scope(kernels.O_PROJ):
            return linear(o_BTE, read(self.o_proj, self.cfg))


def expand_prefix(c_BSA, w_uk_NUA, w_uv_NWA):
    """Prefill: per-head keys (no RoPE) [B, S, N, U] and values [B, S, N, W] of the latents."""
    k_BSNU = jnp.einsum("BSA,NUA->BSNU", c_BSA, w_uk_NUA)
    return k_BSNU, jnp.einsum("BSA,NWA->BSNW", c_BSA, w_uv_NWA)


def absorb_query(q_nope_BNU, w_uk_NUA):
    """The query in latent space, head-major [N, B, A] (the per-head product's natural order)."""
    return jnp.einsum("BNU,NUA->NBA", q_nope_BNU, w_uk_NUA)


def up_values(o_lat_BNA, w_uv_NWA):
    """The latent attention output through each head's W_uv: [N, B, W]."""
    return jnp.einsum("BNA,NWA->NBW", o_lat_BNA, w_uv_NWA)


def expand_latents(c_cache_BSA, c_new_BA, w_uk_NUA, w_uv_NWA):
    """Naive decode: per-head keys (no RoPE) and values of every cached latent and the new one."""
    k_BSNU, v_BSNW = expand_prefix(c_cache_BSA.astype(c_new_BA.dtype), w_uk_NUA, w_uv_NWA)
    k_new_BNU = jnp.einsum("BA,NUA->BNU", c_new_BA, w_uk_NUA)
    v_new_BNW = jnp.einsum("BA,NWA->BNW", c_new_BA, w_uv_NWA)
    return k_BSNU, v_BSNW, k_new_BNU, v_new_BNW


def naive_scores(q_nope_BNU, q_rope_BNP, k_BSNU, k_new_BNU, kr_cache_BSP, kr_new_BP):
    """MHA-like scores over the expanded keys and the shared RoPE keys (f32), and the own."""
    f32 = jnp.float32
    kr_cache_BSP = kr_cache_BSP.astype(q_nope_BNU.dtype)
    s_BNS = jnp.einsum("BNU,BSNU->BNS", q_nope_BNU, k_BSNU, preferred_element_type=f32)
    s_BNS = s_BNS + jnp.einsum("BNP,BSP->BNS", q_rope_BNP, kr_cache_BSP, preferred_element_type=f32)
    s_self_BN = jnp.einsum("BNU,BNU->BN", q_nope_BNU, k_new_BNU, preferred_element_type=f32)
    s_self_BN = s_self_BN + jnp.einsum(
        "BNP,BP->BN", q_rope_BNP, kr_new_BP, preferred_element_type=f32
    )
    return s_BNS, s_self_BN


def naive_av(p_BNS, p_self_BN, v_BSNW, v_new_BNW):
    o_BNW = jnp.einsum("BNS,BSNW->BNW", p_BNS, v_BSNW)
    return o_BNW + jnp.einsum("BN,BNW->BNW", p_self_BN, v_new_BNW)


def naive_attention(
    q_nope_BNU,
    q_rope_BNP,
    k_BSNU,
    v_BSNW,
    k_new_BNU,
    v_new_BNW,
    kr_cache_BSP,
    kr_new_BP,
    pos_B,
    head_dim: int,
):
    """Naive decode attention (scores, softmax, av over expanded keys/values), for timing alone."""
    s_BNS, s_self_BN = naive_scores(
        q_nope_BNU, q_rope_BNP, k_BSNU, k_new_BNU, kr_cache_BSP, kr_new_BP
    )
    p_BNS, p_self_BN = decode_softmax(s_BNS, s_self_BN, pos_B, head_dim, q_nope_BNU.dtype)
    return naive_av(p_BNS, p_self_BN, v_BSNW, v_new_BNW)


def absorbed_scores(q_lat_NBA, q_rope_BNP, c_new_BA, kr_new_BP, c_cache_BSA, kr_cache_BSP):
    """MQA-like scores over the cached latents: q_lat . c + q_rope . k_r (f32), the new token's
    own score, and the latents in the compute dtype (for av).

    The products run cache-first, [B, S, N] = c[B, S, A] . q_lat[B, A, N]^T, then the f32 scores
    are transposed to [B, N, S]: in that order XLA:CPU reads the cache as stored, while q . c
    ([B, N, S] directly) made it copy the whole latent cache to [B, A, S] every step.
    """
    f32, dtype = jnp.float32, q_lat_NBA.dtype
    c_cache_BSA, kr_cache_BSP = c_cache_BSA.astype(dtype), kr_cache_BSP.astype(dtype)
    s_BSN = jnp.einsum("BSA,NBA->BSN", c_cache_BSA, q_lat_NBA, preferred_element_type=f32)
    s_BSN = s_BSN + jnp.einsum("BSP,BNP->BSN", kr_cache_BSP, q_rope_BNP, preferred_element_type=f32)
    s_BNS = jnp.transpose(s_BSN, (0, 2, 1))
    s_self_BN = jnp.einsum("NBA,BA->BN", q_lat_NBA, c_new_BA, preferred_element_type=f32)
    s_self_BN = s_self_BN + jnp.einsum(
        "BNP,BP->BN", q_rope_BNP, kr_new_BP, preferred_element_type=f32
    )
    return s_BNS, s_self_BN, c_cache_BSA


def absorbed_av(p_BNS, p_self_BN, c_new_BA, c_cache_BSA):
    """P . latents: the attention output in latent space [B, N, A]."""
    o_BNA = jnp.einsum("BNS,BSA->BNA", p_BNS, c_cache_BSA)
    return o_BNA + jnp.einsum("BN,BA->BNA", p_self_BN, c_new_BA)


def absorbed_attention(
    q_lat_NBA, q_rope_BNP, c_new_BA, kr_new_BP, c_cache_BSA, kr_cache_BSP, pos_B, head_dim: int
):
    """Absorbed decode attention (scores, softmax, av) as one function, for timing alone."""
    s_BNS, s_self_BN, c_cache_BSA = absorbed_scores(
        q_lat_NBA, q_rope_BNP, c_new_BA, kr_new_BP, c_cache_BSA, kr_cache_BSP
    )
    p_BNS, p_self_BN = decode_softmax(s_BNS, s_self_BN, pos_B, head_dim, q_lat_NBA.dtype)
    return absorbed_av(p_BNS, p_self_BN, c_new_BA, c_cache_BSA)
