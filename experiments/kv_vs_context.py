"""KV cache against context for each attention variant, beside the weights (the crossover)."""

from kvjax import analytic
from kvjax.analytic.variants import variant_kv_heads
from kvjax.runs import options as o
from kvjax.runs.config import resolve

OPTIONS = {"contexts": o.list_of(o.POSITIVE_INT)}


def run_point(point) -> list[dict]:
    cfg, wl, _ = resolve(point)
    contexts = point.options.get("contexts", [2**e for e in range(10, 21)])
    records = []
    for label, k in variant_kv_heads(cfg):
        variant = cfg.replace(num_kv_heads=k)
        weights = analytic.weight_bytes(variant)
        for s in contexts:
            records.append(
                {
                    "model": cfg.name,
                    "variant": label,
                    "num_kv_heads": k,
                    "batch": wl.batch,
                    "context": int(s),
                    "kv_cache_bytes": analytic.kv_cache_bytes(variant, int(s), wl.batch),
                    "weight_bytes": weights,
                    "kv_exceeds_weights_at_context": analytic.kv_exceeds_weights_at_context(
                        variant, wl.batch
                    ),
                    "source": "closed form",
                }
            )
    return records
