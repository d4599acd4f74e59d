"""The published model presets, each citing the config it comes from; parameter counts are checked
in tests against the published totals. Registered into `kvjax.model.config.PRESETS` on import (the
package imports this module)."""

from kvjax.model.config import ModelConfig, _preset
from kvjax.model.rope import yarn_mscale

# --------------------------------------------------------------------------------------------
# The seed's model ("a 70B-parameter, 80-layer model with d_h=128 in BF16", 64 query heads).
# The seed gives no other dimensions; the rest are Llama-3-70B's (Meta, 2024,
# meta-llama/Meta-Llama-3-70B config.json), which makes N = 70.55e9 at num_kv_heads=8, the seed's
# "70B". num_kv_heads is the seed's variable: 64 (MHA), 8 (GQA, default), 1 (MQA). The weights
# then depend on it (K/V projections are 2*D*K*H per layer): MHA is 79.9e9 parameters, MQA 69.2e9.
_preset(
    ModelConfig(
        name="seed-70b",
        num_layers=80,
        d_model=8192,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        d_ff=28672,
        vocab_size=128256,
        rope_theta=500000.0,
    )
)
# meta-llama/Llama-2-7b-hf config.json (Touvron et al., 2023): 6.74e9 parameters.
_preset(
    ModelConfig(
        name="llama-2-7b",
        num_layers=32,
        d_model=4096,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        d_ff=11008,
        vocab_size=32000,
        norm_eps=1e-5,
    )
)
# meta-llama/Llama-2-13b-hf config.json: 13.0e9 parameters.
_preset(
    ModelConfig(
        name="llama-2-13b",
        num_layers=40,
        d_model=5120,
        num_heads=40,
        num_kv_heads=40,
        head_dim=128,
        d_ff=13824,
        vocab_size=32000,
    )
)
# meta-llama/Llama-2-70b-hf config.json: GQA with 8 kv heads, 69.0e9 parameters.
_preset(
    ModelConfig(
        name="llama-2-70b",
        num_layers=80,
        d_model=8192,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        d_ff=28672,
        vocab_size=32000,
    )
)
# meta-llama/Meta-Llama-3-8B config.json: 8.03e9 parameters, rope_theta 500000.
_preset(
    ModelConfig(
        name="llama-3-8b",
        num_layers=32,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        d_ff=14336,
        vocab_size=128256,
        rope_theta=500000.0,
    )
)
# meta-llama/Meta-Llama-3-70B config.json: 70.6e9 parameters.
_preset(
    ModelConfig(
        name="llama-3-70b",
        num_layers=80,
        d_model=8192,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        d_ff=28672,
        vocab_size=128256,
        rope_theta=500000.0,
    )
)
# mistralai/Mistral-7B-v0.1 config.json (Jiang et al., 2023): 7.24e9 parameters; every layer
# attends a 4096-token sliding window ("sliding_window": 4096) with a rolling buffer cache, so its
# cache stops growing at 4096 positions (the paper's 8x at 32k).
_preset(
    ModelConfig(
        name="mistral-7b",
        num_layers=32,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        d_ff=14336,
        vocab_size=32000,
        sliding_window=4096,
        layer_pattern="L",
    )
)
# Qwen/Qwen2.5-7B config.json (Qwen team, 2024): 7.61e9 parameters; biases on q, k, v.
_preset(
    ModelConfig(
        name="qwen2.5-7b",
        num_layers=28,
        d_model=3584,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        d_ff=18944,
        vocab_size=152064,
        qkv_bias=True,
        rope_theta=1000000.0,
        norm_eps=1e-6,
    )
)
# google/gemma-7b config.json (Gemma team, 2024): 8.54e9 parameters; head_dim 256 while
# d_model / num_heads = 192; GeGLU MLP; tied embeddings; Gemma's (1 + w) RMSNorm and the
# embeddings scaled by sqrt(d_model) (Hugging Face GemmaRMSNorm, GemmaModel).
_preset(
    ModelConfig(
        name="gemma-7b",
        num_layers=28,
        d_model=3072,
        num_heads=16,
        num_kv_heads=16,
        head_dim=256,
        d_ff=24576,
        vocab_size=256000,
        mlp_activation="gelu",
        tied_embeddings=True,
        norm_eps=1e-6,
        norm_plus_one=True,
        scale_embeddings=True,
    )
)
# google/gemma-2-9b config.json (Gemma team, 2024, "Gemma 2"): 9,241,705,984 parameters;
# local (4096-token window) and global layers alternate, local first; sandwich norms; softmax
# scale 1/sqrt(query_pre_attn_scalar = 256); attention logits soft-capped at 50, final at 30.
_GEMMA = dict(
    mlp_activation="gelu",
    tied_embeddings=True,
    norm_eps=1e-6,
    norm_plus_one=True,
    scale_embeddings=True,
    sandwich_norms=True,
)
_preset(
    ModelConfig(
        name="gemma-2-9b",
        num_layers=42,
        d_model=3584,
        num_heads=16,
        num_kv_heads=8,
        head_dim=256,
        d_ff=14336,
        vocab_size=256000,
        sliding_window=4096,
        layer_pattern="LG",
        query_pre_attn_scalar=256.0,
        attn_softcap=50.0,
        final_softcap=30.0,
        **_GEMMA,
    )
)
# google/gemma-3-27b-it config.json, text_config (Gemma team, 2025, "Gemma 3"): the language
# model's 27,009,346,304 parameters (27.4e9 with the SigLIP vision encoder, not modelled); 62
# layers, five local (1024-token window, RoPE base 10k) per global one (base 1e6, linear scaling
# x8 for 128k), q/k norms, softmax scale 1/sqrt(168), no soft-capping.
_preset(
    ModelConfig(
        name="gemma-3-27b",
        num_layers=62,
        d_model=5376,
        num_heads=32,
        num_kv_heads=16,
        head_dim=128,
        d_ff=21504,
        vocab_size=262208,
        sliding_window=1024,
        layer_pattern="LLLLLG",
        qk_norm=True,
        query_pre_attn_scalar=168.0,
        rope_theta=1_000_000.0,
        rope_local_theta=10_000.0,
        rope_linear_factor=8.0,
        **_GEMMA,
    )
)
# Qwen/Qwen3-8B config.json (Qwen team, 2025, "Qwen3"): 8,190,735,360 parameters (the card's
# "8.2B", 6.95B non-embedding); q/k norms, head_dim 128, no biases, untied; its config carries a
# sliding_window that use_sliding_window=false leaves unused: every layer is global.
_preset(
    ModelConfig(
        name="qwen3-8b",
        num_layers=36,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        d_ff=12288,
        vocab_size=151936,
        qk_norm=True,
        rope_theta=1_000_000.0,
        norm_eps=1e-6,
    )
)

# Tiny test configs: every dimension a distinct size (L=2, K in {12, 3, 1}, G in {1, 4, 12},
# H=8, D=40, F=56, V=97, N=12), so a transposed axis cannot hide behind an equal size.
_TINY = dict(
    num_layers=2,
    d_model=40,
    num_heads=12,
    head_dim=8,
    d_ff=56,
    vocab_size=97,
    weight_dtype="f32",
    kv_dtype="f32",
)
_preset(ModelConfig(name="tiny-mha", num_kv_heads=12, **_TINY))
_preset(ModelConfig(name="tiny-gqa", num_kv_heads=3, **_TINY))
_preset(ModelConfig(name="tiny-mqa", num_kv_heads=1, **_TINY))
# Tiny MLA: every MLA width distinct too (nope 6 + rope 4 = head_dim 10, v 7, latent 20, q rank 24).
_TINY_MLA = dict(
    _TINY, head_dim=10, num_kv_heads=12, kv_lora_rank=20, qk_rope_head_dim=4, v_head_dim=7
)
_preset(ModelConfig(name="tiny-mla", **_TINY_MLA))
_preset(ModelConfig(name="tiny-mla-q", q_lora_rank=24, **_TINY_MLA))

# --------------------------------------------------------------------------------------------
# Mixtures of experts. Parameter totals are checked against the Hugging Face models built on the
# meta device (tests/test_moe.py) and the published figures cited here.
# mistralai/Mixtral-8x7B-v0.1 config.json (Jiang et al., 2024): 46,702,792,704 parameters, 8
# experts of 14336 per layer, 2 per token: 12.9e9 active; every layer MoE.
_preset(
    ModelConfig(
        name="mixtral-8x7b",
        num_layers=32,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        d_ff=14336,
        vocab_size=32000,
        rope_theta=1_000_000.0,
        num_experts=8,
        experts_per_token=2,
        moe_d_ff=14336,
    )
)
# Qwen/Qwen3-30B-A3B config.json (Qwen team, 2025): 30.5e9 parameters, 3.3e9 active; 128 experts
# of 768, 8 per token (renormalised), q/k norms; every layer MoE (d_ff 6144 is unused).
_preset(
    ModelConfig(
        name="qwen3-30b-a3b",
        num_layers=48,
        d_model=2048,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        d_ff=6144,
        vocab_size=151936,
        qk_norm=True,
        rope_theta=1_000_000.0,
        norm_eps=1e-6,
        num_experts=128,
        experts_per_token=8,
        moe_d_ff=768,
    )
)
# DeepSeek's MLA widths, shared by V2-Lite and V3: latent 512, RoPE key 64, q/k 128 + 64, v 128.
_DEEPSEEK_MLA = dict(
    head_dim=192, norm_eps=1e-6, kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128
)


def _deepseek_yarn(mscale: float) -> dict:
    """Both configs' rope_scaling: YaRN x40 over 4096 positions with mscale = mscale_all_dim, so
    cos and sin keep factor 1 and the softmax scale gains yarn_mscale(40, mscale)^2."""
    return dict(
        rope_scaling="yarn",
        rope_factor=40.0,
        rope_original_context=4096,
        query_pre_attn_scalar=192 / yarn_mscale(40.0, mscale) ** 4,
    )


# deepseek-ai/DeepSeek-V2-Lite config.json (DeepSeek-AI, 2024): 15.7e9 parameters, 2.4e9 active;
# MLA without a query low rank; layer 0 dense (10944), then 64 routed experts of 1408 (6 per
# token, softmax, not renormalised) and 2 shared.
_preset(
    ModelConfig(
        name="deepseek-v2-lite",
        **_deepseek_yarn(0.707),
        num_layers=27,
        d_model=2048,
        num_heads=16,
        num_kv_heads=16,
        d_ff=10944,
        vocab_size=102400,
        num_experts=64,
        experts_per_token=6,
        num_shared_experts=2,
        moe_d_ff=1408,
        first_dense_layers=1,
        norm_topk_prob=False,
        **_DEEPSEEK_MLA,
    )
)
# deepseek-ai/DeepSeek-V3 config.json (DeepSeek-AI, 2024): 671.0e9 parameters without the
# multi-token-prediction module (HF's 685e9 includes it), 37e9 active; MLA (q rank 1536, latent
# 512, RoPE 64); layers 0-2 dense (18432), then 256 routed experts of 2048 (8 per token: sigmoid
# scores, a score-correction bias, 4 of 8 groups, renormalised, x 2.5) and 1 shared.
_preset(
    ModelConfig(
        name="deepseek-v3",
        **_deepseek_yarn(1.0),
        num_layers=61,
        d_model=7168,
        num_heads=128,
        num_kv_heads=128,
        d_ff=18432,
        vocab_size=129280,
        q_lora_rank=1536,
        num_experts=256,
        experts_per_token=8,
        num_shared_experts=1,
        moe_d_ff=2048,
        first_dense_layers=3,
        router="sigmoid",
        routed_scaling_factor=2.5,
        expert_groups=8,
        topk_groups=4,
        **_DEEPSEEK_MLA,
    )
)
# Tiny MoE: 6 experts of 20, 2 per token, every dimension distinct from tiny-gqa's.
_TINY_MOE = dict(num_experts=6, experts_per_token=2, moe_d_ff=20)
_preset(ModelConfig(name="tiny-moe", num_kv_heads=3, **_TINY, **_TINY_MOE))
# the further families, the hybrids, and the models the published serving results use
from kvjax.model import presets_families, presets_hybrid, presets_serving  # noqa: E402, F401
