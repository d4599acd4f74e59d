"""Benchmark: the sharded program's trace over every preset, num_kv_heads, tp and phase.

    python3 -m experiments.benchmarks.sharded_trace_grid [--out FILE.csv]

Each point compiles one device's step of the tp-way sharded model (kvjax.traced.sharded, 1- and
2-layer modules extrapolated to num_layers) on 8 simulated CPU devices, in f32 (XLA:CPU widens
bf16), and compares per-device FLOPs, bytes, collective bytes and counts, and the per-device
weights and KV cache of the program's shardings with kvjax.analytic.parallel's closed form.
Points the sharded model refuses (tp not dividing num_heads, d_ff or the vocabulary, or tp and
h_kv not dividing one another) are recorded with the reason.
"""

from __future__ import annotations

from kvjax.devices import request_host_devices

request_host_devices(8)  # before jax starts

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402
from rich.progress import track  # noqa: E402

from kvjax import KvjaxError, get_model_config  # noqa: E402
from kvjax.analytic.parallel import kv_cache_bytes_per_device, weight_bytes_per_device  # noqa: E402
from kvjax.model.config import PRESETS  # noqa: E402
from kvjax.runs.records import write_text_atomic  # noqa: E402
from kvjax.traced.sharded import trace_sharded_step  # noqa: E402
from kvjax.traced.step import cache_len  # noqa: E402


def grid(presets=None, tps=(2, 4, 8), batch=2, contexts=(("decode", 4096), ("prefill", 512))):
    for name in presets or [p for p in PRESETS if not p.startswith("tiny")]:
        cfg = get_model_config(name, weight_dtype="f32", kv_dtype="f32")
        kvs = sorted({k for k in (1, 8, cfg.num_heads) if cfg.num_heads % k == 0})
        for k in kvs:
            for tp in tps:
                for phase, context in contexts:
                    yield cfg.replace(num_kv_heads=k), tp, phase, batch, context


def trace_point(cfg, tp, phase, batch, context) -> dict:
    row = {"model": cfg.name, "num_kv_heads": cfg.num_kv_heads, "tp": tp, "phase": phase,
           "batch": batch, "context": context}  # fmt: skip
    try:
        t = trace_sharded_step(cfg, phase, batch, context, tp, layers="one")
    except KvjaxError as exc:
        return row | {"refused": str(exc).split(": ", 1)[-1][:160]}
    return row | {
        "refused": "",
        "flops_ratio": t.flops_per_device / t.closed_flops_per_device,
        "bytes_ratio": t.bytes_per_device / t.closed_bytes_per_device,
        "collective_ratio": t.collective_bytes / t.closed_collective_bytes,
        "collective_counts_equal": {k: int(v["count"]) for k, v in t.collectives.items()}
        == t.closed_collective_counts,
        "kv_bytes_equal": t.kv_cache_bytes_per_device
        == kv_cache_bytes_per_device(cfg, tp, cache_len(phase, context), batch),
        "weight_bytes_equal": t.weight_bytes_per_device == weight_bytes_per_device(cfg, tp),
        "flops_per_device": t.flops_per_device,
        "collective_bytes": t.collective_bytes,
        "trace_seconds": t.trace_seconds,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path("experiments/results/sharded_trace_grid.csv")
    )
    parser.add_argument("--presets", nargs="*")
    args = parser.parse_args(argv)
    points = list(grid(args.presets))
    t0 = time.perf_counter()
    df = pd.DataFrame([trace_point(*p) for p in track(points, description="compiling")])
    write_text_atomic(args.out, df.to_csv(index=False))
    ok = df[df.refused == ""]
    print(f"{len(df)} points ({len(ok)} traced) in {time.perf_counter() - t0:.0f} s -> {args.out}")
    print(
        f"FLOPs ratio {ok.flops_ratio.min():.4f}..{ok.flops_ratio.max():.4f}, "
        f"collective ratio {ok.collective_ratio.min():.4f}..{ok.collective_ratio.max():.4f}, "
        f"bytes ratio {ok.bytes_ratio.min():.3f}..{ok.bytes_ratio.max():.3f}; "
        f"counts equal {ok.collective_counts_equal.all()}, KV bytes equal "
        f"{ok.kv_bytes_equal.all()}, weight bytes equal {ok.weight_bytes_equal.all()}"
    )
    for reason, g in df[df.refused != ""].groupby("refused"):
        print(f"refused ({len(g)}): {reason}")


if __name__ == "__main__":
    main()
