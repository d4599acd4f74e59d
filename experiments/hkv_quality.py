"""Quality over num_kv_heads: the same model, data and token budget, trained for each h_kv (and
each seed: `options.seed` sets the init and the data order), then evaluated with its KV cache
as it is and as an int8, fp8, int4 or int2 cache would give it back (`options.eval_kv_dtypes`;
the packed caches group by `model.kv_group_size`, which must divide head_dim; a GQA cache only).
An MLA model (`model.kv_lora_rank` > 0) trains the same way: each record names its `variant`
(MHA, GQA-k, MQA, MLA-A) and its KV bytes per token, the axis MLA and GQA are compared on."""

from flax import nnx

from kvjax import analytic
from kvjax.nn import Transformer
from kvjax.nn.fake_quant import cache_view
from kvjax.quality.train import TrainConfig, evaluate, train
from kvjax.runs import options as o
from kvjax.runs.config import resolve

# The data and the training loop's settings (every TrainConfig field, typed from its default).
OPTIONS = {
    "task": o.one_of("stdlib", "recall"),
    "num_pairs": o.POSITIVE_INT,
    "num_queries": o.POSITIVE_INT,
    "max_bytes": o.POSITIVE_INT,
    "seq_len": o.POSITIVE_INT,
    "steps": o.POSITIVE_INT,
    "batch_size": o.POSITIVE_INT,
    "learning_rate": o.POSITIVE,
    "warmup_steps": o.NONNEGATIVE_INT,
    "weight_decay": o.NONNEGATIVE,
    "clip_norm": o.POSITIVE,
    "eval_every": o.POSITIVE_INT,
    "eval_batches": o.POSITIVE_INT,
    "checkpoint_every": o.NONNEGATIVE_INT,
    "seed": o.NONNEGATIVE_INT,
    "eval_kv_dtypes": o.list_of(o.dtype_of("int8", "fp8", "int4", "int2")),
}


# A recall run has learned the task when its final accuracy reaches this (MHA's runs end at
# 0.98-0.99, a run that has not formed the induction mechanism at chance-like 0.15-0.2).
LEARNED_ACCURACY = 0.9


def runs_together(point) -> bool:
    """Multi-process: every point trains data parallel over all processes (kvjax.quality.train)."""
    from kvjax.runs import distributed

    return distributed.is_multiprocess()


def make_task(name: str, cfg, options):
    from kvjax.quality.data import AssociativeRecall, StdlibBytes

    if name == "stdlib":
        max_bytes = int(options.get("max_bytes", 4 * 2**20))
        return StdlibBytes("train", max_bytes), StdlibBytes("val", max_bytes)
    if name == "recall":
        task = AssociativeRecall(
            int(options.get("num_pairs", 16)), int(options.get("num_queries", 8)), cfg.vocab_size
        )
        return task, task  # validation batches use other seeds
    raise ValueError(f"options.task={name!r}; allowed: stdlib, recall")


def train_config(options, seq_len: int) -> TrainConfig:
    fields = TrainConfig.__dataclass_fields__
    values = {k: options[k] for k in options if k in fields}
    return TrainConfig(**{**values, "seq_len": seq_len})


def setup(point):
    """(model config, task name, train data, validation data, TrainConfig) of a point."""
    cfg, _, _ = resolve(point)
    opts = point.options
    task = str(opts.get("task", "stdlib"))
    data, val = make_task(task, cfg, opts)
    seq_len = getattr(data, "seq_len", None) or int(opts.get("seq_len", 128))
    return cfg, task, data, val, train_config(opts, seq_len)


def variant_label(cfg) -> str:
    """MHA, GQA-k, MQA or MLA-A (A the latent width): the attention a quality record compares."""
    if cfg.is_mla:
        return f"MLA-{cfg.kv_lora_rank}"
    return {cfg.num_heads: "MHA", 1: "MQA"}.get(cfg.num_kv_heads, f"GQA-{cfg.num_kv_heads}")


def run_point(point) -> list[dict]:
    cfg, task, data, val, tc = setup(point)
    for kv in point.options.get("eval_kv_dtypes", []):  # refused before training, not after
        cache_view(kv, cfg)
    model = Transformer(cfg, rngs=nnx.Rngs(tc.seed))
    history = train(model, data, tc, val_data=val)
    last = history[-1]
    base = {
        "model": cfg.name,
        "task": task,
        "variant": variant_label(cfg),
        "num_kv_heads": cfg.num_kv_heads,
        "kv_lora_rank": cfg.kv_lora_rank,
        "num_heads": cfg.num_heads,
        "num_layers": cfg.num_layers,  # the figures' titles name the model's shape
        "d_model": cfg.d_model,
        "seed": tc.seed,
        "num_pairs": getattr(data, "num_pairs", None),
        "params": analytic.num_params(cfg),
        "steps": tc.steps,
        "tokens": tc.steps * tc.batch_size * tc.seq_len,
        # guessing among the values: 1/(vocab/2) for recall; 1/256 for bytes
        "chance_accuracy": 1 / (cfg.vocab_size // 2) if task == "recall" else 1 / 256,
    }
    if task == "recall":  # whether this run learned the task at all: the comparison's premise
        base["learned"] = bool(last["val_accuracy"] >= LEARNED_ACCURACY)
    records = [
        {**base, "eval_kv_dtype": cfg.kv_dtype,
         "kv_bytes_per_token": analytic.kv_bytes_per_token(cfg),
         "val_loss": last["val_loss"], "val_accuracy": last["val_accuracy"], "history": history}
    ]  # fmt: skip
    for kv in point.options.get("eval_kv_dtypes", []):  # the same model, a quantized cache
        quantized = cfg.replace(kv_dtype=kv, kv_scales="auto")  # kv by its canonical name
        q = evaluate(model, val, tc, kv_dtype=quantized.kv_dtype)
        records.append(
            {**base, "eval_kv_dtype": quantized.kv_dtype, "kv_scales": quantized.kv_scale_kind,
             "kv_bytes_per_token": analytic.kv_bytes_per_token(quantized), **q}
        )  # fmt: skip
    return records
