"""Benchmark: llama-3-8b (all 32 layers) compiled for accelerators on this host, per kernel.

    python3 -m experiments.benchmarks.target_grid [--out experiments/results/target_grid.csv]

Each point is `kvjax trace --target T` (deviceless AOT; needs the `targets` extra): decode B=1 at
S=8192 and prefill at S=2048 on h100, h200, b200, tpu-v5e (16 of the 32 layers: the full step
does not fit its 16 GB) and tpu-v6e. One row per (target, phase, kernel): closed form vs the
target's executable as kvjax counts it, what executes it, the temporaries XLA added, the fused
kernels; plus one `step` row per point with the memory analysis. Writes a CSV (pandas).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import pandas as pd

from kvjax import get_model_config
from kvjax.traced.target_step import trace_dict, trace_target_step

POINTS = [
    (target, phase, batch, context)
    for target in ("h100", "h200", "b200", "tpu-v5e", "tpu-v6e")
    for phase, batch, context in (("decode", 1, 8192), ("prefill", 1, 2048))
]


def run(points=POINTS, model="llama-3-8b") -> pd.DataFrame:
    rows = []
    for target, phase, batch, context in points:
        cfg = get_model_config(model)
        if target == "tpu-v5e":
            cfg = cfg.replace(num_layers=16)  # 32 layers need 16 GB of weights: more than HBM
        trace = trace_target_step(cfg, phase, batch, context, target)
        report = trace_dict(trace)
        point = {"model": cfg.name, "num_layers": cfg.num_layers, "target": target,
                 "device": trace.device_kind, "phase": phase, "batch": batch,
                 "context": context}  # fmt: skip
        for r in report["kernels"]:
            rows.append({**point, **{k: (json.dumps(v) if isinstance(v, dict | list) else v)
                                     for k, v in r.items()}})  # fmt: skip
        total, mem = report["total"], report["memory"]
        step = {"name": "step", "kind": "step", "step_bytes": mem["step_bytes"],
                "temp_bytes": mem["temp_bytes"], "fits": mem["fits"],
                "compile_seconds": report["compile_seconds"]}  # fmt: skip
        step.update({k: total[k] for k in ("closed_flops", "compiled_flops", "closed_bytes",
                                           "compiled_bytes")})  # fmt: skip
        rows.append({**point, **step})
        ratio = total["compiled_bytes"] / total["closed_bytes"]
        print(f"{target} {phase}: {trace.device_kind}, {report['compile_seconds']:.1f} s "
              f"compile, {ratio:.3f} x the closed form's bytes")  # fmt: skip
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("experiments/results/target_grid.csv"))
    args = parser.parse_args(argv)
    df = run()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=args.out.parent, suffix=".csv")
    os.close(fd)
    df.to_csv(tmp, index=False)
    os.replace(tmp, args.out)
    print(f"wrote {args.out} ({len(df)} rows)")


if __name__ == "__main__":
    main()
