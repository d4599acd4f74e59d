"""The seed's MHA/GQA/MQA KV-cache table for any model (closed form)."""

from kvjax.analytic.variants import variants_table
from kvjax.runs import options as o
from kvjax.runs.config import resolve

OPTIONS = {"points": o.PAIRS}


def run_point(point) -> list[dict]:
    cfg, _, chip = resolve(point)
    contexts = point.options.get("points", [[8192, 1], [131072, 32]])
    rows = variants_table(cfg, chip, tuple(tuple(p) for p in contexts))
    records = []
    for row in rows:
        for c in row["cache"]:
            records.append(
                {
                    "model": cfg.name,
                    "variant": row["variant"],
                    "num_kv_heads": row["num_kv_heads"],
                    "kv_bytes_per_token": row["kv_bytes_per_token"],
                    "context": c["context"],
                    "batch": c["batch"],
                    "kv_cache_bytes": c["kv_cache_bytes"],
                    "params": row["params"],
                    "weight_floor_s_per_token": row["weight_floor_s_per_token"],
                    "source": "closed form",
                }
            )
    return records
