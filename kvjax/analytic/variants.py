"""The seed's MHA/GQA/MQA table for any model, with an MLA row (a hybrid: its attention in every
layer instead): KV cache per variant (and a hybrid's flat states), weights and the B=1 floor, on
one axis (cache bytes per token)."""

from __future__ import annotations

from typing import Any

from kvjax import analytic
from kvjax.analytic import roofline
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig

# The seed's table: per token, 8k context x 1 sequence, 128k context x 32 sequences.
SEED_TABLE_POINTS = ((8192, 1), (131072, 32))


def variant_kv_heads(cfg: ModelConfig) -> list[tuple[str, int]]:
    """The seed's three rows for this model: MHA (K=N), a GQA K, MQA (K=1)."""
    choices = [k for k in range(1, cfg.num_heads + 1) if cfg.num_heads % k == 0]
    if 1 < cfg.num_kv_heads < cfg.num_heads and not cfg.is_mla:
        gqa = cfg.num_kv_heads
    else:
        middle = [k for k in choices if 1 < k < cfg.num_heads]
        gqa = 8 if 8 in middle else (max((k for k in middle if k <= 8), default=None))
    rows = [("MHA", cfg.num_heads)]
    if gqa is not None:
        rows.append(("GQA", gqa))
    if cfg.num_heads > 1:
        rows.append(("MQA", 1))
    return rows


def mla_variant(cfg: ModelConfig) -> ModelConfig:
    """The model with MLA attention: itself if it is MLA, else DeepSeek-V2's recipe for its head
    width H (latent A = 4H, RoPE P = H/2 added to the H-wide keys, values H wide; DeepSeek-V2
    paper, sec. 2.1: d_c = 4 d_h, d_h^R = d_h / 2), absorbed decode, no query low rank, every
    layer global (kvjax has no MLA with sliding windows), and DeepSeek's attention details in
    place of Gemma's / Qwen3's (no q/k norms, soft-capping, scalar, local RoPE base or scaling;
    Llama-style norms)."""
    if cfg.is_mla:
        return cfg
    H = cfg.head_dim
    rope = max(2, H // 4 * 2)  # H/2, kept even for RoPE's pairs
    return cfg.replace(
        num_kv_heads=cfg.num_heads,
        head_dim=H + rope,
        kv_lora_rank=4 * H,
        qk_rope_head_dim=rope,
        v_head_dim=H,
        q_lora_rank=0,
        qkv_bias=False,
        o_bias=False,
        rotary_dim=0,
        mla_decode="absorbed",
        sliding_window=0,
        sink_tokens=0,
        sink_logits=False,
        layer_pattern="G",
        rope_pattern="R",
        qk_norm=False,
        qk_norm_full=False,
        chunked_attention=False,
        qk_l2_norm=False,
        temperature_floor=0,
        attn_softcap=0.0,
        query_pre_attn_scalar=0.0,
        rope_local_theta=0.0,
        rope_linear_factor=1.0,
        norm_plus_one=False,
        norm_kind="rms",
        norm_bias=False,
    )


def variant_configs(cfg: ModelConfig) -> list[tuple[str, int, ModelConfig | None, int]]:
    """(label, num_kv_heads, the variant's config, its cache bytes per token) for the seed's
    MHA/GQA/MQA rows and the MLA row. For an MLA model the MHA/GQA/MQA rows are its attention with
    K heads of keys (H) and values (W) cached, L*K*(H + W) elements a token (DeepSeek-V3 as MHA:
    4.997 MB), with no config (kvjax has no model whose values are narrower than its keys)."""
    out: list[tuple[str, int, ModelConfig | None, int]] = []
    for label, k in variant_kv_heads(cfg):
        if cfg.is_mla:
            elements = cfg.num_layers * k * (cfg.head_dim + cfg.v_head_dim)
            out.append((label, k, None, elements * cfg.kv_bytes_per_element))
        else:
            variant = cfg.replace(num_kv_heads=k)
            out.append((label, k, variant, analytic.kv_bytes_per_token(variant)))
    if cfg.is_hybrid:  # no MLA beside state layers; instead the model with attention everywhere
        dense = all_attention(cfg)
        label = f"{cfg.attention_variant} every layer"
        out.append((label, cfg.num_kv_heads, dense, analytic.kv_bytes_per_token(dense)))
        return out
    mla = mla_variant(cfg)
    label = f"MLA A={mla.kv_lora_rank} P={mla.qk_rope_head_dim}"
    out.append((label, mla.num_kv_heads, mla, analytic.kv_bytes_per_token(mla)))
    return out


def all_attention(cfg: ModelConfig) -> ModelConfig:
    """A hybrid with its attention in every layer instead of its state layers (the GQA model "of
    the same attention"): the transformer its states replace."""
    state = ("state_heads", "state_groups", "state_key_dim", "state_value_dim", "conv_kernel")
    return cfg.replace(
        layer_kinds="A", conv_bias=False, state_norm=False, **dict.fromkeys(state, 0)
    )


def variant_cache_bytes(
    variant: ModelConfig | None, per_token: int, context: int, batch: int
) -> int:
    """A row's cache at (S, B): its config's (sliding windows and a hybrid's states included),
    else per token x S x B."""
    if variant is None:
        return per_token * context * batch
    return analytic.cache_bytes(variant, context, batch)


def variant_rows(
    cfg: ModelConfig, points: tuple[tuple[int, int], ...] = SEED_TABLE_POINTS
) -> list[dict[str, Any]]:
    """The seed's MHA/GQA/MQA rows for any model and an MLA row (`variant_configs`): cache per
    token and at `points` (context, batch), parameters, weights, decode attention intensity."""
    rows = []
    for label, k, variant, per_token in variant_configs(cfg):
        if variant is None:  # an MLA model's attention as MHA/GQA/MQA
            intensity = 2 * cfg.num_heads / (k * cfg.kv_bytes_per_element)
        else:
            intensity = analytic.attention_intensity(variant)
        rows.append(
            {
                "variant": label,
                "num_kv_heads": k,
                "kv_bytes_per_token": per_token,
                "cache": [
                    {
                        "context": s,
                        "batch": b,
                        "kv_cache_bytes": variant_cache_bytes(variant, per_token, s, b),
                    }
                    for s, b in points
                ],
                "params": None if variant is None else analytic.num_params(variant),
                "weight_bytes": None if variant is None else analytic.weight_bytes(variant),
                "attention_intensity": intensity,
            }
        )
    mha = rows[0]["kv_bytes_per_token"]
    for row in rows:
        row["cache_reduction_vs_mha"] = mha / row["kv_bytes_per_token"]
    return rows


def variants_table(
    cfg: ModelConfig, chip: ChipSpec, points: tuple[tuple[int, int], ...] = SEED_TABLE_POINTS
) -> list[dict[str, Any]]:
    """`variant_rows` with each variant's B=1 floor (its weights read once) on `chip`."""
    rows = variant_rows(cfg, points)
    for row in rows:
        w = row["weight_bytes"]
        row["weight_floor_s_per_token"] = (
            None if w is None else roofline.memory_floor_s(w, chip.bandwidth_bytes_per_s)
        )
    return rows
