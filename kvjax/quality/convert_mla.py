"""MHA/GQA -> MLA checkpoint conversion, after MHA2MLA (Ji et al., ACL 2025, arXiv 2502.14837;
github.com/JT-Ushio/MHA2MLA), into kvjax's DeepSeek layout (`kvjax.nn.mla`).

MHA2MLA's two steps, as its code does them:
- **partial RoPE**: each query/key head keeps RoPE on P of its H dimensions, the "high" version:
  the P/2 highest frequencies, dims [0, P/2) and [H/2, H/2 + P/2) of the rotate-half layout; the
  other U = H - P dimensions lose their rotation and become the "nope" part;
- **joint SVD** of the nope key rows and the value rows of every KV head, [W_k,nope; W_v]
  (K(U + W) x D): the latent's down-projection is the top-A right singular vectors (A x D), the
  per-head up-projections are U_A Sigma_A (all the singular values on the up side).

Where kvjax's MLA layer differs from MHA2MLA's, the conversion does this (and says so):
- one RoPE key shared by all heads (DeepSeek's k_r, cached once), where MHA2MLA keeps one per KV
  head: the shared key's rows are the mean of the heads' kept key rows (Ainslie et al.'s
  mean-pooling); exact when the source has one KV head;
- the latent is RMS-normed (DeepSeek's kv_a_layernorm), which MHA2MLA's latent is not: its weight
  is set to rho, rho^2 = (1/A) sum_ij down_ij^2 gamma_j^2 (gamma: the layer's input norm scale),
  the latent's RMS for an input of unit-variance independent features, so up . norm(c) matches
  up . c up to each token's deviation from that RMS (fine-tuning absorbs it);
- the kept frequencies keep their values: MLA's P-wide RoPE on base theta^(P/H) has exactly the
  source's P/2 highest frequencies theta^(-2i/H), i < P/2.
Queries, the output projection and everything outside attention are copied. GQA sources repeat
their KV heads over the query heads (Hugging Face's repeat_kv) after the SVD.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvjax.errors import KvjaxError
from kvjax.nn import Transformer


def kept_dims(head_dim: int, rope_dim: int) -> np.ndarray:
    """The P dimensions of a rotate-half head that keep RoPE (MHA2MLA's "high" version), in the
    order MLA's P-wide rotate-half RoPE pairs them: [0, P/2) then [H/2, H/2 + P/2)."""
    half, keep = head_dim // 2, rope_dim // 2
    return np.concatenate([np.arange(keep), half + np.arange(keep)])


def head_order(head_dim: int, rope_dim: int) -> np.ndarray:
    """A head's dimensions as MLA lays them out: the U without RoPE first, then the P kept."""
    kept = kept_dims(head_dim, rope_dim)
    return np.concatenate([np.setdiff1d(np.arange(head_dim), kept), kept])


def check_conversion(cfg, kv_lora_rank: int, rope_dim: int) -> None:
    """Refuses, by field, a source or a width the conversion cannot take (before any training)."""
    if cfg.is_mla:
        raise KvjaxError(f"the model is already MLA (kv_lora_rank={cfg.kv_lora_rank})")
    H, K = cfg.head_dim, cfg.num_kv_heads
    if isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or rope_dim % 2:
        raise KvjaxError(f"rope_dim={rope_dim!r} must be an even integer in 2 .. {H - 2}")
    if not 2 <= rope_dim < H:
        raise KvjaxError(f"rope_dim={rope_dim} must be an even integer in 2 .. head_dim-2={H - 2}")
    most = min(cfg.d_model, K * (2 * H - rope_dim))
    if isinstance(kv_lora_rank, bool) or not isinstance(kv_lora_rank, int):
        raise KvjaxError(f"kv_lora_rank={kv_lora_rank!r} must be an integer in 1 .. {most}")
    if not 1 <= kv_lora_rank <= most:
        raise KvjaxError(
            f"kv_lora_rank={kv_lora_rank} must be in 1 .. {most} (the rank of the joint key/value "
            f"matrix: min(d_model={cfg.d_model}, num_kv_heads x (2 x head_dim - rope_dim)))"
        )
    unsupported = {  # the most basic first
        "layer_kinds": set(cfg.layer_kinds) != {"A"},
        "rope_scaling": cfg.rope_scaling != "none",
        "rotary_dim": cfg.rotary_dim not in (0, H),
        "rope_pattern": set(cfg.rope_pattern) != {"R"},
        "layer_pattern": set(cfg.layer_pattern) != {"G"},
        "attn_output_gate": cfg.attn_output_gate,
        "sink_logits": cfg.sink_logits,
        "qkv_bias": cfg.qkv_bias,
        "qk_norm": cfg.qk_norm or cfg.qk_norm_full,
    }
    for field, bad in unsupported.items():
        if bad:
            raise KvjaxError(
                f"{field}={getattr(cfg, field)!r} is not supported by the MHA -> MLA conversion "
                "(attention layers only, full RoPE on every global layer, no q/k biases, norms "
                "or gates)"
            )


def partial_rope(model: Transformer, rope_dim: int, shared_key: bool = False) -> Transformer:
    """The source model as the conversion's first steps leave it, still MHA/GQA (to see what each
    step costs): RoPE on the `rope_dim` kept dimensions of each head only (the others' frequencies
    set to 0), and with `shared_key` every KV head's kept key rows replaced by their mean (the
    one RoPE key MLA caches). A copy; the source is unchanged."""
    cfg = model.cfg
    check_conversion(cfg, 1, rope_dim)
    H, K, P = cfg.head_dim, cfg.num_kv_heads, rope_dim
    inv = 1.0 / float(cfg.rope_theta) ** (np.arange(0, H, 2) / H)
    inv[P // 2 :] = 0.0
    out = nnx.clone(model)
    kept = kept_dims(H, P)
    for layer in out.layers:
        layer.attn.rope = {"theta": cfg.rope_theta, "inv_freq": tuple(float(x) for x in inv)}
        if shared_key:
            k_KHD = np.array(layer.attn.k_proj[...]).reshape(K, H, -1)
            k_KHD[:, kept] = k_KHD[:, kept].mean(axis=0)
            layer.attn.k_proj[...] = jnp.asarray(k_KHD.reshape(K * H, -1), layer.attn.k_proj.dtype)
    return out


def convert_to_mla(model: Transformer, kv_lora_rank: int, rope_dim: int, seed: int = 0):
    """A new MLA model: latent width `kv_lora_rank`, RoPE on `rope_dim` of each head's dims."""
    cfg = model.cfg
    check_conversion(cfg, kv_lora_rank, rope_dim)
    new_cfg = cfg.replace(
        num_kv_heads=cfg.num_heads,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope_dim,
        v_head_dim=cfg.head_dim,
        rope_theta=float(cfg.rope_theta) ** (rope_dim / cfg.head_dim),
    )
    new = Transformer(new_cfg, rngs=nnx.Rngs(seed))
    old = {path: var[...] for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    order = head_order(cfg.head_dim, rope_dim)
    latents = {}  # per layer: kv_a_proj, kv_a_norm, k_up, v_up
    state = nnx.state(new, nnx.Param)
    for path, var in nnx.to_flat_state(state):
        name = path[-1]
        if path[0] != "layers" or path[2] != "attn" or name == "o_proj":
            var[...] = old[path]
        elif name == "q_proj":  # rows per head reordered: [nope | kept]
            N, H = cfg.num_heads, cfg.head_dim
            var[...] = old[path].reshape(N, H, -1)[:, order].reshape(N * H, -1)
        else:
            if path[1] not in latents:
                latents[path[1]] = _latent(old, path[1], cfg, kv_lora_rank, rope_dim)
            var[...] = latents[path[1]][name].astype(var[...].dtype)
    nnx.update(new, state)
    return new


def _latent(old, i: int, cfg, A: int, P: int) -> dict:
    """Layer i's kv_a_proj, kv_a_norm, k_up and v_up from its k_proj, v_proj and input norm."""
    N, K, H, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_model
    U, order, kept = H - P, head_order(H, P), kept_dims(H, P)
    k_KHD = np.asarray(old[("layers", i, "attn", "k_proj")], np.float64).reshape(K, H, D)
    v_KHD = np.asarray(old[("layers", i, "attn", "v_proj")], np.float64).reshape(K, H, D)
    nope_KUD = k_KHD[:, order[:U]]
    joint = np.concatenate([nope_KUD, v_KHD], axis=1).reshape(K * (U + H), D)
    left, sigma, right_T = np.linalg.svd(joint, full_matrices=False)
    down_AD = right_T[:A]
    up_KEA = (left[:, :A] * sigma[:A]).reshape(K, U + H, A)
    repeat = N // K  # query head n reads KV head n // repeat
    k_up, v_up = np.repeat(up_KEA[:, :U], repeat, 0), np.repeat(up_KEA[:, U:], repeat, 0)
    k_rope_PD = k_KHD[:, kept].mean(axis=0)
    gamma = np.asarray(old[("layers", i, "attn_norm", "scale")], np.float64)
    rho = np.sqrt(np.mean(np.sum(down_AD**2 * gamma**2, axis=1)))
    return {
        "kv_a_proj": jnp.asarray(np.concatenate([down_AD, k_rope_PD])),
        "kv_a_norm": jnp.full((A,), rho),
        "k_up": jnp.asarray(k_up),
        "v_up": jnp.asarray(v_up),
    }
