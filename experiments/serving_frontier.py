"""The serving frontier in closed form (`kvjax.analytic.serving`): for each attention variant of
the model (MHA, GQA, MQA, MLA) at the point's KV dtype, chip and context, tokens/s per chip
against ms/token per sequence, B from 1 to the largest batch whose weights + paged KV cache +
activations fit (each curve ends where memory ends), and the time to first token of a
context-long prompt. With workload.tp > 1 each curve is one chip's share of a tensor-parallel
group (its memory, its step plus the collectives over the link; tokens/s per chip); with
workload.dp_attention and workload.ep, a DeepSeek-style placement (data-parallel attention,
experts spread with all-to-alls; `kvjax.analytic.parallel.Placement`)."""

from kvjax.analytic import parallel, serving
from kvjax.analytic.variants import variant_configs
from kvjax.errors import KvjaxError
from kvjax.runs import options as o
from kvjax.runs.config import resolve

OPTIONS = {"page_size": o.NONNEGATIVE_INT, "variants": o.BOOLEAN}
TENSOR_PARALLEL = True  # workload.tp: one chip's share of a tensor-parallel group
PLACEMENTS = True  # workload.dp_attention and workload.ep: DeepSeek-style placements


def run_point(point) -> list[dict]:
    cfg, wl, chip = resolve(point)
    tp = int(point.workload.tp)
    ep, dp = int(point.workload.ep), int(point.workload.dp_attention)
    opts = point.options
    page = int(opts.get("page_size", 0))
    if opts.get("variants", True):
        curves = [(label, v) for label, _, v, _ in variant_configs(cfg) if v is not None]
    else:
        curves = [(cfg.attention_variant, cfg)]
    records = []
    for label, variant in curves:
        # every record of every curve carries the same keys (no NaN-widened columns)
        common = {
            "model": cfg.name, "variant": label, "num_kv_heads": variant.num_kv_heads,
            "kv_dtype": variant.kv_dtype, "attention_kernel": variant.attention_kernel,
            "chip": chip.name, "context": wl.context, "page_size": page, "tp": tp,
            "ep": ep, "dp_attention": dp, "devices": tp * dp,
            "max_batch": 0, "weights_floor_ms_per_token": None, "time_to_first_token_s": None,
            "note": None, "source": "closed form",
        }  # fmt: skip
        empty = {"batch": 0, "step_s": None, "tokens_per_s": None, "ms_per_token": None,
                 "memory_bytes": None}  # fmt: skip
        try:
            curve = serving.frontier(variant, chip, wl.context, page, label, tp, ep, dp)
        except KvjaxError as exc:  # a placement kvjax does not model (MLA on tp > 1): said
            records.append({**common, **empty, "note": str(exc)})
            continue
        common["max_batch"] = curve["max_batch"]
        common["weights_floor_ms_per_token"] = curve["weights_floor_ms_per_token"]
        if curve["max_batch"] and dp == 1:  # one chip's share of a tp group (collectives aside)
            share = variant if tp == 1 else parallel.device_config(variant, tp)
            common["time_to_first_token_s"] = serving.time_to_first_token_s(share, chip, wl.context)
        elif not curve["max_batch"]:  # the weights and one sequence do not fit: a record says so
            records.append({**common, **empty, "note": "does not fit"})
        for p in curve["points"]:
            records.append({**common, **{k: v for k, v in p.items() if k != "variant"}})
    return records
