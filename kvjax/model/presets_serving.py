"""Presets the published serving results use (MLPerf Inference, TensorRT-LLM's and the engines'
tables), each from its Hugging Face config.json. Llama 3.1 and 3.3 keep Llama 3's
shapes and add rope_scaling "llama3" (factor 8 over 8192 positions, low/high frequency factors 1
and 4); DeepSeek-R1 is DeepSeek-V3's architecture (its config.json is V3's, weights retrained)."""

from __future__ import annotations

from kvjax.model.config import PRESETS, ModelConfig, _preset

_LLAMA31 = dict(
    num_kv_heads=8,
    head_dim=128,
    vocab_size=128256,
    rope_theta=500000.0,
    rope_scaling="llama3",
    rope_factor=8.0,
    rope_original_context=8192,
)
# meta-llama/Llama-3.1-8B config.json: 8.03e9 parameters (Llama 3 8B's shapes).
_preset(
    ModelConfig(
        name="llama-3.1-8b", num_layers=32, d_model=4096, num_heads=32, d_ff=14336, **_LLAMA31
    )
)
# meta-llama/Llama-3.1-70B config.json: 70.6e9 parameters.
_preset(
    ModelConfig(
        name="llama-3.1-70b", num_layers=80, d_model=8192, num_heads=64, d_ff=28672, **_LLAMA31
    )
)
# meta-llama/Llama-3.3-70B-Instruct config.json: Llama 3.1 70B's every field.
_preset(PRESETS["llama-3.1-70b"].replace(name="llama-3.3-70b"))
# meta-llama/Llama-3.1-405B config.json: 126 layers, hidden 16384, 128 query and 8 KV heads,
# intermediate 53248: 405.9e9 parameters.
_preset(
    ModelConfig(
        name="llama-3.1-405b", num_layers=126, d_model=16384, num_heads=128, d_ff=53248, **_LLAMA31
    )
)
# Qwen/Qwen3-235B-A22B config.json (Qwen team, 2025): 94 layers, hidden 4096, 64 query and 4 KV
# heads of 128, q/k norms; every layer MoE, 128 experts of 1536, 8 per token (renormalised);
# 235e9 parameters, 22e9 active (intermediate_size 12288 is unused).
_preset(
    ModelConfig(
        name="qwen3-235b-a22b",
        num_layers=94,
        d_model=4096,
        num_heads=64,
        num_kv_heads=4,
        head_dim=128,
        d_ff=12288,
        vocab_size=151936,
        qk_norm=True,
        rope_theta=1_000_000.0,
        norm_eps=1e-6,
        num_experts=128,
        experts_per_token=8,
        moe_d_ff=1536,
    )
)
# deepseek-ai/DeepSeek-R1 config.json: DeepseekV3ForCausalLM with V3's every field.
_preset(PRESETS["deepseek-v3"].replace(name="deepseek-r1"))
