"""The GPU check: ceilings, the decode-attention num_kv_heads sweep, and the llama-3-8b decode
step in bf16 at B in {1, 16}, written as records into a folder. Under 8 minutes on one GPU.

    python3 -m experiments.benchmarks.gpu_check OUT_DIR          # on a GPU machine
    python3 -m experiments.benchmarks.gpu_check OUT_DIR --quick  # small shapes, any machine
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import jax

from experiments.benchmarks.attention_sweep import run as attention_sweep
from kvjax import analytic, get_model_config, kernels
from kvjax.analytic import KernelCost, Workload
from kvjax.measured.bench import place
from kvjax.measured.ceilings import measure_ceilings
from kvjax.measured.step import time_decode_step
from kvjax.measured.timing import device_name
from kvjax.runs.records import write_json_atomic


def environment() -> dict:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": device_name(),
        "devices": [str(d) for d in jax.devices()],
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "host": platform.node(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--quick", action="store_true", help="small shapes for a CPU test run")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "environment.json", environment())

    ceilings = measure_ceilings(budget_s=2.0 if args.quick else 8.0, quick=args.quick)
    write_json_atomic(args.out / "ceilings.json", ceilings.to_dict())
    print(
        f"[{time.perf_counter() - t0:5.0f} s] ceilings: {ceilings.peak_flops_per_s}, "
        f"{ceilings.bandwidth_bytes_per_s / 1e9:.1f} GB/s",
        flush=True,
    )

    dtype = "f32" if args.quick else "bf16"
    sweep = attention_sweep(
        dtype=dtype,
        context=1024 if args.quick else 32768,
        kv_heads=(1, 8, 32) if args.quick else (1, 2, 4, 8, 16, 32),
        budget_s=0.2 if args.quick else 2.0,
        ceilings=ceilings,
    )
    write_json_atomic(args.out / "attention_sweep.json", sweep)
    print(f"[{time.perf_counter() - t0:5.0f} s] attention sweep: {sweep['ratios']}", flush=True)

    if args.quick:
        cfg, context, batches = get_model_config("tiny-gqa"), 256, (1, 4)
    else:
        cfg, context, batches = get_model_config("llama-3-8b"), 4096, (1, 16)
    steps = []
    for batch in batches:
        wl = Workload("decode", batch, context)
        stats = time_decode_step(cfg, wl, budget_s=0.5 if args.quick else 5.0)
        step = analytic.step_cost(cfg, wl)
        point = place(
            kernels.STEP_KERNEL,
            KernelCost(kernels.STEP_KERNEL, step.flops, step.bytes),
            stats,
            ceilings,
            cfg.compute_dtype,
        )
        point.update(model=cfg.name, batch=batch, context=context)
        steps.append(point)
        print(
            f"[{time.perf_counter() - t0:5.0f} s] {cfg.name} decode B={batch}: "
            f"{stats.median_s * 1e3:.2f} ms, {100 * point['fraction_of_bound']:.0f}% of bound",
            flush=True,
        )
    write_json_atomic(args.out / "decode_step.json", {"points": steps})
    (args.out / "done.json").write_text(json.dumps({"seconds": time.perf_counter() - t0}))


if __name__ == "__main__":
    main()
