"""Benchmark: one decode step of a >1 GB f32 model on the machine at hand, as bytes moved per
second against the measured read bandwidth (a large `jnp.sum`).

    python3 -m experiments.benchmarks.decode_step_bandwidth [--context 4096] [--out FILE]

f32 on CPU (DESIGN.md: bf16 matrix-vector products are 10x slower there; bf16 belongs to a GPU).
Bytes moved are the closed form's decode-step bytes (weights read once, KV cache read whole).
"""

from __future__ import annotations

import argparse
import datetime
import platform
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from kvjax import analytic
from kvjax.analytic import Workload
from kvjax.config import ModelConfig
from kvjax.measured.ceilings import measure_read_bandwidth
from kvjax.measured.timing import device_name, time_loop
from kvjax.nn import CompiledSteps, Transformer
from kvjax.runs.records import write_json_atomic

# About 0.49e9 parameters: 1.97 GB of f32 weights, plus 0.13 GB of KV cache at S=4096.
BENCH_CFG = ModelConfig(
    name="bench-0.5b-f32",
    num_layers=8,
    d_model=2048,
    num_heads=16,
    num_kv_heads=4,
    head_dim=128,
    d_ff=5632,
    vocab_size=32000,
    weight_dtype="f32",
    kv_dtype="f32",
)


def random_cache(model: Transformer, batch: int, max_len: int, fill: int, seed: int = 0):
    cache = model.init_cache(batch, max_len)
    keys = jax.random.split(jax.random.key(seed), 2 * cache.num_layers)
    k = tuple(jax.random.normal(keys[i], x.shape, x.dtype) for i, x in enumerate(cache.k))
    v = tuple(jax.random.normal(keys[-1 - i], x.shape, x.dtype) for i, x in enumerate(cache.v))
    return type(cache)(k=k, v=v, pos=jnp.full((batch,), fill, jnp.int32))


def run(cfg: ModelConfig = BENCH_CFG, batch: int = 1, context: int = 4096, budget_s: float = 5.0):
    wl = Workload("decode", batch, context)
    step_bytes = analytic.step_cost(cfg, wl).bytes
    resident = analytic.weight_bytes(cfg) + analytic.kv_cache_bytes(cfg, context, batch)

    # The read ceiling is measured before and after the decode timing (shared machines drift);
    # the fraction is taken against the higher of the two.
    bw_before, bw_stats = measure_read_bandwidth(budget_s=budget_s)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    steps = CompiledSteps(model)
    cache = random_cache(model, batch, context, fill=context // 2)
    tokens_B = jax.random.randint(jax.random.key(1), (batch,), 0, cfg.vocab_size, jnp.int32)

    def decode(cache):
        _, new_k, new_v = steps.attend(steps.state, tokens_B, cache)
        return steps.append(cache, new_k, new_v)

    max_runs = max(1, context // 2 - 4)  # stay inside the cache
    stats, _ = time_loop(decode, cache, budget_s=budget_s, max_runs=max_runs)
    del cache
    bw_after, bw_stats_after = measure_read_bandwidth(budget_s=budget_s)
    bandwidth = max(bw_before, bw_after)
    achieved = step_bytes / stats.median_s
    return {
        "benchmark": "decode_step_bandwidth",
        "date": datetime.date.today().isoformat(),
        "device": device_name(),
        "host": platform.node(),
        "jax": jax.__version__,
        "model": cfg.to_dict(),
        "workload": {"phase": "decode", "batch": batch, "context": context},
        "resident_bytes": resident,
        "closed_form_step_bytes": step_bytes,
        "read_bandwidth_bytes_per_s": bandwidth,
        "read_bandwidth_before_bytes_per_s": bw_before,
        "read_bandwidth_after_bytes_per_s": bw_after,
        "read_bandwidth_timing": [bw_stats.to_dict(), bw_stats_after.to_dict()],
        "decode_step_timing": stats.to_dict(),
        "achieved_bytes_per_s": achieved,
        "fraction_of_read_bandwidth": achieved / bandwidth,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--budget-s", type=float, default=5.0)
    parser.add_argument(
        "--out", type=Path, default=Path("experiments/results/decode_step_bandwidth.json")
    )
    args = parser.parse_args(argv)
    result = run(batch=args.batch, context=args.context, budget_s=args.budget_s)
    write_json_atomic(args.out, result)
    print(
        f"{result['device']}: decode step of {result['model']['name']} at B={args.batch}, "
        f"S={args.context}: {result['resident_bytes'] / 1e9:.2f} GB resident, "
        f"{result['closed_form_step_bytes'] / 1e9:.3f} GB moved in "
        f"{result['decode_step_timing']['median_s'] * 1e3:.1f} ms (median of "
        f"{result['decode_step_timing']['runs']}) = "
        f"{result['achieved_bytes_per_s'] / 1e9:.2f} GB/s; "
        f"read bandwidth (jnp.sum, best of before/after: "
        f"{result['read_bandwidth_before_bytes_per_s'] / 1e9:.2f}, "
        f"{result['read_bandwidth_after_bytes_per_s'] / 1e9:.2f}) "
        f"{result['read_bandwidth_bytes_per_s'] / 1e9:.2f} GB/s: "
        f"{100 * result['fraction_of_read_bandwidth']:.0f}%"
    )


if __name__ == "__main__":
    main()
