"""The seed's MHA/GQA/MQA table for any model: KV cache per variant, weights and B=1 floor."""

from __future__ import annotations

from typing import Any

from kvjax import analytic
from kvjax.analytic import roofline
from kvjax.config import ModelConfig
from kvjax.hardware import ChipSpec

# The seed's table: per token, 8k context x 1 sequence, 128k context x 32 sequences.
SEED_TABLE_POINTS = ((8192, 1), (131072, 32))


def variant_kv_heads(cfg: ModelConfig) -> list[tuple[str, int]]:
    """The seed's three rows for this model: MHA (K=N), a GQA K, MQA (K=1)."""
    choices = cfg.kv_head_choices()
    if 1 < cfg.num_kv_heads < cfg.num_heads:
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


def variants_table(
    cfg: ModelConfig, chip: ChipSpec, points: tuple[tuple[int, int], ...] = SEED_TABLE_POINTS
) -> list[dict[str, Any]]:
    """The seed's MHA/GQA/MQA table for any model, plus each variant's weights and B=1 floor."""
    bw = chip.bandwidth_bytes_per_s
    rows = []
    mha_per_token = analytic.kv_bytes_per_token(cfg.replace(num_kv_heads=cfg.num_heads))
    for label, k in variant_kv_heads(cfg):
        variant = cfg.replace(num_kv_heads=k)
        per_token = analytic.kv_bytes_per_token(variant)
        rows.append(
            {
                "variant": label,
                "num_kv_heads": k,
                "kv_bytes_per_token": per_token,
                "cache": [
                    {
                        "context": s,
                        "batch": b,
                        "kv_cache_bytes": analytic.kv_cache_bytes(variant, s, b),
                    }
                    for s, b in points
                ],
                "cache_reduction_vs_mha": mha_per_token / per_token,
                "params": analytic.num_params(variant),
                "weight_bytes": analytic.weight_bytes(variant),
                "weight_floor_s_per_token": roofline.memory_floor_s(
                    analytic.weight_bytes(variant), bw
                ),
                "attention_intensity": analytic.attention_intensity(variant),
            }
        )
    return rows
