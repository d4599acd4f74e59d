"""The GPU check, one command, about 6 minutes on one H200 (estimated; the fused-attention sweep
adds about 1.5 more, not yet run on a GPU): this device's ceilings (bf16 and f32
matmul, HBM read, in-place copy and triad), the decode step of a llama-3-8b-shaped model (8 of its
32 layers, to fit the time) in bf16 profiled in situ over num_kv_heads {1, 2, 4, 8, 32} at
B in {1, 16}, S = 8192 (every kernel's time inside the step, its compiled and closed-form FLOPs
and bytes, on the measured roofline), the decode-attention num_kv_heads sweep, and attention
unfused vs fused (`flash_sweep`: flash-decoding at S in {2k, 32k}, cuDNN's and kvjax's Pallas
FlashAttention-2 prefill at S in {2k, 8k}, num_kv_heads in {1, 8, 32}).

    PYTHONPATH=. python3 -m experiments.benchmarks.gpu_check OUT_DIR           # on a GPU
    PYTHONPATH=. python3 -m experiments.benchmarks.gpu_check OUT_DIR --quick   # any machine

OUT_DIR/runs is a runs folder (`kvjax figures --runs runs OUT_DIR/runs` draws it beside this
machine's records); OUT_DIR/traces keeps the profiles (Perfetto / XProf). Its imports stay within
jax, numpy and kvjax's measured view: the GPU machine has no omegaconf or yaml (the configs it
writes are JSON, which YAML readers take).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

# What the check imports, beyond the standard library: checked first, so a machine missing one
# fails in one line before minutes of device time are spent (the GPU machine installs nothing).
NEEDS = ("jax", "jaxlib", "numpy", "flax", "optax", "chex", "psutil")
FLAX_FOR_JAX_011 = (0, 12, 7)  # flax 0.12.0-0.12.6 call jax.core APIs that jax 0.11 removed


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def preflight(find_spec=importlib.util.find_spec) -> list[str]:
    """Problems that would stop the check, each one line (empty: ready)."""
    missing = [name for name in NEEDS if find_spec(name) is None]
    if missing:
        return [f"missing: {', '.join(missing)} (carry the wheels in; see the device README)"]
    from importlib import metadata

    problems = []
    jax_version = _version(metadata.version("jax"))
    flax_version = _version(metadata.version("flax"))
    if jax_version >= (0, 11) and flax_version < FLAX_FOR_JAX_011:
        problems.append(
            f"flax {metadata.version('flax')} does not run on jax {metadata.version('jax')}: "
            "needs flax >= 0.12.7"
        )
    return problems


def environment() -> dict:
    import jax

    from kvjax.measured.timing import device_name

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": device_name(),
        "devices": [str(d) for d in jax.devices()],
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "host": platform.node(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def write_run(runs: Path, experiment: str, config: dict, points: dict[str, list[dict]]) -> None:
    """A run folder as `kvjax run` writes one (config, environment, one file per point)."""
    from kvjax.files import write_json_atomic, write_text_atomic
    from kvjax.runs.records import point_file_name

    run = runs / experiment / "gpu_check"
    write_text_atomic(run / "config.yaml", json.dumps({"experiment": experiment, **config}))
    write_json_atomic(run / "environment.json", environment())
    for key, records in points.items():
        write_json_atomic(run / "points" / point_file_name(key), {"key": key, "records": records})


# --quick's attention sweeps: two rounds over 16 MiB of input copies, where the full run rotates
# 256 MiB (past an H100/H200's 50 MB L2); --quick checks that everything runs, not the timings
QUICK_SWEEP = {"rounds": 2, "rotation_bytes": 2**24}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--quick", action="store_true", help="tiny shapes, any machine (tests)")
    args = parser.parse_args(argv)
    problems = preflight()
    if problems:
        for line in problems:
            print(f"gpu_check: {line}", file=sys.stderr)
        raise SystemExit(2)
    from experiments.benchmarks.attention_sweep import run as attention_sweep
    from experiments.benchmarks.attention_sweep import run_mla as attention_sweep_mla
    from experiments.benchmarks.flash_sweep import run as flash_sweep
    from kvjax import get_model_config
    from kvjax.analytic import Workload
    from kvjax.files import write_json_atomic
    from kvjax.measured.attribution import report_records, reports_on_ceilings
    from kvjax.measured.ceilings import measure_ceilings
    from kvjax.measured.profile import profile_step

    t0 = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - t0:5.0f} s] {message}", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "environment.json", environment())
    ceilings = measure_ceilings(budget_s=2.0 if args.quick else 8.0, quick=args.quick)
    write_json_atomic(args.out / "ceilings.json", ceilings.to_dict())
    log(f"ceilings: {ceilings.peak_flops_per_s}, {ceilings.bandwidth_bytes_per_s / 1e9:.1f} GB/s")

    if args.quick:
        base, context, batches, heads = get_model_config("tiny-gqa"), 256, (1, 4), (1, 3)
    else:
        base = get_model_config("llama-3-8b").replace(num_layers=8, name="llama-3-8b-8-layers")
        context, batches, heads = 8192, (1, 16), (1, 2, 4, 8, 32)
    points: dict[str, list[dict]] = {}
    for batch in batches:
        wl = Workload("decode", batch, context)
        for k in heads:
            cfg = base.replace(num_kv_heads=k)
            trace = args.out / "traces" / f"B{batch}-kv{k}"
            prof = profile_step(cfg, wl, steps=5 if args.quick else 20, trace_dir=str(trace))
            (report,) = reports_on_ceilings([prof], ceilings)
            points[f"workload.batch={batch},model.num_kv_heads={k}"] = report_records(report)
            step = report["step"]
            log(f"{cfg.name} h_kv={k} B={batch}: {step['median_s'] * 1e3:.3f} ms, "
                f"{100 * step['fraction_of_bound']:.0f}% of bound, coverage "
                f"{100 * report['coverage']:.0f}%")  # fmt: skip
    sweep = {"workload.batch": list(batches), "model.num_kv_heads": list(heads)}
    config = {"model": base.to_dict(), "workload": {"phase": "decode", "context": context},
              "sweep": sweep}  # fmt: skip
    write_run(args.out / "runs", "profile", config, points)

    sweep = attention_sweep(
        dtype="f32" if args.quick else "bf16",
        context=1024 if args.quick else 32768,
        kv_heads=(1, 8, 32) if args.quick else (1, 2, 4, 8, 16, 32),
        budget_s=0.2 if args.quick else 2.0,
        ceilings=ceilings,
        **QUICK_SWEEP if args.quick else {},
    )
    write_json_atomic(args.out / "attention_sweep.json", sweep)
    log(f"attention sweep: {sweep['ratios']}")
    # MLA's absorbed decode attention over kv_lora_rank (128 heads): on an H100-class GPU in bf16
    # its fused intensity (~240) sits near the ridge, where this CPU's (6.6) is far past it
    mla = attention_sweep_mla(
        dtype="f32" if args.quick else "bf16",
        context=512 if args.quick else 16384,
        ranks=(64, 128) if args.quick else (128, 256, 512, 1024),
        budget_s=0.2 if args.quick else 2.0,
        ceilings=ceilings,
        **QUICK_SWEEP if args.quick else {},
    )
    write_json_atomic(args.out / "mla_attention_sweep.json", mla)
    log("MLA sweep: " + ", ".join(
        f"A={p['kv_lora_rank']} {p['median_s'] * 1e3:.2f} ms ({100 * p['fraction_of_bound']:.0f}%)"
        for p in mla["points"]))  # fmt: skip
    # attention unfused vs fused (flash-decoding; cuDNN's and kvjax's Pallas prefill) over
    # num_kv_heads and S, each on the roofline with the closed form of what it ran
    fused = flash_sweep(
        dtype="f32" if args.quick else "bf16",
        contexts={"decode": (256,), "prefill": (256,)} if args.quick else None,
        kv_heads=(8,) if args.quick else (1, 8, 32),  # --quick: the group the test checks
        budget_s=0.1 if args.quick else 0.3,
        ceilings=ceilings,
        log=log,
        rotation_bytes=QUICK_SWEEP["rotation_bytes"] if args.quick else 2**28,
    )
    write_json_atomic(args.out / "flash_sweep.json", fused)
    (args.out / "done.json").write_text(json.dumps({"seconds": time.perf_counter() - t0}))


if __name__ == "__main__":
    main()
