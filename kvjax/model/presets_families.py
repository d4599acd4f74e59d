"""Presets of the decoder families beyond `kvjax.model.presets`'s, each citing its source: the
model card's architecture table and the transformers config class's defaults (which a Hub
config.json omits when it equals them). Parameter counts are checked in tests/test_families.py
against the Hugging Face model built on the meta device."""

from kvjax.model.config import ModelConfig, _preset
from kvjax.model.rope import yarn_mscale

# ByteDance-Seed/Seed-OSS-36B (model card: 64 layers, 80 / 8 / 8 heads of 128, hidden 5120,
# vocabulary 155K, RoPE base 1e7); SeedOssConfig's defaults: intermediate 27648, vocab 155136,
# rms_norm_eps 1e-6, attention_bias (q, k, v) true, attention_out_bias and mlp_bias false.
_preset(
    ModelConfig(
        name="seed-oss-36b",
        num_layers=64,
        d_model=5120,
        num_heads=80,
        num_kv_heads=8,
        head_dim=128,
        d_ff=27648,
        vocab_size=155136,
        qkv_bias=True,
        rope_theta=10_000_000.0,
        norm_eps=1e-6,
    )
)

# IBM Granite 3.x 8B (the instruct config.json published with transformers 4.49: 40 layers,
# 32 / 8 heads of 128, hidden 4096, intermediate 12800, vocab 49159, tied embeddings, RoPE base
# 1e7) and its muP multipliers: embeddings x 12, residual branches x 0.22, softmax scale
# 0.0078125 = 1/128 (query_pre_attn_scalar 16384), logits / 16.
_preset(
    ModelConfig(
        name="granite-3-8b",
        num_layers=40,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        d_ff=12800,
        vocab_size=49159,
        tied_embeddings=True,
        rope_theta=10_000_000.0,
        query_pre_attn_scalar=16384.0,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        logits_scaling=16.0,
    )
)

# HuggingFaceTB/SmolLM3-3B (SmolLM3Config's defaults, written from it: 36 layers, 16 / 4 heads of
# 128, hidden 2048, intermediate 11008, vocab 128256, tied embeddings, RoPE base 2e6, rms eps
# 1e-6) and its NoPE layers: every fourth layer (3, 7, ...) has no position encoding.
_preset(
    ModelConfig(
        name="smollm3-3b",
        num_layers=36,
        d_model=2048,
        num_heads=16,
        num_kv_heads=4,
        head_dim=128,
        d_ff=11008,
        vocab_size=128256,
        tied_embeddings=True,
        rope_theta=2_000_000.0,
        norm_eps=1e-6,
        rope_pattern="RRRN",
    )
)

# microsoft/Phi-3-mini-4k-instruct (Phi3Config's defaults, written from it: 32 layers, 32 heads
# of 96 with as many KV heads, hidden 3072, intermediate 8192, vocab 32064, untied; its published
# config.json sets sliding_window 2047, every layer). Its checkpoint fuses q/k/v and gate/up
# (split on load: the costs are the separate products').
_preset(
    ModelConfig(
        name="phi-3-mini",
        num_layers=32,
        d_model=3072,
        num_heads=32,
        num_kv_heads=32,
        head_dim=96,
        d_ff=8192,
        vocab_size=32064,
        sliding_window=2047,
        layer_pattern="L",
    )
)

# bigcode/starcoder2-3b's sizes, which are Starcoder2Config's defaults: 30 layers, 24 / 2 heads of
# 128, hidden 3072, intermediate 12288 (plain GELU MLP), vocab 49152, tied embeddings; LayerNorm
# with a bias, and a bias on every projection (use_bias).
_preset(
    ModelConfig(
        name="starcoder2-3b",
        num_layers=30,
        d_model=3072,
        num_heads=24,
        num_kv_heads=2,
        head_dim=128,
        d_ff=12288,
        vocab_size=49152,
        tied_embeddings=True,
        gated_mlp=False,
        mlp_activation="gelu",
        norm_kind="layer",
        norm_bias=True,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
    )
)

# stabilityai/stablelm-3b-4e1t, StableLmConfig's defaults: 32 layers, 32 heads of 80 (MHA),
# hidden 2560, intermediate 6912, vocab 50304, untied; LayerNorm with a bias; RoPE on the first
# quarter of each head (partial_rotary_factor 0.25: 20 of 80).
_preset(
    ModelConfig(
        name="stablelm-3b",
        num_layers=32,
        d_model=2560,
        num_heads=32,
        num_kv_heads=32,
        head_dim=80,
        d_ff=6912,
        vocab_size=50304,
        norm_kind="layer",
        norm_bias=True,
        rotary_dim=20,
    )
)

# allenai/OLMo-2-1124-7B: 32 layers, 32 heads of 128 (MHA), hidden 4096, intermediate 11008,
# vocab 100352, RoPE base 500000, rms eps 1e-6, untied; its blocks norm the attention and MLP
# outputs only (no norm before them), and q and k are normed over all their heads at once.
_preset(
    ModelConfig(
        name="olmo-2-7b",
        num_layers=32,
        d_model=4096,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        d_ff=11008,
        vocab_size=100352,
        rope_theta=500_000.0,
        norm_eps=1e-6,
        pre_norms=False,
        sandwich_norms=True,
        qk_norm=True,
        qk_norm_full=True,
    )
)

# Qwen/Qwen1.5-MoE-A2.7B, Qwen2MoeConfig's defaults: 24 layers, 16 heads of 128 (MHA), hidden
# 2048, vocab 151936, q/k/v biases, rms eps 1e-6, untied; 60 experts of 1408, 4 a token
# (softmax, not renormalised), and one shared expert of 5632 (= 4 experts) whose output a
# sigmoid gate scales.
_preset(
    ModelConfig(
        name="qwen1.5-moe-a2.7b",
        num_layers=24,
        d_model=2048,
        num_heads=16,
        num_kv_heads=16,
        head_dim=128,
        d_ff=5632,
        vocab_size=151936,
        qkv_bias=True,
        norm_eps=1e-6,
        num_experts=60,
        experts_per_token=4,
        moe_d_ff=1408,
        num_shared_experts=4,
        shared_expert_gate=True,
        norm_topk_prob=False,
    )
)

# allenai/OLMoE-1B-7B-0924, OlmoeConfig's defaults: 16 layers, 16 heads of 128 (MHA), hidden
# 2048, vocab 50304, untied; every layer 64 experts of 2048, 8 a token (softmax, not
# renormalised); q and k normed over all their heads at once (as OLMo 2), Llama's pre-norms.
_preset(
    ModelConfig(
        name="olmoe-1b-7b",
        num_layers=16,
        d_model=2048,
        num_heads=16,
        num_kv_heads=16,
        head_dim=128,
        d_ff=2048,
        vocab_size=50304,
        qk_norm=True,
        qk_norm_full=True,
        num_experts=64,
        experts_per_token=8,
        moe_d_ff=2048,
        norm_topk_prob=False,
    )
)

# GLM-4-9B (zai-org/GLM-4-9B-0414's sizes, which are Glm4Config's defaults): 40 layers, 32 / 2
# heads of 128, hidden 4096, intermediate 13696, vocab 151552, rms eps 1.5625e-7, untied; q/k/v
# biases; a norm before and after both attention and the MLP; RoPE on the first half of each
# head (interleaved pairs, reordered on load).
_preset(
    ModelConfig(
        name="glm-4-9b",
        num_layers=40,
        d_model=4096,
        num_heads=32,
        num_kv_heads=2,
        head_dim=128,
        d_ff=13696,
        vocab_size=151552,
        qkv_bias=True,
        sandwich_norms=True,
        rotary_dim=64,
        norm_eps=1.5625e-7,
    )
)

# baidu/ERNIE-4.5-0.3B-PT, Ernie4_5Config's defaults: 18 layers, 16 / 2 heads of 128, hidden
# 1024, intermediate 3072, vocab 103424, tied embeddings, RoPE base 500000 (interleaved pairs,
# reordered on load), no biases (use_bias false).
_preset(
    ModelConfig(
        name="ernie-4.5-0.3b",
        num_layers=18,
        d_model=1024,
        num_heads=16,
        num_kv_heads=2,
        head_dim=128,
        d_ff=3072,
        vocab_size=103424,
        tied_embeddings=True,
        rope_theta=500_000.0,
    )
)

# LGAI-EXAONE/EXAONE-4.0-32B (its config.json as TensorRT-LLM's tests carry it: 64 layers, 40 /
# 8 heads of 128, hidden 5120, intermediate 27392, vocab 102400, RoPE base 1e6, untied): three
# sliding layers of 4096 for every global one, RoPE on the sliding layers only; its blocks norm
# only their outputs, and q and k are normed per head. (Its llama3 RoPE scaling changes no
# cost.)
_preset(
    ModelConfig(
        name="exaone-4.0-32b",
        num_layers=64,
        d_model=5120,
        num_heads=40,
        num_kv_heads=8,
        head_dim=128,
        d_ff=27392,
        vocab_size=102400,
        rope_theta=1_000_000.0,
        sliding_window=4096,
        layer_pattern="LLLG",
        rope_pattern="RRRN",
        pre_norms=False,
        sandwich_norms=True,
        qk_norm=True,
    )
)

# CohereForAI/c4ai-command-r7b-12-2024 (model_type cohere2): 32 layers, 32 / 8 heads of 128,
# hidden 4096, intermediate 14336, vocab 256000, tied embeddings, RoPE base 50000 (interleaved
# pairs, reordered on load), logits x 0.25; three sliding layers of 4096 for every global one,
# RoPE on the sliding layers only; one LayerNorm (no bias) before attention and the MLP, which
# run in parallel on it.
_preset(
    ModelConfig(
        name="command-r7b",
        num_layers=32,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        d_ff=14336,
        vocab_size=256000,
        tied_embeddings=True,
        rope_theta=50_000.0,
        logits_scaling=4.0,
        sliding_window=4096,
        layer_pattern="LLLG",
        rope_pattern="RRRN",
        norm_kind="layer",
        parallel_block=True,
    )
)

# internlm/internlm3-8b-instruct (config.json: 48 layers, 32 / 2 heads of 128, hidden 4096,
# intermediate 10240, vocab 128512, RoPE base 5e7 with dynamic NTK scaling x6 beyond 32768
# positions, which changes no cost; no biases). transformers runs it as Llama.
_preset(
    ModelConfig(
        name="internlm3-8b",
        num_layers=48,
        d_model=4096,
        num_heads=32,
        num_kv_heads=2,
        head_dim=128,
        d_ff=10240,
        vocab_size=128512,
        rope_theta=50_000_000.0,
    )
)

# swiss-ai/Apertus-8B-2509's config.json (its card's values; ApertusConfig's defaults are the
# same model but with 32 KV heads and intermediate 14336): 32 layers, 32 / 8 heads of 128, hidden
# 4096, intermediate 21504 in a plain MLP (up -> xIELU -> down, two learned scalars a layer), vocab
# 131072, untied; per-head q/k RMSNorms (as Qwen3); RoPE base 1.2e7 with Llama 3.1's scaling
# (factor 8 over 8192 positions, ramp 1..4).
_preset(
    ModelConfig(
        name="apertus-8b",
        num_layers=32,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        d_ff=21504,
        vocab_size=131072,
        gated_mlp=False,
        mlp_activation="xielu",
        qk_norm=True,
        rope_theta=12_000_000.0,
        rope_scaling="llama3",
        rope_factor=8.0,
        rope_original_context=8192,
    )
)

# openai/gpt-oss-120b and gpt-oss-20b (config.json, August 2025): 36 / 24 layers, hidden 2880,
# 64 query heads and 8 KV heads of 64, sliding (128 positions) and full attention alternating,
# a learned sink logit per head, biases on q/k/v/o; every layer MoE: 128 / 32 experts of 2880,
# 4 per token, router with a bias, experts with biases and a clamped SwiGLU (alpha 1.702, limit
# 7); vocab 201088, untied; RoPE base 150000 with YaRN x32 over 4096 positions (not truncated,
# cos and sin x 0.1 ln 32 + 1); the experts in MXFP4 (4.25 bits an element), the rest bf16.
_GPT_OSS = dict(
    d_model=2880,
    num_heads=64,
    num_kv_heads=8,
    head_dim=64,
    d_ff=2880,
    vocab_size=201088,
    mlp_activation="clamped_swiglu",
    qkv_bias=True,
    o_bias=True,
    sliding_window=128,
    layer_pattern="LG",
    sink_logits=True,
    experts_per_token=4,
    moe_d_ff=2880,
    router_bias=True,
    expert_bias=True,
    expert_weight_dtype="mxfp4",
    rope_theta=150_000.0,
    rope_scaling="yarn",
    rope_factor=32.0,
    rope_original_context=4096,
    rope_truncate=False,
    rope_attention_factor=yarn_mscale(32.0),
)
_preset(ModelConfig(name="gpt-oss-120b", num_layers=36, num_experts=128, **_GPT_OSS))
_preset(ModelConfig(name="gpt-oss-20b", num_layers=24, num_experts=32, **_GPT_OSS))

# meta-llama/Llama-4-Scout-17B-16E (text_config: 48 layers, 40 / 8 heads of 128, hidden 5120,
# vocab 202048; every layer MoE: 16 experts of 8192, 1 per token, whose sigmoid weight scales the
# expert's input, and one shared expert of 8192 (intermediate_size_mlp 16384 is unused); every
# 4th layer NoPE and global with temperature tuning (floor 8192, scale 0.1), the others chunked
# (8192) with L2 q/k norms. RoPE base 5e5; its llama3 scaling (factor 16 over 8192) is left out
# here (another branch adds rope_scaling="llama3" to the presets). 107,769,861,120 parameters =
# the meta-device Llama4ForCausalLM of its text config (the vision tower not counted).
_preset(
    ModelConfig(
        name="llama-4-scout",
        num_layers=48,
        d_model=5120,
        num_heads=40,
        num_kv_heads=8,
        head_dim=128,
        d_ff=16384,
        vocab_size=202048,
        rope_theta=500_000.0,
        sliding_window=8192,
        layer_pattern="LLLG",
        rope_pattern="RRRN",
        chunked_attention=True,
        qk_l2_norm=True,
        temperature_floor=8192,
        temperature_scale=0.1,
        num_experts=16,
        experts_per_token=1,
        num_shared_experts=1,
        moe_d_ff=8192,
        router="topk_sigmoid",
        norm_topk_prob=False,
    )
)
