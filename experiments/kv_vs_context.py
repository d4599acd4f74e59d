"""KV cache against context for each attention variant (MHA, GQA, MQA and MLA, `kvjax calc
--variants`' rows), beside the weights (the crossover); and for the sliding-window presets
(`windowed`), their cache as published (local layers hold the window) against every layer global;
and for the hybrids (`hybrids`, issue 31), their whole cache (the attention layers' KV and the state
layers' flat states) against the same attention in every layer."""

from kvjax import analytic
from kvjax.analytic.variants import all_attention, variant_cache_bytes, variant_configs
from kvjax.model.config import PRESETS, get_model_config
from kvjax.runs import options as o
from kvjax.runs.config import resolve

OPTIONS = {
    "contexts": o.list_of(o.POSITIVE_INT),
    "windowed": o.list_of(o.one_of(*PRESETS)),
    "hybrids": o.list_of(o.one_of(*PRESETS)),
}
WINDOWS, ALL_GLOBAL = "as published (windows)", "every layer global"
STATES, ALL_ATTENTION = "as published (KV + states)", "attention in every layer"


def run_point(point) -> list[dict]:
    cfg, wl, _ = resolve(point)
    contexts = point.options.get("contexts", [2**e for e in range(10, 21)])
    records = []
    for label, k, variant, per_token in variant_configs(cfg):
        # an MLA model's MHA/GQA/MQA rows have no weights of their own: its own stand in
        weights = analytic.weight_bytes(variant or cfg)
        exceeds = (
            analytic.kv_exceeds_weights_at_context(variant, wl.batch)
            if variant is not None
            else weights // (per_token * wl.batch) + 1
        )
        for s in contexts:
            records.append(
                {
                    "model": cfg.name,
                    "variant": label,
                    "num_kv_heads": k,
                    "batch": wl.batch,
                    "context": int(s),
                    "kv_cache_bytes": variant_cache_bytes(variant, per_token, int(s), wl.batch),
                    "weight_bytes": weights,
                    "kv_exceeds_weights_at_context": exceeds,
                    "source": "closed form",
                }
            )
    for name in point.options.get("windowed", []):
        windowed = get_model_config(name)
        full = windowed.replace(sliding_window=0, layer_pattern="G")
        for label, c in ((WINDOWS, windowed), (ALL_GLOBAL, full)):
            for s in contexts:
                records.append({
                    "model": name, "variant": label, "num_kv_heads": c.num_kv_heads,
                    "batch": wl.batch, "context": int(s),
                    "kv_cache_bytes": analytic.kv_cache_bytes(c, int(s), wl.batch),
                    "weight_bytes": analytic.weight_bytes(c), "window": c.sliding_window,
                    "layer_pattern": c.layer_pattern, "source": "closed form",
                })  # fmt: skip
    for name in point.options.get("hybrids", []):
        hybrid = get_model_config(name)
        for label, c in ((STATES, hybrid), (ALL_ATTENTION, all_attention(hybrid))):
            for s in contexts:
                records.append({
                    "model": name, "variant": label, "num_kv_heads": c.num_kv_heads,
                    "batch": wl.batch, "context": int(s),
                    "kv_cache_bytes": analytic.cache_bytes(c, int(s), wl.batch),
                    "state_bytes": analytic.state_bytes(c, wl.batch),
                    "weight_bytes": analytic.weight_bytes(c), "layer_kinds": c.layer_kinds,
                    "source": "closed form",
                })  # fmt: skip
    return records
