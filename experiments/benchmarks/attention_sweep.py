"""Benchmark: decode attention over num_kv_heads (or MLA's over kv_lora_rank) on the machine at
hand, against the ceilings measured in the same run and against the closed form's proportions.

    python3 -m experiments.benchmarks.attention_sweep [--dtype f32] [--context 32768] [--out FILE]
    python3 -m experiments.benchmarks.attention_sweep --mla [--context 16384]

B=1, 32 query heads of 128, num_kv_heads in {1, 2, 4, 8, 16, 32}: the whole decode attention
(scores, softmax, av; the model's own `attend_cache`) jitted alone, random caches rotated past
the last-level cache. Reports each point's achieved bandwidth (KV bytes / time) and the ratios
t(32)/t(8) and t(8)/t(1) beside the closed form's ratios of bound times.

`--mla`: DeepSeek-V3's attention widths (128 heads, keys 128 + RoPE 64, values 128), the absorbed
form's attention (`kvjax.nn.mla.absorbed_attention`: scores over latent and RoPE key, softmax, av)
over kv_lora_rank in {128, 256, 512, 1024}, each placed on the measured roofline (its closed-form
FLOPs and bytes against the measured peak and read bandwidth) with its fused-kernel intensity.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import jax

from kvjax import analytic, kernels
from kvjax.analytic import Workload
from kvjax.cli.args import dtype_name
from kvjax.measured.bench import place
from kvjax.measured.ceilings import ReadCeiling, in_run_ceilings, load_or_measure_ceilings
from kvjax.measured.kernels import input_sets, kernel_benches
from kvjax.measured.timing import device_name, summarize, time_fn
from kvjax.model.config import ModelConfig
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


def mla_cfg(kv_lora_rank: int, dtype: str) -> ModelConfig:
    # DeepSeek-V3's attention widths per head; only the attention shapes matter here.
    return ModelConfig(
        name="mla-128x(128+64)", num_layers=1, d_model=7168, num_heads=128, num_kv_heads=128,
        head_dim=192, qk_rope_head_dim=64, v_head_dim=128, kv_lora_rank=kv_lora_rank,
        d_ff=18432, vocab_size=129280, weight_dtype=dtype, kv_dtype=dtype,
    )  # fmt: skip


def sweep(cfgs, wl, budget_s, ceilings, rounds, rotation_bytes=2**28):
    """Each config's decode attention timed interleaved (in turns over `rounds`), against the
    read ceiling measured before each round (the best of the rounds: this run's ceiling); the
    inputs rotate over copies of `rotation_bytes` in all (past the caches), and the read ceiling
    reads that many bytes."""
    benches = [kernel_benches(cfg, wl)[kernels.ATTENTION] for cfg in cfgs]
    sets = [input_sets(kb, rotation_bytes=rotation_bytes) for kb in benches]
    read_ceiling, bandwidths = ReadCeiling(rotation_bytes), []
    times: list[list[float]] = [[] for _ in cfgs]
    for _ in range(rounds):
        bandwidths.append(read_ceiling())
        for i, kb in enumerate(benches):
            stats = time_fn(kb.fn, sets[i], min_runs=3, budget_s=budget_s / rounds)
            times[i] += [stats.median_s] * stats.runs  # the round's median, weighted by runs
    ceilings = in_run_ceilings(ceilings, bandwidths)
    points = []
    for cfg, kb, ts in zip(cfgs, benches, times, strict=True):
        stats = summarize(ts)
        p = place(kernels.ATTENTION, kb.closed, stats, ceilings, cfg.compute_dtype)
        p["kv_bytes"] = kb.closed.kv_bytes
        p["kv_bytes_per_s"] = kb.closed.kv_bytes / stats.median_s
        p["fraction_of_read_bandwidth"] = p["achieved_bytes_per_s"] / ceilings.bandwidth_bytes_per_s
        p["fused_intensity"] = analytic.fused_attention_cost(cfg, wl).intensity
        points.append(p)
    return points, ceilings


def _result(name, dtype, wl, ceilings, points, **workload):
    return {
        "benchmark": name,
        "date": datetime.date.today().isoformat(),
        "device": device_name(),
        "jax": jax.__version__,
        "dtype": dtype,
        "workload": {"phase": "decode", "batch": wl.batch, "context": wl.context, **workload},
        "ceilings": ceilings.to_dict(),
        "points": points,
    }


def run(
    dtype="f32", context=32768, batch=1, kv_heads=(1, 2, 4, 8, 16, 32), budget_s=2.0, ceilings=None,
    rounds=3, rotation_bytes=2**28,
):  # fmt: skip
    """Decode attention over num_kv_heads (32 heads of 128)."""
    wl = Workload("decode", batch, context)
    cfgs = [attention_cfg(k, dtype) for k in kv_heads]
    ceilings = ceilings or load_or_measure_ceilings()
    points, ceilings = sweep(cfgs, wl, budget_s, ceilings, rounds, rotation_bytes)
    for k, p in zip(kv_heads, points, strict=True):
        p["num_kv_heads"] = k
    by = {p["num_kv_heads"]: p for p in points}
    ratios = {}
    for hi, lo in ((32, 8), (8, 1)):
        if hi in by and lo in by:
            ratios[f"t({hi})/t({lo})"] = {
                "measured": by[hi]["median_s"] / by[lo]["median_s"],
                "closed_form_bound": by[hi]["bound_s"] / by[lo]["bound_s"],
            }
    result = _result("attention_sweep", dtype, wl, ceilings, points, num_heads=32, head_dim=128)
    result["ratios"] = ratios
    return result


def run_mla(
    dtype="f32", context=16384, batch=1, ranks=(128, 256, 512, 1024), budget_s=2.0, ceilings=None,
    rounds=3, rotation_bytes=2**28,
):  # fmt: skip
    """MLA's absorbed decode attention over kv_lora_rank (128 heads, RoPE 64)."""
    wl = Workload("decode", batch, context)
    cfgs = [mla_cfg(a, dtype) for a in ranks]
    ceilings = ceilings or load_or_measure_ceilings()
    points, ceilings = sweep(cfgs, wl, budget_s, ceilings, rounds, rotation_bytes)
    for a, p in zip(ranks, points, strict=True):
        p["kv_lora_rank"] = a
    return _result("mla_attention_sweep", dtype, wl, ceilings, points, num_heads=128,
                   qk_rope_head_dim=64, form="absorbed")  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", type=dtype_name, default="f32", help="f32, bf16, ... (or alias)")
    parser.add_argument("--context", type=int, default=None, help="default 32768 (MLA: 16384)")
    parser.add_argument("--budget-s", type=float, default=2.0)
    parser.add_argument("--mla", action="store_true", help="MLA absorbed, over kv_lora_rank")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.mla:
        result = run_mla(args.dtype, args.context or 16384, budget_s=args.budget_s)
        out = args.out or Path("experiments/results/mla_attention_sweep_cpu.json")
    else:
        result = run(args.dtype, args.context or 32768, budget_s=args.budget_s)
        out = args.out or Path("experiments/results/attention_sweep_cpu.json")
    write_json_atomic(out, result)
    c = result["ceilings"]
    bw, peak = c["bandwidth_bytes_per_s"], c["peak_flops_per_s"][args.dtype]
    print(
        f"{result['device']} {args.dtype}, read ceiling {bw / 1e9:.1f} GB/s, peak "
        f"{peak / 1e9:.0f} GFLOP/s (ridge {peak / bw:.1f}), S={result['workload']['context']}"
    )
    for p in result["points"]:
        ms, iqr, bound = p["median_s"] * 1e3, p["iqr_s"] * 1e3, p["bound_s"] * 1e3
        what = f"A={p['kv_lora_rank']:>4}" if args.mla else f"h_kv={p['num_kv_heads']:>2}"
        print(
            f"  {what}: {ms:8.2f} ms (IQR {iqr:.2f}), bound {bound:7.2f} ms {p['bound']} "
            f"(I={p['closed_flops'] / p['closed_bytes']:.3g}, fused {p['fused_intensity']:.3g}), "
            f"{p['achieved_flops_per_s'] / 1e9:5.1f} GFLOP/s, "
            f"{p['achieved_bytes_per_s'] / 1e9:5.1f} GB/s = {100 * p['fraction_of_bound']:.0f}% "
            f"of bound"
        )
    for name, r in result.get("ratios", {}).items():
        measured, closed = r["measured"], r["closed_form_bound"]
        print(f"  {name}: measured {measured:.2f}, closed-form bound {closed:.2f}")


if __name__ == "__main__":
    main()
