"""Benchmark: attention unfused and fused, over num_kv_heads and S, on the machine at hand.

    PYTHONPATH=. python3 -m experiments.benchmarks.flash_sweep [--quick] [--out FILE]

32 query heads of 128 (Llama-3-8B's attention), B = 1. Decode: XLA's scores -> softmax -> av
over the cache against kvjax's Pallas flash-decoding kernel (the cache in the splits
`kvjax.analytic.flash.plan` gives for this device's cores). Prefill: XLA's unfused causal
attention against each fused implementation this backend has (cuDNN's and kvjax's Pallas
FlashAttention-2 on a GPU). Every point is placed on the roofline measured in the same run with
the closed form of what it runs (`kvjax.analytic.flash` for the fused kernels, tiled as run),
and says what ran it: on a CPU the Pallas kernels are interpreted, a check of their values, not
a kernel's time. Part of the GPU check (`gpu_check.py`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
from pathlib import Path

import jax

from experiments.benchmarks.attention_sweep import attention_cfg
from kvjax import hardware, kernels
from kvjax.analytic import Workload, flash
from kvjax.measured.bench import place
from kvjax.measured.ceilings import load_or_measure_ceilings
from kvjax.measured.kernels import flash_execution, input_sets, kernel_benches
from kvjax.measured.timing import device_name, time_fn
from kvjax.nn import flash as flash_model
from kvjax.runs.records import write_json_atomic


def device_chip(ceilings):
    """The chip preset named like this device (its on-chip memory sizes the tiles and splits),
    else the measured ceilings with this device's core count (128 x 128 tiles)."""
    name = device_name().lower()
    for chip in hardware.CHIPS.values():
        model = chip.name.split("-")[0].lower()  # h100-sxm -> h100
        if chip.onchip_bytes_per_core and model in name:
            return chip
    return dataclasses.replace(ceilings, num_cores=getattr(jax.devices()[0], "core_count", None))


def forms(phase: str, backend: str) -> list[tuple[str, str | None]]:
    """(attention_kernel, prefill implementation) pairs timed for a phase on a backend."""
    if phase == "decode":
        return [("xla", None), ("flash", None)]
    fused = ["cudnn", "pallas"] if backend == "gpu" else ["xla", "pallas"]
    return [("xla", None)] + [("flash", impl) for impl in fused]


def point(cfg, wl, prefill, chip, ceilings, budget_s, rotation_bytes=2**28) -> dict:
    """One (config, workload, implementation) timed alone, placed on the measured roofline; its
    inputs rotate over copies of `rotation_bytes` in all."""
    tiles = flash.plan(cfg, wl, chip.onchip_bytes_per_core, chip.num_cores)
    backend = jax.default_backend()
    with flash_model.lowering_for(backend, tiles.splits, prefill=prefill, block_q=tiles.block_q,
                                  block_k=tiles.block_k):  # fmt: skip
        kb = kernel_benches(cfg, wl, chip)[kernels.ATTENTION]
        stats = time_fn(kb.fn, input_sets(kb, rotation_bytes=rotation_bytes), min_runs=3,
                        budget_s=budget_s)  # fmt: skip
        runs = flash_execution(cfg, wl.phase) if cfg.attention_kernel == "flash" else "xla"
    p = place(kernels.ATTENTION, kb.closed, stats, ceilings, cfg.compute_dtype)
    p.update(
        phase=wl.phase, context=wl.context, num_kv_heads=cfg.num_kv_heads,
        attention_kernel=cfg.attention_kernel, executed_as=runs,
        interpreted=runs == "pallas interpret", intensity=kb.closed.flops / kb.closed.bytes,
        block_q=tiles.block_q, block_k=tiles.block_k, splits=tiles.splits,
    )  # fmt: skip
    return p


def run(dtype="bf16", contexts=None, kv_heads=(1, 8, 32), budget_s=0.5, ceilings=None,
        batch=1, log=print, rotation_bytes=2**28) -> dict:  # fmt: skip
    """Every phase x S x num_kv_heads x implementation; `contexts` per phase."""
    contexts = contexts or {"decode": (2048, 32768), "prefill": (2048, 8192)}
    ceilings = ceilings or load_or_measure_ceilings()
    chip, backend = device_chip(ceilings), jax.default_backend()
    points = []
    for phase, lengths in contexts.items():
        for S in lengths:
            wl = Workload(phase, batch, S)
            for k in kv_heads:
                for kernel, prefill in forms(phase, backend):
                    cfg = attention_cfg(k, dtype).replace(attention_kernel=kernel)
                    p = point(cfg, wl, prefill, chip, ceilings, budget_s, rotation_bytes)
                    points.append(p)
                    log(f"{phase} S={S} h_kv={k} {p['executed_as']}: "
                        f"{p['median_s'] * 1e3:.3f} ms, {100 * p['fraction_of_bound']:.0f}% of "
                        f"bound (I={p['intensity']:.3g})")  # fmt: skip
    return {
        "benchmark": "flash_sweep",
        "date": datetime.date.today().isoformat(),
        "device": device_name(),
        "jax": jax.__version__,
        "dtype": dtype,
        "chip_for_tiles": chip.name,
        "ceilings": ceilings.to_dict(),
        "points": points,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, f32 (any machine)")
    parser.add_argument("--out", type=Path, default=Path("experiments/results/flash_sweep.json"))
    args = parser.parse_args(argv)
    if args.quick:
        result = run(
            "f32", {"decode": (256,), "prefill": (256,)}, (1, 8), budget_s=0.1, rotation_bytes=2**24
        )
    else:
        result = run()
    write_json_atomic(args.out, result)


if __name__ == "__main__":
    main()
