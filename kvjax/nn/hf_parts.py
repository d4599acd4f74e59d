"""Readers of the checkpoint tensors every family shares: attention (q/k/v/o, their biases and
norms; RoPE rows reordered where a checkpoint rotates interleaved pairs), the (gated) MLP and the
MoE block (router, stacked experts, shared experts). Used by `kvjax.nn.hf` and
`kvjax.nn.hf_hybrid`. `get(name, shape)` reads a tensor (checked), `put(param, value)` stores it."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig
from kvjax.nn.layers import weight_dtype


def deinterleave(w_OI: np.ndarray, heads: int, head_dim: int, rope: int, first: bool = False):
    """Rows of each head's last `rope` outputs (`first`: its first, GLM's partial rotary)
    reordered [0, 2, 4, ...; 1, 3, 5, ...]: interleaved RoPE pairs become rotate-half's. A bias
    (1-D) is reordered alike."""
    w = w_OI.reshape(heads, head_dim, -1).copy()
    lo = 0 if first else head_dim - rope
    part = w[:, lo : lo + rope]
    w[:, lo : lo + rope] = np.concatenate([part[:, 0::2], part[:, 1::2]], axis=1)
    return w.reshape(w_OI.shape)


def tensor_io(cfg: ModelConfig, tensors: dict[str, np.ndarray]):
    """(get, put, used): `get(name, shape)` a checkpoint tensor, checked and recorded in `used`;
    `put(param, value)` stores it in the config's weight dtype."""
    dtype, used = weight_dtype(cfg), set()

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in tensors:
            raise KvjaxError(f"checkpoint is missing tensor {name!r}")
        x = tensors[name]
        if x.shape != shape:
            raise KvjaxError(f"tensor {name!r} has shape {x.shape}; the config implies {shape}")
        used.add(name)
        return x

    def put(variable, value: np.ndarray) -> None:
        variable[...] = jnp.asarray(value, dtype)

    return get, put, used


def check_all_used(tensors: dict, used: set[str]) -> None:
    unused = sorted(k for k in tensors if k not in used and "rotary_emb" not in k)
    if unused:
        raise KvjaxError(f"checkpoint has tensors the model does not use: {', '.join(unused[:5])}")


def load_attention(
    cfg: ModelConfig,
    a,
    get,
    put,
    p: str,
    fused: bool = False,
    interleaved: bool = False,
    o_name: str = "o_proj",
    norm_names: tuple[str, str] = ("q_norm", "k_norm"),
) -> None:
    """q/k/v/o (Phi-3: one fused qkv_proj; Qwen3-Next: q_proj's rows per head [q; gate]);
    `interleaved`: GLM's (partial) and ERNIE's rotary pair adjacent dims, so the rotated rows of
    q and k (and their biases) are reordered to rotate-half's. `o_name`, `norm_names`: LFM2's
    out_proj, q_layernorm and k_layernorm."""
    D, N, K, H = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    Q = (2 if cfg.attn_output_gate else 1) * N * H
    if interleaved:
        R = cfg.rope_width
        raw = get

        def get(name, shape):  # noqa: F811 (the reordering reader)
            x = raw(name, shape)
            heads = N if ".q_proj." in name else K if ".k_proj." in name else 0
            return deinterleave(x, heads, H, R, first=True) if heads else x

    if fused:  # Phi-3: one qkv_proj of [q; k; v] rows
        qkv = get(p + "self_attn.qkv_proj.weight", (N * H + 2 * K * H, D))
        q, k, v = np.split(qkv, [N * H, N * H + K * H])
        put(a.q_proj, q)
        put(a.k_proj, k)
        put(a.v_proj, v)
    else:
        put(a.q_proj, get(p + "self_attn.q_proj.weight", (Q, D)))
        put(a.k_proj, get(p + "self_attn.k_proj.weight", (K * H, D)))
        put(a.v_proj, get(p + "self_attn.v_proj.weight", (K * H, D)))
    put(a.o_proj, get(f"{p}self_attn.{o_name}.weight", (D, N * H)))
    if cfg.o_bias:
        put(a.o_bias, get(f"{p}self_attn.{o_name}.bias", (D,)))
    if cfg.sink_logits:  # gpt-oss
        put(a.sink_logits, get(p + "self_attn.sinks", (N,)))
    if cfg.qkv_bias:
        put(a.q_bias, get(p + "self_attn.q_proj.bias", (N * H,)))
        put(a.k_bias, get(p + "self_attn.k_proj.bias", (K * H,)))
        put(a.v_bias, get(p + "self_attn.v_proj.bias", (K * H,)))
    if cfg.qk_norm:  # per head (H), or OLMo 2's over all heads (N*H, K*H)
        wq, wk = (N * H, K * H) if cfg.qk_norm_full else (H, H)
        put(a.q_norm.scale, get(f"{p}self_attn.{norm_names[0]}.weight", (wq,)))
        put(a.k_norm.scale, get(f"{p}self_attn.{norm_names[1]}.weight", (wk,)))


EXPERT_NAMES = {  # (gate, up, down) of an expert: Mixtral's w1, w3, w2, everyone else's names
    "block_sparse_moe.": ("w1", "w3", "w2"),
    "mlp.": ("gate_proj", "up_proj", "down_proj"),
    "feed_forward.": ("gate_proj", "up_proj", "down_proj"),  # Llama 4 (stacked: its own reader)
}


def load_mlp(
    mlp,
    get,
    put,
    p: str,
    F: int,
    D: int,
    fused: bool = False,
    plain=(),
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
) -> None:
    """A (gated) MLP; `names`: its gate, up and down tensors (LFM2's w1, w3, w2)."""
    if not mlp.cfg.gated_mlp:  # up and down: StarCoder2's c_fc and c_proj, Apertus's up/down_proj
        up, down = plain or ("c_fc", "c_proj")
        put(mlp.up, get(f"{p}{up}.weight", (F, D)))
        put(mlp.down, get(f"{p}{down}.weight", (D, F)))
        if mlp.cfg.mlp_bias:
            put(mlp.up_bias, get(f"{p}{up}.bias", (F,)))
            put(mlp.down_bias, get(f"{p}{down}.bias", (D,)))
        if mlp.cfg.mlp_activation == "xielu":  # Apertus's act_fn: the learned alphas
            put(mlp.alpha_p, get(p + "act_fn.alpha_p", (1,)))
            put(mlp.alpha_n, get(p + "act_fn.alpha_n", (1,)))
        return
    if fused:  # Phi-3: one gate_up_proj of [gate; up] rows, kvjax's own layout
        put(mlp.gate_up, get(p + "gate_up_proj.weight", (2 * F, D)))
    else:
        gate = get(f"{p}{names[0]}.weight", (F, D))
        up = get(f"{p}{names[1]}.weight", (F, D))
        put(mlp.gate_up, np.concatenate([gate, up], axis=0))
    put(mlp.down, get(f"{p}{names[2]}.weight", (D, F)))
    if mlp.cfg.mlp_bias:
        bias = [get(p + "gate_proj.bias", (F,)), get(p + "up_proj.bias", (F,))]
        put(mlp.up_bias, np.concatenate(bias))
        put(mlp.down_bias, get(p + "down_proj.bias", (D,)))


def load_llama4_moe(cfg: ModelConfig, moe, get, put, p: str) -> None:
    """Llama 4's router, its experts stored stacked [in, out]: gate_up_proj [E, D, 2F] ([gate,
    up] columns) and down_proj [E, F, D], transposed to kvjax's (out, in), and its shared
    expert."""
    D, E, F = cfg.d_model, cfg.num_experts, cfg.moe_d_ff
    put(moe.router, get(p + "router.weight", (E, D)))
    put(moe.expert_gate_up, get(p + "experts.gate_up_proj", (E, D, 2 * F)).transpose(0, 2, 1))
    put(moe.expert_down, get(p + "experts.down_proj", (E, F, D)).transpose(0, 2, 1))
    load_mlp(moe.shared, get, put, p + "shared_expert.", moe.shared.width, D)


def load_moe(cfg: ModelConfig, moe, get, put, p: str, names: tuple[str, str, str]) -> None:
    """The router (and DeepSeek-V3's score-correction bias), the experts stacked to (E, 2F, D)
    and (E, D, F), and DeepSeek's shared experts."""
    if p.endswith("feed_forward."):  # Llama 4's names and layout
        return load_llama4_moe(cfg, moe, get, put, p)
    D, E, F = cfg.d_model, cfg.num_experts, cfg.moe_d_ff
    gate_name, up_name, down_name = names
    put(moe.router, get(p + "gate.weight", (E, D)))
    if moe.router_bias is not None:
        moe.router_bias[...] = jnp.asarray(get(p + "gate.e_score_correction_bias", (E,)))
    ex = p + "experts."
    gate_up = [
        np.concatenate(
            [get(f"{ex}{e}.{gate_name}.weight", (F, D)), get(f"{ex}{e}.{up_name}.weight", (F, D))]
        )
        for e in range(E)
    ]
    put(moe.expert_gate_up, np.stack(gate_up))
    put(moe.expert_down, np.stack([get(f"{ex}{e}.{down_name}.weight", (D, F)) for e in range(E)]))
    if moe.shared is not None:  # DeepSeek's shared_experts; Qwen2-MoE's gated shared_expert
        name = "shared_expert." if moe.shared_gate is not None else "shared_experts."
        load_mlp(moe.shared, get, put, p + name, moe.shared.width, D)
    if moe.shared_gate is not None:
        put(moe.shared_gate, get(p + "shared_expert_gate.weight", (1, D)))
