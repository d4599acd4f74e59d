"""Benchmark: the traced view over every preset, num_kv_heads, phase, batch and context.

    python3 -m experiments.benchmarks.trace_grid [--out experiments/results/trace_grid.csv]

For each point one decoder layer is traced (XLA, lowered stage) and multiplied by num_layers
(tests/test_traced_step.py proves this equals the unrolled trace), then compared with the closed
form: the worst matmul-kernel FLOPs and bytes ratios, the worst FLOPs ratio over all kernels,
and the step's FLOPs and bytes ratios. Writes a CSV (pandas) and prints a summary.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pandas as pd
from rich.progress import track

from kvjax import analytic, get_model_config, kernels
from kvjax.analytic.variants import mla_variant
from kvjax.model.config import PRESETS
from kvjax.traced.step import compare, trace_step

MATMULS = {name for name, k in kernels.REGISTRY.items() if k.kind == kernels.MATMUL}


def grid(presets=None, batches=(1, 8), contexts=(512, 4096, 8192)):
    """Every preset over num_kv_heads, and its MLA variant (calc --variants' row) in both decode
    forms; mistral-7b's window (4096) rolls at S=8192."""
    for name in presets or [p for p in PRESETS if not p.startswith("tiny")]:
        cfg = get_model_config(name)
        kvs = sorted({k for k in (1, 2, 4, 8, cfg.num_heads) if cfg.num_heads % k == 0})
        mla = mla_variant(cfg)
        cfgs = [cfg.replace(num_kv_heads=k) for k in kvs]
        cfgs += [mla.replace(name=f"{cfg.name}-mla"), mla.replace(name=f"{cfg.name}-mla-naive",
                                                                  mla_decode="naive")]  # fmt: skip
        for variant in cfgs:
            for phase in ("prefill", "decode"):
                for batch in batches:
                    for context in contexts:
                        yield variant, phase, batch, context


def trace_point(cfg, phase, batch, context) -> dict:
    trace = trace_step(cfg, phase, batch, context, layers="one")
    rows = [r for r in compare(trace) if r.name != kernels.OTHER]
    mm = [r for r in rows if r.name in MATMULS]
    closed = analytic.step_cost(cfg, trace.workload)
    return {
        "model": cfg.name,
        "num_kv_heads": cfg.num_kv_heads,
        "phase": phase,
        "batch": batch,
        "context": context,
        "max_matmul_flops_dev": max(abs(r.flops_ratio - 1) for r in mm),
        "max_matmul_bytes_dev": max(abs(r.bytes_ratio - 1) for r in mm),
        "max_kernel_flops_dev": max(abs(r.flops_ratio - 1) for r in rows if r.closed_flops),
        "step_flops_ratio": trace.total.flops / closed.flops,
        "step_bytes_ratio": trace.total.bytes / closed.bytes,
        "traced_flops": trace.total.flops,
        "traced_bytes": trace.total.bytes,
        "closed_flops": closed.flops,
        "closed_bytes": closed.bytes,
        "trace_seconds": trace.trace_seconds,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("experiments/results/trace_grid.csv"))
    parser.add_argument("--presets", nargs="*")
    args = parser.parse_args(argv)
    points = list(grid(args.presets))
    t0 = time.perf_counter()
    rows = [trace_point(*p) for p in track(points, description="tracing")]
    df = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=args.out.parent, prefix=f".{args.out.name}.")
    os.close(fd)
    df.to_csv(tmp, index=False)
    os.replace(tmp, args.out)
    print(f"{len(df)} points in {time.perf_counter() - t0:.0f} s -> {args.out}")
    print(
        f"worst matmul FLOPs deviation {df.max_matmul_flops_dev.max():.2e}, "
        f"worst matmul bytes deviation {df.max_matmul_bytes_dev.max():.2e}, "
        f"worst kernel FLOPs deviation {df.max_kernel_flops_dev.max():.2e}, "
        f"step FLOPs ratio {df.step_flops_ratio.min():.5f}..{df.step_flops_ratio.max():.5f}, "
        f"step bytes ratio {df.step_bytes_ratio.min():.3f}..{df.step_bytes_ratio.max():.3f}"
    )
    summary = df.groupby(["phase"])[["step_flops_ratio", "step_bytes_ratio"]].describe()
    print(summary.T.to_string())


if __name__ == "__main__":
    main()
