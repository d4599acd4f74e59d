"""KV cache against context for each attention variant (MHA, GQA, MQA and MLA, `kvjax calc
--variants`' rows), beside the weights (the crossover)."""

from kvjax import analytic
from kvjax.analytic.variants import variant_rows
from kvjax.runs import options as o
from kvjax.runs.config import resolve

OPTIONS = {"contexts": o.list_of(o.POSITIVE_INT)}


def run_point(point) -> list[dict]:
    cfg, wl, _ = resolve(point)
    contexts = point.options.get("contexts", [2**e for e in range(10, 21)])
    records = []
    for row in variant_rows(cfg, points=()):
        per_token = row["kv_bytes_per_token"] * wl.batch
        # an MLA model's MHA/GQA/MQA rows have no weights of their own: its own stand in
        weights = row["weight_bytes"] or analytic.weight_bytes(cfg)
        for s in contexts:
            records.append(
                {
                    "model": cfg.name,
                    "variant": row["variant"],
                    "num_kv_heads": row["num_kv_heads"],
                    "batch": wl.batch,
                    "context": int(s),
                    "kv_cache_bytes": per_token * int(s),
                    "weight_bytes": weights,
                    "kv_exceeds_weights_at_context": weights // per_token + 1,
                    "source": "closed form",
                }
            )
    return records
