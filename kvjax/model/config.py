"""Model configuration: `ModelConfig` (frozen, validated on construction, derived sizes as
properties: levanter's style) and the registry of published presets (`PRESETS`,
`get_model_config`; the presets themselves are `kvjax.model.presets*`).

Validation: each field's type and range (`kvjax.model.field_checks`), then the features together
(`kvjax.model.checks`, `moe_checks`, `hybrid`). Hugging Face `config.json` import is
`kvjax.model.hf`. Letters: `kvjax.kernels`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvjax.dtypes import (  # noqa: F401 (re-exported: kvjax.model.config's public names)
    DTYPE_BYTES,
    GROUP_SCALE_BYTES,
    MXFP4_BLOCK,
    MXFP4_BLOCK_BYTES,
    PACKED_KV_BYTES,
    SCALE_BYTES,
    canonical_dtype,
)
from kvjax.errors import unknown_name_error
from kvjax.model.checks import (  # the constants re-exported for the CLI and the docs
    ACTIVATIONS,  # noqa: F401 (re-exported)
    KV_SCALES,
    MLA_FORMS,
    check_features,
    check_mla,
    check_rope,
    check_scales,
    check_window,
)
from kvjax.model.field_checks import check_numbers, check_shape
from kvjax.model.hybrid import LAYER_KINDS, check_hybrid
from kvjax.model.moe_checks import ROUTERS, check_moe


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer (Llama family), validated on construction.

    `head_dim` is its own field: Gemma-7B has 16 heads of 256 with d_model 3072, so it can never be
    derived as d_model // num_heads. A variant is `dataclasses.replace(cfg, num_kv_heads=8)`, which
    runs the same validation.
    """

    num_layers: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    gated_mlp: bool = True  # SwiGLU/GeGLU: gate, up and down matrices; else up and down
    mlp_activation: str = "silu"
    # clamped_swiglu (gpt-oss): (clip(up, -limit, limit) + 1) * g * sigmoid(alpha * g),
    # where g = min(gate, limit)
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    tied_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 has biases on the q, k and v projections
    o_bias: bool = False  # a bias on the attention's output projection (Seed-OSS, StarCoder2)
    mlp_bias: bool = False  # biases on the dense MLP's projections (StarCoder2, Llama's mlp_bias)
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    matmul_dtype: str = ""  # the matmuls' inputs (fp8, fp4: a chip's peak); "": compute_dtype
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    norm_kind: str = "rms"  # the block and final norms: RMSNorm, or LayerNorm (StarCoder2, Cohere)
    norm_bias: bool = False  # a LayerNorm's bias (StarCoder2, StableLM; Cohere has none)
    kv_lora_rank: int = 0  # MLA (DeepSeek-V2/V3): the latent; > 0 makes a model MLA
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mla_decode: str = "absorbed"
    sliding_window: int = 0  # positions a sliding ("L", local) layer attends, itself included
    layer_pattern: str = "G"  # per layer G (global: full) or L (local: sliding), tiled over L
    rope_pattern: str = "R"  # per layer R (RoPE) or N (NoPE: no position encoding), tiled over L
    rotary_dim: int = 0  # RoPE on the first rotary_dim of head_dim (partial rotary; 0: all)
    # tokens a sliding layer keeps from the sequence's start beside its window (StreamingLLM's
    # attention sinks, Xiao et al. 2023): query t sees key j when j < sink_tokens or t - j < W
    sink_tokens: int = 0
    # Llama 4: the L layers attend chunks of sliding_window tokens instead of a sliding window
    # (query t sees key j when j // W == t // W and j <= t; its attention_chunk_size), on the
    # same rolling buffer of W slots (the chunk's keys are the slots below t mod W)
    chunked_attention: bool = False
    kv_scales: str = "auto"  # a quantized cache's scales: `kv_scale_kind` resolves "auto"
    kv_group_size: int = 32  # packed 4/2-bit caches: elements per scale/zero group (KIVI's 32)
    # Gemma / Qwen3 details (the defaults are Llama's):
    norm_plus_one: bool = False  # Gemma: RMSNorm scales by (1 + w), in f32, w stored from 0
    scale_embeddings: bool = False  # Gemma: embeddings times sqrt(d_model)
    sandwich_norms: bool = False  # Gemma 2/3: RMSNorm on the attention and MLP outputs too
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm of every q and k head (over head_dim)
    qk_norm_full: bool = False  # OLMo 2: the q/k norms over all heads' width (N*H, K*H) at once
    # Llama 4: q and k heads RMS-normed over head_dim without a scale (its L2Norm, eps norm_eps),
    # after RoPE, on the RoPE layers only
    qk_l2_norm: bool = False
    # Llama 4's attention temperature tuning on its NoPE layers: q at position t times
    # log(floor((t + 1) / temperature_floor) + 1) * temperature_scale + 1 (0: off)
    temperature_floor: int = 0
    temperature_scale: float = 0.1
    pre_norms: bool = True  # False: OLMo 2's blocks norm only their outputs (sandwich_norms)
    parallel_block: bool = False  # Cohere: x + attn(norm(x)) + mlp(norm(x)), one norm a block
    query_pre_attn_scalar: float = 0.0  # softmax scale 1/sqrt(this) (0: head_dim)
    # Granite's muP multipliers: embeddings times e, each residual branch times r before its
    # add, logits divided by s (its attention_multiplier is the softmax scale above)
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    rope_local_theta: float = 0.0  # sliding layers' RoPE base (Gemma 3: 10000; 0: rope_theta)
    rope_linear_factor: float = 1.0  # positions / factor in layers on rope_theta (HF "linear")
    # long-context RoPE in the layers on rope_theta: Llama 3.1's "llama3" or "yarn"
    rope_scaling: str = "none"
    rope_factor: float = 1.0  # the context extension factor
    rope_original_context: int = 0  # original_max_position_embeddings
    rope_low_freq_factor: float = 1.0  # llama3's ramp, over original_context / these
    rope_high_freq_factor: float = 4.0
    rope_beta_fast: float = 32.0  # YaRN's ramp, in rotations over the original context
    rope_beta_slow: float = 1.0
    rope_truncate: bool = True  # YaRN: the ramp's ends rounded to whole dimensions
    rope_attention_factor: float = 1.0  # YaRN: cos and sin times this (its "mscale")
    attn_softcap: float = 0.0  # scores = c * tanh(scores / c) before the mask (Gemma 2: 50)
    # gpt-oss: a learned logit per query head joins every softmax's denominator (attends to
    # nothing; Xiao et al.'s sink as a parameter, not a kept token: that is `sink_tokens`)
    sink_logits: bool = False
    final_softcap: float = 0.0  # logits = c * tanh(logits / c) (Gemma 2: 30)
    # Mixture of experts (0 experts: dense). Layers from `first_dense_layers` on are MoE (every
    # moe_layer_step-th of them: layer i when (i - first_dense_layers + 1) % step == 0): a router,
    # E routed experts of width moe_d_ff (k per token) and num_shared_experts x moe_d_ff shared.
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    shared_expert_d_ff: int = 0  # one shared expert of any width (Qwen2-MoE); 0: none such
    shared_expert_gate: bool = False  # Qwen2-MoE: the shared experts' output x sigmoid(x @ w_g)
    router_bias: bool = False  # gpt-oss: a bias on the router's logits
    expert_bias: bool = False  # gpt-oss: biases on every expert's gate_up and down
    expert_weight_dtype: str = ""  # "" (weight_dtype) or "mxfp4" (gpt-oss, closed form only)
    moe_d_ff: int = 0
    first_dense_layers: int = 0  # DeepSeek's first_k_dense_replace: these keep a d_ff MLP
    moe_layer_step: int = 1  # Llama 4's interleave_moe_layer_step (Scout 1, Maverick 2)
    router: str = "softmax"
    norm_topk_prob: bool = True  # renormalise the k weights to sum 1
    routed_scaling_factor: float = 1.0  # DeepSeek-V3: 2.5
    expert_groups: int = 1  # DeepSeek's n_group: experts chosen within the best topk_groups
    topk_groups: int = 1
    # "xla": scores, softmax and av as XLA runs the model's einsums (the scores through memory);
    # "flash": one fused kernel (FlashAttention-2 prefill, flash-decoding: kvjax.analytic.flash)
    attention_kernel: str = "xla"
    # The layers' kinds, one letter a layer tiled over L: A attention; layers whose state does
    # not grow: D Gated DeltaNet (Qwen3-Next), H Mamba-2 beside attention (Falcon-H1), C short
    # conv (LFM2)
    layer_kinds: str = "A"
    state_heads: int = 0  # D: value heads; H: Mamba heads (each holds a key_dim x value_dim state)
    state_groups: int = 0  # D: q/k heads, each serving heads/groups value heads; H: B/C groups
    state_key_dim: int = 0  # D: d_k; H: the state size N (d_state)
    state_value_dim: int = 0  # D: d_v; H: the Mamba head dim P
    conv_kernel: int = 0  # the short causal convolution's width (D, H: 4; C: LFM2's L_cache 3)
    conv_bias: bool = False  # H: the conv's bias; C: biases on the conv, in_proj and out_proj
    state_norm: bool = False  # H: a gated RMSNorm before out_proj (Falcon-H1's mamba_rms_norm)
    state_norm_before_gate: bool = False  # its order: norm(y) * silu(z); else norm(y * silu(z))
    scan_chunk: int = 64  # chunk of the chunked prefill scan (D: HF's fixed 64; H: from config)
    state_dtype: str = "f32"  # the recurrent state's (HF keeps it f32); conv caches: compute dtype
    attn_output_gate: bool = False  # Qwen3-Next: q_proj adds N*H gates, output * sigmoid(gate)
    name: str = "custom"

    def __post_init__(self) -> None:
        check_shape(self)
        object.__setattr__(self, "weight_dtype", canonical_dtype(self.weight_dtype, "weight_dtype"))
        object.__setattr__(self, "kv_dtype", canonical_dtype(self.kv_dtype, "kv_dtype", True))
        check_numbers(self)
        check_features(self)
        check_rope(self)
        check_mla(self)
        check_moe(self)
        check_window(self)
        check_scales(self)
        check_hybrid(self)

    # Derived sizes (levanter style: properties, never stored).
    @property
    def group_size(self) -> int:
        """G = N / K query heads per kv head."""
        return self.num_heads // self.num_kv_heads

    @property
    def kv_scale_kind(self) -> str:
        """ "none", "tensor", "token_head" or "group": "auto" is grouped for the packed int4/int2
        caches (KIVI: an f16 scale and zero point per kv_group_size elements), per token per KV
        head for int8 (an f32 absmax / 127 for each K and V row of H), per tensor for fp8 (vLLM's
        uncalibrated k_scale = v_scale = 1.0), none for wider caches and MLA's latent."""
        if self.kv_scales != "auto":
            return self.kv_scales
        if self.kv_packed:
            return "group"
        if self.kv_dtype == "int8":
            return "token_head"
        return "tensor" if self.kv_dtype == "fp8" and not self.is_mla else "none"

    @property
    def attn_scale(self) -> float:
        """The softmax scale: 1/sqrt(query_pre_attn_scalar) (Gemma), else 1/sqrt(head_dim)."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def layer_rope(self, layer: int) -> tuple[float, float]:
        """(RoPE base, linear position factor) of layer `layer`: a sliding layer of a model with
        `rope_local_theta` (Gemma 3) uses that base unscaled, every other the global pair."""
        if self.rope_local_theta and self.layer_is_sliding(layer):
            return self.rope_local_theta, 1.0
        return self.rope_theta, self.rope_linear_factor

    def rope_table(self, sliding: bool) -> bool:
        """The layer's RoPE frequencies are `rope_scaling`'s (constants, `kvjax.model.rope`): every
        layer on rope_theta, i.e. all but the sliding ones of a model with rope_local_theta."""
        return self.rope_scaling != "none" and not (sliding and self.rope_local_theta)

    def layer_is_sliding(self, layer: int) -> bool:
        """Layer `layer` attends a sliding window (its pattern letter is L)."""
        return self.layer_pattern[layer % len(self.layer_pattern)] == "L"

    @property
    def rope_width(self) -> int:
        """The rotated width of each q and k head: rotary_dim, or head_dim."""
        return self.rotary_dim or self.head_dim

    def layer_has_rope(self, layer: int) -> bool:
        """Layer `layer` rotates q and k (its rope_pattern letter is R; N: NoPE, SmolLM3)."""
        return self.rope_pattern[layer % len(self.rope_pattern)] == "R"

    @property
    def num_sliding_layers(self) -> int:
        return sum(self.layer_is_sliding(i) for i in range(self.num_layers))

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def layer_is_moe(self, layer: int) -> bool:
        """Layer `layer` has the MoE MLP: from first_dense_layers on, every moe_layer_step-th
        (Llama 4 Maverick's 2: layers 1, 3, 5, ...)."""
        first = self.first_dense_layers
        return self.is_moe and layer >= first and (layer - first + 1) % self.moe_layer_step == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.layer_is_moe(i) for i in range(self.num_layers))

    def layer_is_chunked(self, layer: int) -> bool:
        """Layer `layer` attends chunks (Llama 4's chunked layers: `chunked_attention`)."""
        return self.chunked_attention and self.layer_is_sliding(layer)

    def layer_kind(self, layer: int) -> str:
        """Layer `layer`'s letter in `layer_kinds` (A attention, D, H, C: `LAYER_KINDS`)."""
        return self.layer_kinds[layer % len(self.layer_kinds)]

    def layer_has_attention(self, layer: int) -> bool:
        """Layer `layer` attends (and holds a KV cache): kinds A and H."""
        return self.layer_kind(layer) in "AH"

    @property
    def num_attention_layers(self) -> int:
        return sum(self.layer_has_attention(i) for i in range(self.num_layers))

    @property
    def is_hybrid(self) -> bool:
        """Some layer's state does not grow (a D, H or C layer: `LAYER_KINDS`)."""
        return set(self.layer_kinds) != {"A"}

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def qk_nope_head_dim(self) -> int:
        """MLA: the part of each query/key head without RoPE (head_dim - qk_rope_head_dim)."""
        return self.head_dim - self.qk_rope_head_dim

    @property
    def o_head_dim(self) -> int:
        """Width of each head's attention output: v_head_dim for MLA, else head_dim."""
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def weight_bytes_per_element(self) -> int:
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def kv_bytes_per_element(self) -> float:
        """1, 2, 4; 0.5 and 0.25 for the packed int4 / int2 caches (closed form only)."""
        return PACKED_KV_BYTES.get(self.kv_dtype) or DTYPE_BYTES[self.kv_dtype]

    @property
    def kv_packed(self) -> bool:
        """A packed 4/2-bit cache: sized and costed in closed form, no model array holds it."""
        return self.kv_dtype in PACKED_KV_BYTES

    @property
    def compute_dtype(self) -> str:
        """Activations and matmuls run in the weight dtype; int8/fp8 weights compute in bf16."""
        return self.weight_dtype if DTYPE_BYTES[self.weight_dtype] >= 2 else "bf16"

    @property
    def peak_dtype(self) -> str:
        """The dtype whose peak the matmuls run at: `matmul_dtype` (FP8/FP4 engines), else the
        compute dtype (activations stay in it either way)."""
        return self.matmul_dtype or self.compute_dtype

    @property
    def shared_d_ff(self) -> int:
        """The shared experts' MLP width (DeepSeek's built as one wide MLP)."""
        return self.shared_expert_d_ff or self.num_shared_experts * self.moe_d_ff

    @property
    def attention_variant(self) -> str:
        if self.is_mla:
            return "MLA"
        return {self.num_heads: "MHA", 1: "MQA"}.get(self.num_kv_heads, "GQA")

    def kv_head_choices(self) -> list[int]:
        """Every valid num_kv_heads for this model: the divisors of num_heads (MLA: N only)."""
        n = self.num_heads
        return [n] if self.is_mla else [k for k in range(1, n + 1) if n % k == 0]

    def replace(self, **changes: Any) -> ModelConfig:
        """`dataclasses.replace` with a clear error for an unknown field."""
        names = {f.name for f in dataclasses.fields(self)}
        for key in changes:
            if key not in names:
                raise unknown_name_error("ModelConfig field", key, names)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


__all__ = [
    "DTYPE_BYTES",
    "KV_SCALES",
    "LAYER_KINDS",
    "MLA_FORMS",
    "PACKED_KV_BYTES",
    "PRESETS",
    "ROUTERS",
    "ModelConfig",
    "canonical_dtype",
    "get_model_config",
]

# Presets: defined in `kvjax.model.presets` (each citing its published config), registered here on
# import of the package.
PRESETS: dict[str, ModelConfig] = {}


def _preset(cfg: ModelConfig) -> ModelConfig:
    PRESETS[cfg.name] = cfg
    return cfg


def get_model_config(name: str, **overrides: Any) -> ModelConfig:
    """A preset by name, optionally with fields replaced (`num_kv_heads=1`)."""
    if name not in PRESETS:
        raise unknown_name_error("model", name, PRESETS)
    cfg = PRESETS[name]
    return cfg.replace(**overrides) if overrides else cfg
