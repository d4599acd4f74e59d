"""Validation of `ModelConfig` by part (features, RoPE, MLA, windows, KV scales, the extend step):
each error one line naming the field and what is allowed. The experts' checks are
`kvjax.model.moe_checks`. Imported by `kvjax.model.config`, which re-exports the constants."""

from __future__ import annotations

from typing import Any

from kvjax.dtypes import canonical_dtype
from kvjax.errors import KvjaxError
from kvjax.model.rope import SCALINGS

# xielu: Apertus's, with learned alphas; clamped_swiglu: gpt-oss's (kvjax.nn.mlp)
ACTIVATIONS = ("silu", "gelu", "xielu", "clamped_swiglu")

# The config under construction: any object with ModelConfig's fields (read, never built here),
# so this module needs nothing from kvjax.model.config, which imports it.
Fields = Any

KV_SCALES = ("auto", "none", "tensor", "token_head", "group")
MLA_FORMS = ("absorbed", "naive")
_MLA_INT_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")


def check_mla(cfg: Fields) -> None:
    for field in _MLA_INT_FIELDS:
        value = getattr(cfg, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise KvjaxError(f"{field}={value!r} must be a non-negative integer (0: no MLA)")
    if cfg.mla_decode not in MLA_FORMS:
        raise KvjaxError(
            f"mla_decode={cfg.mla_decode!r} is not supported; allowed: {', '.join(MLA_FORMS)}"
        )
    if not cfg.kv_lora_rank:
        for field in ("q_lora_rank", "qk_rope_head_dim", "v_head_dim"):
            if getattr(cfg, field):
                raise KvjaxError(
                    f"{field}={getattr(cfg, field)} is an MLA field, but kv_lora_rank=0 "
                    f"(not MLA); set kv_lora_rank > 0 or {field}=0"
                )
        return
    rope = cfg.qk_rope_head_dim
    if rope <= 0 or rope % 2 or rope >= cfg.head_dim:
        raise KvjaxError(
            f"qk_rope_head_dim={rope} must be even and in 2 .. head_dim-1={cfg.head_dim - 1} "
            f"for MLA (head_dim = qk_nope_head_dim + qk_rope_head_dim)"
        )
    if cfg.v_head_dim <= 0:
        raise KvjaxError(f"v_head_dim={cfg.v_head_dim} must be a positive integer for MLA")
    if cfg.num_kv_heads != cfg.num_heads:
        raise KvjaxError(
            f"num_kv_heads={cfg.num_kv_heads} must equal num_heads={cfg.num_heads} for MLA "
            f"(kv_lora_rank={cfg.kv_lora_rank}): every head re-expands its own key and value "
            f"from the shared latent"
        )
    if cfg.rope_linear_factor != 1.0:
        raise KvjaxError(
            f"rope_linear_factor={cfg.rope_linear_factor} is not supported with MLA "
            f"(kv_lora_rank > 0)"
        )
    for field in (
        "qkv_bias",
        "o_bias",
        "qk_norm",
        "attn_softcap",
        "norm_plus_one",
        "qk_l2_norm",
        "temperature_floor",
    ):
        if getattr(cfg, field):
            raise KvjaxError(
                f"{field}={getattr(cfg, field)!r} is not supported with MLA (kv_lora_rank > 0)"
            )


def check_features(cfg: Fields) -> None:
    """The MLP's activation (and the MLP form it needs), gpt-oss's sink logits, the embedding
    scale, the matmul dtype: one line each naming the field."""
    if cfg.matmul_dtype:
        key = canonical_dtype(cfg.matmul_dtype, "matmul_dtype", compute=True)
        object.__setattr__(cfg, "matmul_dtype", key)
    if cfg.mlp_activation not in ACTIVATIONS:
        raise KvjaxError(
            f"mlp_activation={cfg.mlp_activation!r} is not supported; "
            f"allowed: {', '.join(ACTIVATIONS)}"
        )
    if cfg.mlp_activation == "xielu" and cfg.gated_mlp:
        raise KvjaxError(
            "mlp_activation='xielu' needs gated_mlp=False (Apertus's up -> xIELU -> down)"
        )
    if cfg.mlp_activation == "clamped_swiglu" and not cfg.gated_mlp:
        raise KvjaxError("mlp_activation='clamped_swiglu' needs gated_mlp=True (gate and up)")
    if cfg.sink_logits and cfg.kv_lora_rank:
        raise KvjaxError(
            "sink_logits=True is not supported with MLA (kv_lora_rank > 0): kvjax's latent "
            "attention has no sink term"
        )
    if cfg.scale_embeddings and cfg.embedding_multiplier != 1.0:
        raise KvjaxError(
            f"embedding_multiplier={cfg.embedding_multiplier} with scale_embeddings=True: "
            "one embedding scale (Gemma's sqrt(d_model), or a multiplier), not both"
        )


def check_rope(cfg: Fields) -> None:
    """Long-context RoPE scaling (`kvjax.model.rope`): its kind and the numbers that kind reads."""
    if cfg.rope_scaling not in SCALINGS:
        raise KvjaxError(
            f"rope_scaling={cfg.rope_scaling!r} is not supported; allowed: {', '.join(SCALINGS)}"
        )
    if cfg.rope_scaling == "none":
        return
    if cfg.rope_linear_factor != 1.0:
        raise KvjaxError(
            f"rope_linear_factor={cfg.rope_linear_factor} with rope_scaling="
            f"{cfg.rope_scaling!r}: one RoPE scaling, not both"
        )
    ctx = cfg.rope_original_context
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx <= 0:
        raise KvjaxError(
            f"rope_original_context={ctx!r} must be a positive integer with rope_scaling="
            f"{cfg.rope_scaling!r} (original_max_position_embeddings)"
        )
    numbers = ["rope_factor", "rope_attention_factor"] + (
        ["rope_low_freq_factor", "rope_high_freq_factor"]
        if cfg.rope_scaling == "llama3"
        else ["rope_beta_fast", "rope_beta_slow"]
    )
    for field in numbers:
        value = getattr(cfg, field)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise KvjaxError(f"{field}={value!r} must be a positive number")
        if value == float("inf"):
            raise KvjaxError(f"{field}={value!r} must be finite")
    if cfg.rope_scaling == "llama3" and not cfg.rope_low_freq_factor < cfg.rope_high_freq_factor:
        raise KvjaxError(
            f"rope_low_freq_factor={cfg.rope_low_freq_factor} must be below "
            f"rope_high_freq_factor={cfg.rope_high_freq_factor}"
        )


def check_window(cfg: Fields) -> None:
    w, pattern = cfg.sliding_window, cfg.layer_pattern
    if isinstance(w, bool) or not isinstance(w, int) or w < 0:
        raise KvjaxError(f"sliding_window={w!r} must be a non-negative integer (0: none)")
    if not isinstance(pattern, str) or not pattern or set(pattern) - {"G", "L"}:
        raise KvjaxError(
            f"layer_pattern={pattern!r} must be a string of G (global, full attention) and L "
            f"(local, sliding window) tiled over the layers, e.g. 'L' (Mistral), 'LG' (Gemma 2)"
            f", 'LLLLLG' (Gemma 3)"
        )
    if "L" in pattern and w == 0:
        raise KvjaxError(
            f"layer_pattern={pattern!r} has sliding (L) layers but sliding_window=0; set the "
            f"window (e.g. sliding_window=4096)"
        )
    if w and "L" not in pattern:
        raise KvjaxError(
            f"sliding_window={w} but layer_pattern={pattern!r} has no sliding (L) layer; set "
            f"layer_pattern='L' (every layer sliding) or sliding_window=0"
        )
    if w and cfg.is_mla:
        raise KvjaxError("sliding_window with MLA (kv_lora_rank > 0) is not supported")
    if cfg.qk_norm_full and not cfg.qk_norm:
        raise KvjaxError("qk_norm_full=True needs qk_norm=True (it says how wide the norms are)")
    if not cfg.pre_norms and not cfg.sandwich_norms:
        raise KvjaxError("pre_norms=False needs sandwich_norms=True (a block with no norm at all)")
    if cfg.parallel_block and (cfg.sandwich_norms or not cfg.pre_norms):
        raise KvjaxError(
            "parallel_block=True has one norm before attention and MLP: it takes "
            "neither sandwich_norms nor pre_norms=False"
        )
    if cfg.norm_kind not in ("rms", "layer"):
        raise KvjaxError(f"norm_kind={cfg.norm_kind!r} is not supported; allowed: rms, layer")
    if cfg.norm_bias and cfg.norm_kind != "layer":
        raise KvjaxError("norm_bias=True needs norm_kind='layer' (RMSNorm has no bias)")
    if cfg.norm_kind == "layer" and (cfg.norm_plus_one or cfg.is_mla):
        raise KvjaxError("norm_kind='layer' is not supported with norm_plus_one or MLA")
    rope = cfg.rope_pattern
    if not isinstance(rope, str) or not rope or set(rope) - {"R", "N"}:
        raise KvjaxError(
            f"rope_pattern={rope!r} must be a string of R (RoPE) and N (NoPE: no position "
            "encoding) tiled over the layers, e.g. 'RRRN' (SmolLM3)"
        )
    R = cfg.rotary_dim
    if isinstance(R, bool) or not isinstance(R, int) or R < 0 or R % 2 or R > cfg.head_dim:
        raise KvjaxError(
            f"rotary_dim={R!r} must be an even integer in 2 .. head_dim={cfg.head_dim} (0: all "
            "of head_dim)"
        )
    if R and cfg.is_mla:
        raise KvjaxError(f"rotary_dim={R} is not supported with MLA (its RoPE key is its own)")
    if "N" in rope and cfg.is_mla:
        raise KvjaxError(f"rope_pattern={rope!r} (NoPE layers) is not supported with MLA")
    if cfg.chunked_attention and "L" not in pattern:
        raise KvjaxError(
            f"chunked_attention=True makes the L layers attend chunks of sliding_window, but "
            f"layer_pattern={pattern!r} has none; set layer_pattern (e.g. 'LLLG') and "
            "sliding_window (the chunk size)"
        )
    if cfg.chunked_attention and cfg.sink_tokens:
        raise KvjaxError(
            f"chunked_attention=True takes sink_tokens=0 (sinks keep tokens beside a sliding "
            f"window); got sink_tokens={cfg.sink_tokens}"
        )
    if cfg.qk_l2_norm and cfg.qk_norm:
        raise KvjaxError("qk_l2_norm=True (Llama 4's unscaled norm) and qk_norm=True: one q/k norm")
    floor, scale = cfg.temperature_floor, cfg.temperature_scale
    if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
        raise KvjaxError(f"temperature_floor={floor!r} must be a non-negative integer (0: off)")
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale < 1e300:
        raise KvjaxError(f"temperature_scale={scale!r} must be a finite positive number")
    s = cfg.sink_tokens
    if isinstance(s, bool) or not isinstance(s, int) or s < 0:
        raise KvjaxError(f"sink_tokens={s!r} must be a non-negative integer (0: none)")
    if s and not w:
        raise KvjaxError(
            f"sink_tokens={s} keeps tokens beside a sliding window, but sliding_window=0; set "
            "sliding_window and layer_pattern='L' (or sink_tokens=0)"
        )


def check_scales(cfg: Fields) -> None:
    if cfg.kv_scales not in KV_SCALES:
        raise KvjaxError(
            f"kv_scales={cfg.kv_scales!r} is not supported; allowed: {', '.join(KV_SCALES)}"
        )
    kind, G = cfg.kv_scale_kind, cfg.kv_group_size
    if isinstance(G, bool) or not isinstance(G, int) or G <= 0:
        raise KvjaxError(f"kv_group_size={G!r} must be a positive integer")
    if cfg.kv_packed:
        if kind != "group":
            raise KvjaxError(
                f"kv_dtype={cfg.kv_dtype!r} needs grouped scales (kv_scales='group', the "
                f"default); kv_scales={cfg.kv_scales!r} is not modelled for a packed cache"
            )
        if cfg.head_dim % G:
            raise KvjaxError(
                f"kv_group_size={G} must divide head_dim={cfg.head_dim} (a value row is "
                f"quantized in groups of kv_group_size)"
            )
        if cfg.is_mla:
            raise KvjaxError(f"kv_dtype={cfg.kv_dtype!r} is not modelled for MLA's latent")
        return
    if kind == "group":
        raise KvjaxError(
            f"kv_scales='group' applies to a packed 4/2-bit cache (kv_dtype int4 or int2), "
            f"not kv_dtype={cfg.kv_dtype!r}"
        )
    if kind != "none" and cfg.kv_bytes_per_element != 1:
        raise KvjaxError(
            f"kv_scales={cfg.kv_scales!r} applies to a 1-byte cache (kv_dtype int8 or fp8); "
            f"kv_dtype={cfg.kv_dtype!r} is stored as it is (kv_scales='none')"
        )
    if cfg.kv_dtype == "int8" and kind != "token_head":
        raise KvjaxError(
            f"kv_dtype='int8' needs per-token scales (kv_scales='token_head', the default); "
            f"kv_scales={cfg.kv_scales!r} would need a calibrated scale kvjax does not model"
        )
    if cfg.is_mla and kind != "none":
        raise KvjaxError(
            f"kv_scales={cfg.kv_scales!r}: scales for MLA's latent cache are not implemented; "
            f"use kv_scales='none' (an fp8 latent cast as it is)"
        )


def check_extend(cfg: Fields, model: bool = False) -> None:
    """The closed form's extend step covers MHA/GQA/MQA and MLA global layers, any KV dtype, XLA's
    attention or the fused kernel; `model`: the Flax model's extend, which runs MHA/GQA/MQA over
    an unscaled cache with XLA's attention, and the hybrids' state layers from their cached
    states (the closed form does not count them yet). The rest is refused by name."""
    reasons = []
    if model and cfg.is_mla:
        reasons.append("MLA (kv_lora_rank > 0)")
    if cfg.num_sliding_layers:
        reasons.append(f"sliding-window layers ({cfg.num_sliding_layers})")
    if model and cfg.kv_scale_kind != "none":
        reasons.append(f"a scaled kv_dtype={cfg.kv_dtype!r}")
    if model and cfg.attention_kernel != "xla":
        reasons.append(f"attention_kernel={cfg.attention_kernel!r}")
    if cfg.attn_softcap:
        reasons.append(f"attn_softcap={cfg.attn_softcap:g}")
    if cfg.is_hybrid and not model:
        reasons.append(
            f"state layers (layer_kinds={cfg.layer_kinds!r}: the closed form of "
            "their extend step is not written; the model runs it)"
        )
    if reasons:
        runs = (
            "MHA/GQA/MQA global layers of an unscaled cache with attention_kernel='xla'"
            if model
            else "MHA/GQA/MQA and MLA global layers"
        )
        where = "the model's" if model else "the closed form's"
        raise KvjaxError(
            f"phase 'extend' (T new tokens on a cache): {where} runs {runs}; {cfg.name} has "
            + ", ".join(reasons)
        )
