"""`kvjax plan --variants`, a search `kvjax.serving.plan_report` runs: the search for each
attention variant of the model (its MHA, GQA, MQA and MLA forms: `kvjax.analytic.variants`),
each option with the variant's committed quality cost (validation loss over MHA's, nats/byte,
with the cache's dtype: `kvjax.quality.costs`). With a budget (`--max-quality-cost`), a variant
and KV dtype whose cost is above it, or has no committed cost, is refused before anything is
simulated, and the best option is the best within it."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

from kvjax.cli.args import _MLA_FLAGS, _SIZE_FLAGS
from kvjax.model.config import ModelConfig
from kvjax.serving.plan import Planner

# the config fields a variant changes, each set by the model flag `add_model_args` gives it
VARIANT_FIELDS = ("num_kv_heads", "head_dim", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim")
VARIANT_FLAGS = {
    field: "--" + flag.replace("_", "-")
    for flag, field in {**_SIZE_FLAGS, **_MLA_FLAGS}.items()
    if field in VARIANT_FIELDS
}


def variant_flags(base: ModelConfig, variant: ModelConfig) -> str | None:
    """The flags that make `variant` of `base` (None where flags cannot say it)."""
    changed = {
        f.name: getattr(variant, f.name)
        for f in dataclasses.fields(variant)
        if getattr(variant, f.name) != getattr(base, f.name)
    }
    if set(changed) - set(VARIANT_FLAGS) or base.replace(**changed) != variant:
        return None
    return " ".join(f"{VARIANT_FLAGS[k]} {v}" for k, v in changed.items())


def _cost(cfg: ModelConfig, kv: str) -> dict[str, Any]:
    from kvjax.quality.costs import quality_cost

    c = quality_cost(cfg.replace(kv_dtype=kv))
    return {
        "quality_cost": c.delta,
        "quality_cost_lo": c.low,
        "quality_cost_hi": c.high,
        "quality_from": c.label,
    }


def plan_variants(planner: Planner, budget: float | None) -> list[dict[str, Any]]:
    """Every variant's options (labelled `VARIANT: option`), each with its quality cost; over
    the budget, refused by name."""
    from kvjax.analytic.variants import variant_configs

    rows: list[dict[str, Any]] = []
    for label, _, cfg, _ in variant_configs(planner.model):
        if cfg is None:
            continue
        costs = {kv: _cost(cfg, kv) for kv in planner.kv_dtypes}
        kept = tuple(kv for kv, c in costs.items() if budget is None or _within(c, budget))
        for kv in planner.kv_dtypes:
            if kv not in kept:
                rows.append(_refused(label, kv, costs[kv], budget))
        if not kept:
            continue
        sub = replace(planner, model=cfg, kv_dtypes=kept, _bounds={})
        for r in sub.search():
            r |= {"variant": label, "option": f"{label}: {r['option']}", **costs[r["kv_dtype"]]}
            r["model_flags"] = variant_flags(planner.model, cfg)
            rows.append(r)
    return rows


def _within(cost: dict[str, Any], budget: float) -> bool:
    return cost["quality_cost"] is not None and cost["quality_cost"] <= budget


def _refused(label: str, kv: str, cost: dict[str, Any], budget: float) -> dict[str, Any]:
    c = cost["quality_cost"]
    why = (
        f"quality cost {c:.4f} nats/byte is over the budget {budget:g}"
        if c is not None
        else f"no committed quality cost ({cost['quality_from']})"
    )
    return {
        "option": f"{label}: kv {kv}",
        "variant": label,
        "kv_dtype": kv,
        "status": "refused",
        "why": why,
        **cost,
    }
