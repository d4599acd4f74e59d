"""Parameters in closed form: every kernel's weights per layer (dense, MLA, MoE), their sum and
their bytes. Pure Python; letters: kvjax.kernels. `kvjax.analytic.sizes` (weights beside the KV
cache) and `kvjax.analytic.moe` (experts touched, active parameters) both count from here."""

from __future__ import annotations

from collections import Counter

from kvjax import kernels
from kvjax.model.config import MXFP4_BLOCK, MXFP4_BLOCK_BYTES, ModelConfig

BIAS_BYTES = 4  # DeepSeek-V3's e_score_correction_bias is kept in f32 (as Hugging Face does)


def mla_attention_param_counts(cfg: ModelConfig) -> dict[str, int]:
    """MLA's attention parameters of one layer (Hugging Face DeepseekV3Attention, no biases):
    q path D*N*H (or D*Q + Q + Q*N*H through the low rank), W_kva D*(A+P), its norm A,
    W_kvb A*N*(U+W) (split here into the key part, read by q_absorb, and the value part), o N*W*D.
    """
    D, N, H, A, P = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    U, W, Q = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.q_lora_rank
    q = (
        {kernels.Q_A_PROJ: D * Q, kernels.NORM_Q_A: Q, kernels.Q_B_PROJ: Q * N * H}
        if Q
        else {kernels.Q_PROJ: D * N * H}
    )
    return {
        **q,
        kernels.KV_A_PROJ: D * (A + P),
        kernels.NORM_KV_A: A,
        kernels.Q_ABSORB: N * U * A,  # W_uk (the key half of kv_b_proj)
        kernels.V_UP: N * W * A,  # W_uv (the value half)
        kernels.O_PROJ: N * W * D,
    }


def layer_param_counts(cfg: ModelConfig, moe: bool = False, kind: str = "A") -> dict[str, int]:
    """Parameters of one decoder layer, by component; `moe`: an MoE layer of the config (its
    router, experts and shared experts: `kvjax.analytic.moe`) instead of the dense MLP; `kind`:
    its `layer_kinds` letter (D, C: a state mixer instead of attention; H: one beside it)."""
    D, N, K, H, F = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_ff
    bias_q, bias_kv = (N * H, K * H) if cfg.qkv_bias else (0, 0)
    gate = 2 if cfg.attn_output_gate else 1  # Qwen3-Next's q_proj also emits the output gate
    if kind != "A":
        from kvjax.analytic.hybrid import mixer_param_counts

        mixer = mixer_param_counts(cfg, kind)
    if kind in "DC":
        attn = mixer
    elif cfg.is_mla:
        attn = mla_attention_param_counts(cfg)
    else:
        attn = {
            kernels.Q_PROJ: gate * (D * N * H + bias_q),
            kernels.K_PROJ: D * K * H + bias_kv,
            kernels.V_PROJ: D * K * H + bias_kv,
            kernels.O_PROJ: N * H * D + (D if cfg.o_bias else 0),
        }
    if kind == "H":
        attn.update(mixer)
    if cfg.sink_logits and kind in "AH":  # gpt-oss: a learned sink logit per query head
        attn[kernels.SOFTMAX] = N
    if (
        cfg.qk_norm and kind in "AH"
    ):  # per head: two H-wide scales; OLMo 2's full width: N*H and K*H
        attn[kernels.QK_NORM] = (N + K) * H if cfg.qk_norm_full else 2 * H
    n = 2 * D if cfg.norm_bias else D  # a norm's scale (and a LayerNorm's bias)
    sandwich = {kernels.NORM_POST_ATTN: n, kernels.NORM_POST_MLP: n} if cfg.sandwich_norms else {}
    if moe:
        mlp = moe_layer_param_counts(cfg)
    else:
        up = (2 if cfg.gated_mlp else 1) * F  # the gate and up (or up) outputs
        mlp = {
            kernels.GATE_UP if cfg.gated_mlp else kernels.UP: D * up + (up if cfg.mlp_bias else 0),
            kernels.DOWN: F * D + (D if cfg.mlp_bias else 0),
        }
        if cfg.mlp_activation == "xielu":  # Apertus's learned alpha_p and alpha_n, per layer
            mlp[kernels.ACT] = 2
    pre = {kernels.NORM_ATTN: n, kernels.NORM_MLP: n} if cfg.pre_norms else {}
    if cfg.parallel_block:  # Cohere: one norm a block
        pre.pop(kernels.NORM_MLP)
    return {**attn, **mlp, **pre, **sandwich}


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Exact parameter count by component (summed over layers) and `total`."""
    counts = {kernels.EMBED: cfg.vocab_size * cfg.d_model}
    layers = Counter((cfg.layer_is_moe(i), cfg.layer_kind(i)) for i in range(cfg.num_layers))
    for (moe, kind), count in layers.items():
        for name, n in layer_param_counts(cfg, moe, kind).items():
            counts[name] = counts.get(name, 0) + n * count
    counts[kernels.NORM_FINAL] = cfg.d_model * (2 if cfg.norm_bias else 1)
    counts[kernels.LM_HEAD] = 0 if cfg.tied_embeddings else cfg.vocab_size * cfg.d_model
    counts["total"] = sum(counts.values())
    return counts


def num_params(cfg: ModelConfig) -> int:
    return param_counts(cfg)["total"]


def weight_bytes(cfg: ModelConfig) -> int:
    """Parameters x the weight dtype's bytes (DeepSeek-V3's router biases in f32; MXFP4
    experts at 17 bytes a block of 32: `expert_matrix_bytes`)."""
    total = num_params(cfg) * cfg.weight_bytes_per_element + bias_extra_bytes(cfg)
    if cfg.expert_weight_dtype:
        matrices = cfg.num_moe_layers * cfg.num_experts * expert_params(cfg)
        total += expert_matrix_bytes(cfg, matrices) - matrices * cfg.weight_bytes_per_element
    return total


def expert_matrix_bytes(cfg: ModelConfig, elements: float) -> float:
    """Bytes of `elements` of routed-expert matrices: the weight dtype's, or MXFP4's 4.25 bits
    (16 bytes of e2m1 pairs and one e8m0 exponent per block of 32; OCP MX spec v1.0)."""
    if cfg.expert_weight_dtype == "mxfp4":
        return elements * MXFP4_BLOCK_BYTES / MXFP4_BLOCK
    return elements * cfg.weight_bytes_per_element


def expert_params(cfg: ModelConfig) -> int:
    """One routed expert: gate, up (2 * D * F_e) and down (F_e * D)."""
    return 3 * cfg.d_model * cfg.moe_d_ff


def moe_layer_param_counts(cfg: ModelConfig) -> dict[str, int]:
    """An MoE layer's MLP parameters by kernel: the router (E * D, and DeepSeek-V3's E-wide
    score-correction bias), the routed experts, and the shared experts (one gated MLP of
    num_shared_experts * F_e, as DeepSeek builds them), counted as the mlp/ kernels."""
    D, E, F = cfg.d_model, cfg.num_experts, cfg.moe_d_ff
    out = {
        # DeepSeek-V3's correction bias, gpt-oss's logit bias: E each
        kernels.MOE_ROUTER: E * D + (E if cfg.router == "sigmoid" or cfg.router_bias else 0),
        # gpt-oss's expert biases: 2F and D an expert
        kernels.MOE_GATE_UP: E * 2 * D * F + (E * 2 * F if cfg.expert_bias else 0),
        kernels.MOE_DOWN: E * F * D + (E * D if cfg.expert_bias else 0),
    }
    if cfg.num_shared_experts:
        S = cfg.shared_d_ff
        out[kernels.GATE_UP] = 2 * D * S
        out[kernels.DOWN] = S * D
    if cfg.shared_expert_gate:  # Qwen2-MoE's w_g (1 x D)
        out[kernels.MOE_SHARED_GATE] = D
    return out


def bias_extra_bytes(cfg: ModelConfig) -> int:
    """The f32 correction biases' bytes beyond the weight dtype's (`sizes.weight_bytes`)."""
    if not cfg.is_moe or cfg.router != "sigmoid":
        return 0
    return cfg.num_moe_layers * cfg.num_experts * (BIAS_BYTES - cfg.weight_bytes_per_element)
