"""Benchmark: the served decode step of an f32 model on the machine at hand over the batch, each
time against its roofline bound under the read ceiling measured in the same run.

    python3 -m experiments.benchmarks.decode_step_bandwidth [--model small|bench] [--context S]
        [--batches 1,2,4,8,16] [--out FILE]

The batches are timed interleaved (`kvjax.measured.interleave`: every model built first, timed in
turns over rounds, the read ceiling, the best of a `jnp.sum` and the model's own matrix-vector
product, measured before each round). Each round's time is set against that round's ceiling (this
machine reads memory in two modes that switch between rounds) and the median over rounds kept;
the time against the best round's ceiling is kept too. Bytes moved are the closed form's
decode-step bytes (weights read once, KV cache read whole). f32 on CPU (DESIGN.md: bf16
matrix-vector products are converted on every call there). The targets of issue 14: B=1 at
>= 85% of the read ceiling, B in {2, 4} within 1.25x and B in {8, 16} within 1.5x of the bound.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
from pathlib import Path

import jax

from kvjax import analytic
from kvjax.analytic import Workload, roofline
from kvjax.files import write_json_atomic
from kvjax.measured.ceilings import load_or_measure_ceilings
from kvjax.measured.interleave import time_interleaved
from kvjax.measured.timing import device_name
from kvjax.model.config import ModelConfig, get_model_config

MODELS = {
    # the default run's small model (configs/*_cpu.yaml: llama-2-7b cut to 2 layers of 1024)
    "small": get_model_config(
        "llama-2-7b",
        num_layers=2,
        d_model=1024,
        num_heads=8,
        num_kv_heads=8,
        d_ff=2816,
        weight_dtype="f32",
        kv_dtype="f32",
    ).replace(name="small-f32"),
    # about 0.49e9 parameters: 1.97 GB of f32 weights
    "bench": get_model_config(
        "llama-2-7b",
        num_layers=8,
        d_model=2048,
        num_heads=16,
        num_kv_heads=4,
        d_ff=5632,
        weight_dtype="f32",
        kv_dtype="f32",
    ).replace(name="bench-0.5b-f32"),
}
TARGETS = {1: 1 / 0.85, 2: 1.25, 4: 1.25, 8: 1.5, 16: 1.5}  # time / bound at most


def run(cfg: ModelConfig, context: int, batches, rounds: int = 4, budget_s: float = 6.0) -> dict:
    workloads = [Workload("decode", b, context) for b in batches]
    timed = time_interleaved([(cfg, w) for w in workloads], rounds=rounds, budget_s=budget_s)
    read_ceiling = max(timed.bandwidth_rounds_bytes_per_s)
    peak = load_or_measure_ceilings().peak(cfg.compute_dtype)
    points = []
    for w, t in zip(workloads, timed.points, strict=True):
        step = analytic.step_cost(cfg, w)
        bound = roofline.point("decode step", step.flops, step.bytes, peak, read_ceiling)
        # each round against that round's ceiling (the machine's mode then), the median of them
        per_round = [
            t_r / roofline.point("step", step.flops, step.bytes, peak, bw_r).bound_s
            for t_r, bw_r in zip(t.round_median_s, timed.bandwidth_rounds_bytes_per_s, strict=True)
        ]
        ratio = statistics.median(per_round)
        points.append({
            "batch": w.batch, "median_s": t.median_s, "iqr_s": t.iqr_s, "runs": t.runs,
            "closed_step_bytes": step.bytes, "bound_s": bound.bound_s, "bound": bound.bound,
            "time_over_bound": ratio, "time_over_bound_per_round": per_round,
            "time_over_best_bound": t.median_s / bound.bound_s,
            "achieved_bytes_per_s": step.bytes / t.median_s,
            "fraction_of_read_ceiling": 1 / ratio,
            "target_time_over_bound": TARGETS.get(w.batch),
            "meets_target": None if w.batch not in TARGETS else ratio <= TARGETS[w.batch],
        })  # fmt: skip
    return {
        "benchmark": "decode_step_bandwidth",
        "date": datetime.date.today().isoformat(),
        "device": device_name(),
        "host": platform.node(),
        "jax": jax.__version__,
        "model": cfg.to_dict(),
        "context": context,
        "read_ceiling_bytes_per_s": read_ceiling,
        "read_ceiling_rounds_bytes_per_s": timed.bandwidth_rounds_bytes_per_s,
        "peak_flops_per_s": peak,
        "points": points,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--budget-s", type=float, default=6.0)
    parser.add_argument(
        "--out", type=Path, default=Path("experiments/results/decode_step_bandwidth.json")
    )
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    result = run(MODELS[args.model], args.context, batches, args.rounds, args.budget_s)
    write_json_atomic(args.out, result)
    bw = result["read_ceiling_bytes_per_s"]
    rounds = ", ".join(f"{b / 1e9:.1f}" for b in result["read_ceiling_rounds_bytes_per_s"])
    print(f"{result['device']} {result['model']['name']} S={args.context}: read ceiling "
          f"{bw / 1e9:.1f} GB/s (best of rounds {rounds})")  # fmt: skip
    for p in result["points"]:
        target = "" if p["meets_target"] is None else (
            f" (target <= {p['target_time_over_bound']:.2f}x: "
            f"{'met' if p['meets_target'] else 'missed'})")  # fmt: skip
        share = 100 * p["fraction_of_read_ceiling"]
        print(f"  B={p['batch']:>2}: {p['median_s'] * 1e3:7.2f} ms, {p['time_over_bound']:.2f}x "
              f"its bound ({share:.0f}% of the read ceiling) per round, "
              f"{p['time_over_best_bound']:.2f}x under the best round's{target}")  # fmt: skip


if __name__ == "__main__":
    main()
