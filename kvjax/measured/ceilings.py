"""The roofline of the machine at hand, measured: peak matmul FLOP/s per dtype and memory
bandwidth, as a `ChipSpec` cached per device (`kvjax ceilings`)."""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

import jax
import jax.numpy as jnp

from kvjax.files import write_json_atomic
from kvjax.hardware import ChipSpec
from kvjax.measured.timing import (
    TimingStats,
    available_memory_bytes,
    device_name,
    time_fn,
    time_loop,
)
from kvjax.nn.layers import JNP_DTYPES


def measure_read_bandwidth(
    nbytes: int = 512 * 2**20,
    copies: int = 2,
    budget_s: float = 2.0,
    seed: int = 0,
    trials: int = 3,
) -> tuple[float, TimingStats]:
    """Bytes/s of a jitted `jnp.sum` over f32 arrays of `nbytes`, rotating over `copies` of them
    so each read comes from memory, not cache.

    A ceiling is an upper bound, so the best of `trials` medians is returned (with its stats):
    on the 2-core machines here the same executable read at either ~39 or ~72 GB/s from one
    trial to the next, which a single median would report at random.
    """
    n = nbytes // 4
    keys = jax.random.split(jax.random.key(seed), copies)
    arrays = [jax.random.normal(k, (n,), jnp.float32) for k in keys]
    total = jax.jit(jnp.sum)
    best = None
    for _ in range(trials):
        stats = time_fn(total, [(a,) for a in arrays], budget_s=budget_s / trials)
        if best is None or stats.median_s < best.median_s:
            best = stats
    return n * 4 / best.median_s, best


def measure_matmul_flops(
    dtype: str = "f32", n: int = 2048, budget_s: float = 2.0, seed: int = 0
) -> tuple[float, TimingStats]:
    """FLOP/s of a large square `jnp.dot` (2n^3 FLOPs); bf16 and f16 accumulate in f32."""
    jdt = JNP_DTYPES[dtype]
    keys = jax.random.split(jax.random.key(seed), 4)
    pairs = [
        (
            jax.random.normal(keys[i], (n, n)).astype(jdt),
            jax.random.normal(keys[i + 1], (n, n)).astype(jdt),
        )
        for i in (0, 2)
    ]
    dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
    stats = time_fn(dot, pairs, budget_s=budget_s)
    return 2 * n**3 / stats.median_s, stats


def measure_update_bandwidth(
    nbytes: int = 512 * 2**20, budget_s: float = 2.0, seed: int = 0
) -> tuple[float, TimingStats]:
    """Bytes/s of a donated in-place `x + 1` over f32 (a read and a write of every byte)."""
    x = jax.random.normal(jax.random.key(seed), (nbytes // 4,), jnp.float32)
    step = jax.jit(lambda a: a + 1.0, donate_argnums=0)
    stats, _ = time_loop(step, x, budget_s=budget_s)
    return 2 * (nbytes // 4) * 4 / stats.median_s, stats


def measure_ceilings(budget_s: float = 6.0, quick: bool = False):
    """Peak matmul FLOP/s (f32 and bf16, f32 accumulation) and memory bandwidth of this device,
    as a `ChipSpec` named after it. The bandwidth is the read ceiling (a reduction); the donated
    update's read + write rate is kept in `extra`."""
    share = budget_s / 5
    n = 512 if quick else 2048
    nbytes = (32 if quick else 512) * 2**20
    f32, f32_stats = measure_matmul_flops("f32", n, share)
    bf16, bf16_stats = measure_matmul_flops("bf16", n, share)
    read_bw, read_stats = measure_read_bandwidth(nbytes, budget_s=2 * share)
    update_bw, update_stats = measure_update_bandwidth(nbytes, budget_s=share)
    return ChipSpec(
        name=f"measured {device_name()}",
        peak_flops_per_s={"f32": f32, "bf16": bf16},
        bandwidth_bytes_per_s=read_bw,
        memory_bytes=available_memory_bytes(),
        source=f"measured by kvjax on {device_name()} (jax {jax.__version__})",
        date=datetime.date.today().isoformat(),
        notes="matmul: square jnp.dot; bandwidth: read-only jnp.sum, best of 3 trials",
        extra={
            "update_bandwidth_bytes_per_s": update_bw,
            "matmul_n": n,
            "bandwidth_array_bytes": nbytes,
            "timings": {
                "matmul_f32": f32_stats.to_dict(),
                "matmul_bf16": bf16_stats.to_dict(),
                "read": read_stats.to_dict(),
                "update": update_stats.to_dict(),
            },
        },
    )


def ceilings_cache_path(device: str | None = None) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvjax"
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", device or device_name())
    return root / f"ceilings-{slug}.json"


def load_or_measure_ceilings(refresh: bool = False, quick: bool = False, path=None):
    """The cached ceilings of this device, measured (and cached atomically) when absent."""
    path = path or ceilings_cache_path()
    if path.exists() and not refresh:
        data = json.loads(path.read_text())
        return ChipSpec(**data)
    spec = measure_ceilings(quick=quick)
    write_json_atomic(path, spec.to_dict())
    return spec
