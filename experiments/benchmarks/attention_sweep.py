"""Benchmark: decode attention over num_kv_heads on the machine at hand, against the read ceiling
measured in the same run and against the closed form's proportions.

    python3 -m experiments.benchmarks.attention_sweep [--dtype f32] [--context 32768] [--out FILE]

B=1, 32 query heads of 128, num_kv_heads in {1, 2, 4, 8, 16, 32}: the whole decode attention
(scores, softmax, av; the model's own `attend_cache`) jitted alone, random caches rotated past
the last-level cache. Reports each point's achieved bandwidth (KV bytes / time) and the ratios
t(32)/t(8) and t(8)/t(1) beside the closed form's ratios of bound times.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import jax

from kvjax import kernels
from kvjax.analytic import Workload
from kvjax.config import ModelConfig
from kvjax.measured.bench import place
from kvjax.measured.ceilings import ReadCeiling, in_run_ceilings, load_or_measure_ceilings
from kvjax.measured.kernels import input_sets, kernel_benches
from kvjax.measured.timing import device_name, summarize, time_fn
from kvjax.runs.records import write_json_atomic


def attention_cfg(num_kv_heads: int, dtype: str) -> ModelConfig:
    # Only the attention shapes matter here (32 heads of 128, as Llama-3-8B).
    return ModelConfig(
        name="attention-32x128",
        num_layers=1,
        d_model=4096,
        num_heads=32,
        num_kv_heads=num_kv_heads,
        head_dim=128,
        d_ff=14336,
        vocab_size=128256,
        weight_dtype=dtype,
        kv_dtype=dtype,
    )


def run(
    dtype="f32", context=32768, batch=1, kv_heads=(1, 2, 4, 8, 16, 32), budget_s=2.0, ceilings=None,
    rounds=3,
):  # fmt: skip
    """Each num_kv_heads' decode attention timed interleaved (in turns over `rounds`), against
    the read ceiling measured before each round (the best of the rounds: this run's ceiling)."""
    ceilings = ceilings or load_or_measure_ceilings()
    wl = Workload("decode", batch, context)
    benches = [kernel_benches(attention_cfg(k, dtype), wl)[kernels.ATTENTION] for k in kv_heads]
    sets = [input_sets(kb, rotation_bytes=2**28) for kb in benches]
    read_ceiling, bandwidths = ReadCeiling(), []
    times: list[list[float]] = [[] for _ in kv_heads]
    for _ in range(rounds):
        bandwidths.append(read_ceiling())
        for i, kb in enumerate(benches):
            stats = time_fn(kb.fn, sets[i], min_runs=3, budget_s=budget_s / rounds)
            times[i] += [stats.median_s] * stats.runs  # the round's median, weighted by runs
    ceilings = in_run_ceilings(ceilings, bandwidths)
    points = []
    for k, kb, ts in zip(kv_heads, benches, times, strict=True):
        stats = summarize(ts)
        p = place(
            kernels.ATTENTION, kb.closed, stats, ceilings, attention_cfg(k, dtype).compute_dtype
        )
        p["num_kv_heads"] = k
        p["kv_bytes"] = kb.closed.kv_bytes
        p["kv_bytes_per_s"] = kb.closed.kv_bytes / stats.median_s
        p["fraction_of_read_bandwidth"] = p["achieved_bytes_per_s"] / ceilings.bandwidth_bytes_per_s
        points.append(p)
    by = {p["num_kv_heads"]: p for p in points}
    ratios = {}
    for hi, lo in ((32, 8), (8, 1)):
        if hi in by and lo in by:
            ratios[f"t({hi})/t({lo})"] = {
                "measured": by[hi]["median_s"] / by[lo]["median_s"],
                "closed_form_bound": by[hi]["bound_s"] / by[lo]["bound_s"],
            }
    return {
        "benchmark": "attention_sweep",
        "date": datetime.date.today().isoformat(),
        "device": device_name(),
        "jax": jax.__version__,
        "dtype": dtype,
        "workload": {
            "phase": "decode",
            "batch": batch,
            "context": context,
            "num_heads": 32,
            "head_dim": 128,
        },
        "ceilings": ceilings.to_dict(),
        "points": points,
        "ratios": ratios,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="f32")
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--budget-s", type=float, default=2.0)
    parser.add_argument(
        "--out", type=Path, default=Path("experiments/results/attention_sweep_cpu.json")
    )
    args = parser.parse_args(argv)
    result = run(args.dtype, args.context, budget_s=args.budget_s)
    write_json_atomic(args.out, result)
    bw = result["ceilings"]["bandwidth_bytes_per_s"]
    print(f"{result['device']} {args.dtype}, read ceiling {bw / 1e9:.1f} GB/s, S={args.context}")
    for p in result["points"]:
        ms, iqr, bound = p["median_s"] * 1e3, p["iqr_s"] * 1e3, p["bound_s"] * 1e3
        print(
            f"  h_kv={p['num_kv_heads']:>2}: {ms:8.2f} ms (IQR {iqr:.2f}), bound {bound:7.2f} ms "
            f"{p['bound']}, {p['achieved_bytes_per_s'] / 1e9:5.1f} GB/s = "
            f"{100 * p['fraction_of_read_bandwidth']:.0f}% of read bandwidth"
        )
    for name, r in result["ratios"].items():
        measured, closed = r["measured"], r["closed_form_bound"]
        print(f"  {name}: measured {measured:.2f}, closed-form bound {closed:.2f}")


if __name__ == "__main__":
    main()
