"""Presets of the families added after the first eleven (issue 29), each citing its source: the
model card's architecture table and the transformers config class's defaults (which a Hub
config.json omits when it equals them). Parameter counts are checked in tests/test_families.py
against the Hugging Face model built on the meta device."""

from kvjax.config import ModelConfig, _preset

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
