"""Benchmark: the decode step of a small model with a sliding window, over contexts past the window,
against the same model attending everything, on the machine at hand.

    python3 -m experiments.benchmarks.window_decode [--window 1024] [--out FILE]

The hkv_ablation's small f32 model (llama-2-7b cut to 2 layers of d_model 1024, 8 heads, GQA-2),
every layer sliding (Mistral's pattern) with a rolling buffer of `window` slots, decode at B=1,
S = window/2 .. 16 x window; each point the whole served step (attend, then the donated append),
timed interleaved with the full-attention model at the same S (`time_interleaved`: every model
built first, timed in turns over rounds, the read bandwidth measured before each round). The
closed form's bound is placed under this run's read ceiling. Past the window the windowed step's
time and bytes stay flat while the full model's grow with S.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import jax

from kvjax import analytic
from kvjax.analytic import Workload, roofline
from kvjax.measured.ceilings import in_run_ceilings, load_or_measure_ceilings
from kvjax.measured.interleave import time_interleaved
from kvjax.measured.timing import device_name
from kvjax.model.config import get_model_config
from kvjax.runs.records import write_json_atomic


def small(window: int):
    base = get_model_config("llama-2-7b").replace(
        name="small-f32-window", num_layers=2, d_model=1024, num_heads=8,
        num_kv_heads=2, d_ff=2816, weight_dtype="f32", kv_dtype="f32",
    )  # fmt: skip
    return base.replace(sliding_window=window, layer_pattern="L"), base


def run(window=1024, factors=(0.5, 1, 2, 4, 8, 16), rounds=3, budget_s=1.0):
    windowed, full = small(window)
    contexts = [int(window * f) for f in factors]
    points = [(cfg, Workload("decode", 1, s)) for s in contexts for cfg in (windowed, full)]
    timed = time_interleaved(points, rounds=rounds, budget_s=budget_s)
    ceilings = in_run_ceilings(load_or_measure_ceilings(), timed.bandwidth_rounds_bytes_per_s)
    bw, peak = ceilings.bandwidth_bytes_per_s, ceilings.peak("f32")
    out = []
    for (cfg, wl), t in zip(points, timed.points, strict=True):
        step = analytic.step_cost(cfg, wl)
        bound = roofline.point("decode step", step.flops, step.bytes, peak, bw)
        out.append({
            "model": "windowed" if cfg.sliding_window else "full attention",
            "sliding_window": cfg.sliding_window, "context": wl.context,
            "kv_cache_bytes": analytic.kv_cache_bytes(cfg, wl.context),
            "closed_step_bytes": step.bytes, "bound_s": bound.bound_s,
            "median_s": t.median_s, "iqr_s": t.iqr_s,
            "fraction_of_bound": bound.bound_s / t.median_s,
        })  # fmt: skip
    return {
        "benchmark": "window_decode",
        "date": datetime.date.today().isoformat(),
        "device": device_name(),
        "jax": jax.__version__,
        "model": windowed.to_dict(),
        "ceilings": ceilings.to_dict(),
        "points": out,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=Path("experiments/results/window_decode.json"))
    args = parser.parse_args(argv)
    result = run(args.window)
    write_json_atomic(args.out, result)
    bw = result["ceilings"]["bandwidth_bytes_per_s"]
    print(f"{result['device']}, read ceiling {bw / 1e9:.1f} GB/s, window {args.window}")
    for p in result["points"]:
        print(
            f"  S={p['context']:>6} {p['model']:>14}: {p['median_s'] * 1e3:7.2f} ms "
            f"(IQR {p['iqr_s'] * 1e3:.2f}), bound {p['bound_s'] * 1e3:6.2f} ms, KV "
            f"{p['kv_cache_bytes'] / 2**20:7.1f} MiB, {100 * p['fraction_of_bound']:.0f}% of bound"
        )


if __name__ == "__main__":
    main()
