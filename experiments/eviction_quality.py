"""Quality of eviction to a budget (StreamingLLM, Xiao et al. 2023): the quality model trained
as `hkv_quality` trains it (the same options, seeds and data), then evaluated with every
layer's cache evicted to N positions (`options.budgets`: [N, s] pairs): s sink tokens + a window
of N - s, and a plain window of N, beside the full cache: the same weights and validation
bytes, so each comparison pairs by seed."""

from flax import nnx

from experiments.hkv_quality import OPTIONS as TRAINING
from experiments.hkv_quality import setup
from kvjax import analytic
from kvjax.nn import Transformer
from kvjax.quality.train import evaluate, train
from kvjax.runs import options as o

OPTIONS = {**TRAINING, "budgets": o.PAIRS}
OPTIONS.pop("eval_kv_dtypes")


def evicted_model(model, budget: int, sinks: int):
    """The trained model attending as a cache evicted to `budget` positions a layer would give
    it: `sinks` first tokens and a window of the rest, every layer (`ModelConfig.sink_tokens`;
    its forward equals decoding from such a cache: tests/test_nn_hf.py)."""
    cfg = model.cfg.replace(sliding_window=budget - sinks, layer_pattern="L", sink_tokens=sinks)
    evicted = Transformer(cfg, rngs=nnx.Rngs(0))
    nnx.update(evicted, nnx.state(model, nnx.Param))
    return evicted


def run_point(point) -> list[dict]:
    cfg, task, data, val, tc = setup(point)
    model = Transformer(cfg, rngs=nnx.Rngs(tc.seed))
    history = train(model, data, tc, val_data=val)
    base = {
        "model": cfg.name, "task": task, "num_kv_heads": cfg.num_kv_heads,
        "num_heads": cfg.num_heads, "seed": tc.seed, "steps": tc.steps, "seq_len": tc.seq_len,
        "kv_bytes_per_token": analytic.kv_bytes_per_token(cfg),
    }  # fmt: skip
    last = history[-1]
    records = [{**base, "eviction": "full", "kv_budget": tc.seq_len, "sink_tokens": 0,
                "val_loss": last["val_loss"], "val_accuracy": last["val_accuracy"]}]  # fmt: skip
    for budget, sinks in point.options.get("budgets", []):
        for s in (int(sinks), 0):
            evicted = evicted_model(model, budget=int(budget), sinks=s)
            records.append({**base, "eviction": "sinks + window" if s else "window",
                            "kv_budget": int(budget), "sink_tokens": s,
                            **evaluate(evicted, val, tc)})  # fmt: skip
    return records
