"""Presets of the hybrids whose layers keep a state that does not grow, each citing its source,
and tiny ones for tests. Parameter counts are checked in tests/test_hybrid.py against
the Hugging Face model built on the meta device (and in tests/test_nn.py against kvjax's)."""

from kvjax.model.config import ModelConfig, _preset

# Qwen/Qwen3-Next-80B-A3B (Qwen3NextConfig's defaults are its shapes: 48 layers of hidden 2048,
# every 4th gated full attention (16 / 2 heads of 256, q/k norms, RoPE on a quarter of each head,
# base 1e7), the rest Gated DeltaNet (16 q/k heads and 32 value heads of 128, conv 4); every layer
# MoE: 512 experts of 512, 10 a token, one gated shared expert of 512; vocab 151936, untied).
_preset(
    ModelConfig(
        name="qwen3-next-80b-a3b",
        num_layers=48,
        d_model=2048,
        num_heads=16,
        num_kv_heads=2,
        head_dim=256,
        d_ff=5632,
        vocab_size=151936,
        rope_theta=10_000_000.0,
        rotary_dim=64,
        norm_eps=1e-6,
        norm_plus_one=True,
        qk_norm=True,
        attn_output_gate=True,
        num_experts=512,
        experts_per_token=10,
        moe_d_ff=512,
        num_shared_experts=1,
        shared_expert_gate=True,
        layer_kinds="DDDA",
        state_heads=32,
        state_groups=16,
        state_key_dim=128,
        state_value_dim=128,
        conv_kernel=4,
        scan_chunk=64,
    )
)

# tiiuae/Falcon-H1-7B (Transformers' FalconH1 table: 44 layers, hidden 3072, 12 / 2 attention
# heads of 128, 24 Mamba-2 heads of 128 with state 256; its config.json: intermediate 12288,
# vocab 130048, untied, mamba_d_ssm 3072, 1 group, conv 4 with bias, chunk 128, no gated norm).
# Its muP multipliers are left at 1 here (they change no size).
_preset(
    ModelConfig(
        name="falcon-h1-7b",
        num_layers=44,
        d_model=3072,
        num_heads=12,
        num_kv_heads=2,
        head_dim=128,
        d_ff=12288,
        vocab_size=130048,
        layer_kinds="H",
        state_heads=24,
        state_groups=1,
        state_key_dim=256,
        state_value_dim=128,
        conv_kernel=4,
        conv_bias=True,
        scan_chunk=128,
    )
)

# LiquidAI/LFM2-1.2B (its config.json: 16 layers of hidden 2048, GQA at layers 2, 5, 8, 10, 12,
# 14 (32 / 8 heads of 64, q/k norms, RoPE base 1e6), short convolutions of L_cache 3 elsewhere;
# block_ff_dim 12288 auto-adjusted to 8192; vocab 65536, tied).
_preset(
    ModelConfig(
        name="lfm2-1.2b",
        num_layers=16,
        d_model=2048,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        d_ff=8192,
        vocab_size=65536,
        tied_embeddings=True,
        rope_theta=1_000_000.0,
        qk_norm=True,
        layer_kinds="CCACCACCACACACAC",
        conv_kernel=3,
    )
)

# Tiny hybrids for tests, traces and the CPU decode benchmark: f32, every dimension distinct
# (D=40, F=56, V=97; attention 4 / 2 heads of 10; state heads 4 in 2 groups, d_k / N 6, d_v / P 5).
_TINY_HYBRID = dict(
    num_layers=2,
    d_model=40,
    num_heads=4,
    num_kv_heads=2,
    head_dim=10,
    d_ff=56,
    vocab_size=97,
    weight_dtype="f32",
    kv_dtype="f32",
)
_TINY_STATE = dict(state_heads=4, state_groups=2, state_key_dim=6, state_value_dim=5)
_preset(
    ModelConfig(
        name="tiny-qwen3-next",
        layer_kinds="DA",
        conv_kernel=4,
        scan_chunk=64,
        rotary_dim=4,
        qk_norm=True,
        norm_plus_one=True,
        attn_output_gate=True,
        **_TINY_STATE,
        **_TINY_HYBRID,
    )
)
_preset(
    ModelConfig(
        name="tiny-falcon-h1",
        layer_kinds="H",
        conv_kernel=4,
        conv_bias=True,
        scan_chunk=8,
        **_TINY_STATE,
        **_TINY_HYBRID,
    )
)
_preset(
    ModelConfig(
        name="tiny-lfm2",
        layer_kinds="CA",
        conv_kernel=3,
        qk_norm=True,
        tied_embeddings=True,
        **_TINY_HYBRID,
    )
)
