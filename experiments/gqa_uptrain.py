"""Uptraining (Ainslie et al., 2023): train MHA, convert to each num_kv_heads by mean-pooling,
keeping the first head, or random init of the K/V heads, fine-tune for a fraction of the
original steps (the paper's 5%, or more), and evaluate before and after; beside them
(`options.scratch`) the same GQA/MQA model trained from scratch for the same total tokens (the
MHA pre-training plus the fine-tune). `options.seed` sets every init and the data order.

`options.mla_ranks` adds MHA -> MLA conversions (MHA2MLA, Ji et al. 2025:
`kvjax.quality.convert_mla`) at those latent widths with RoPE kept on `options.mla_rope_dim` dims
of each head, fine-tuned with the same budget: method "mha2mla", variant MLA-A, compared with the
mean-pooled GQA of the same KV bytes per token."""

import dataclasses

from flax import nnx

from experiments.hkv_quality import OPTIONS as QUALITY_OPTIONS
from experiments.hkv_quality import setup
from kvjax import analytic
from kvjax.nn import Transformer
from kvjax.quality.convert import METHODS, convert_kv_heads
from kvjax.quality.convert_mla import check_conversion, convert_to_mla
from kvjax.quality.train import evaluate, train
from kvjax.runs import options as o

OPTIONS = {
    **QUALITY_OPTIONS,
    "uptrain_fraction": o.FRACTION,
    "kv_heads": o.list_of(o.POSITIVE_INT),
    "methods": o.list_of(o.one_of(*METHODS)),
    "scratch": o.BOOLEAN,
    "mla_ranks": o.list_of(o.POSITIVE_INT),
    "mla_rope_dim": o.POSITIVE_INT,
}


def run_point(point) -> list[dict]:
    cfg, task, data, val, tc = setup(point)
    opts = point.options
    mha_cfg = cfg.replace(num_kv_heads=cfg.num_heads)
    rope_dim = int(opts.get("mla_rope_dim", 4))
    for a in opts.get("mla_ranks", []):  # refused before the pre-training, not after
        check_conversion(mha_cfg, int(a), rope_dim)
    mha = Transformer(mha_cfg, rngs=nnx.Rngs(tc.seed))
    mha_history = train(mha, data, tc, val_data=val)
    fraction = float(opts.get("uptrain_fraction", 0.05))
    up_tc = dataclasses.replace(
        tc, steps=max(1, int(fraction * tc.steps)), warmup_steps=0,
        eval_every=max(1, int(fraction * tc.steps) // 4), seed=tc.seed + 1,
    )  # fmt: skip
    # the model and its shape (the figures' titles name it)
    shape = {"model": cfg.name, "num_layers": cfg.num_layers, "d_model": cfg.d_model}
    records = [
        {**shape, "task": task, "num_kv_heads": mha_cfg.num_kv_heads, "method": "mha",
         "seed": tc.seed, "steps": tc.steps,
         "kv_bytes_per_token": analytic.kv_bytes_per_token(mha_cfg),
         "val_loss_before": mha_history[-1]["val_loss"], "val_loss": mha_history[-1]["val_loss"],
         "val_accuracy": mha_history[-1]["val_accuracy"], "history": mha_history}
    ]  # fmt: skip

    def uptrained(model, method: str, **extra) -> dict:
        before = evaluate(model, val, tc)
        history = [{"step": 0, **before}] + train(model, data, up_tc, val_data=val)
        return {**shape, "task": task, "num_kv_heads": model.cfg.num_kv_heads, "method": method,
                **extra, "seed": tc.seed, "steps": tc.steps + up_tc.steps,
                "kv_bytes_per_token": analytic.kv_bytes_per_token(model.cfg),
                "uptrain_steps": up_tc.steps, "val_loss_before": before["val_loss"],
                "val_loss": history[-1]["val_loss"], "val_accuracy": history[-1]["val_accuracy"],
                "history": history}  # fmt: skip

    for a in opts.get("mla_ranks", []):
        model = convert_to_mla(mha, int(a), rope_dim, seed=tc.seed)
        records.append(
            uptrained(
                model, "mha2mla", variant=f"MLA-{a}", kv_lora_rank=int(a), qk_rope_head_dim=rope_dim
            )
        )
    for k in opts.get("kv_heads", [4, 2, 1]):
        for method in opts.get("methods", list(METHODS)):
            records.append(uptrained(convert_kv_heads(mha, int(k), method, seed=tc.seed), method))
        if opts.get("scratch", False):  # the same tokens from scratch: pre-training + fine-tune
            k_cfg = cfg.replace(num_kv_heads=int(k))
            scratch_tc = dataclasses.replace(tc, steps=tc.steps + up_tc.steps)
            scratch = Transformer(k_cfg, rngs=nnx.Rngs(tc.seed))
            history = train(scratch, data, scratch_tc, val_data=val)
            records.append(
                {**shape, "task": task, "num_kv_heads": int(k), "method": "scratch",
                 "seed": tc.seed, "steps": scratch_tc.steps,
                 "kv_bytes_per_token": analytic.kv_bytes_per_token(k_cfg),
                 "val_loss": history[-1]["val_loss"],
                 "val_accuracy": history[-1]["val_accuracy"], "history": history}
            )  # fmt: skip
    return records
