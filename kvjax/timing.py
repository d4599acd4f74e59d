"""Measure: a timing harness and the read-bandwidth ceiling of the machine at hand.

Timing excludes compilation (every input set is run once first), blocks until the result is
ready, repeats until a run count or time budget, and reports median, min and inter-quartile
spread with the device name (nanoGPT's bench.py). Inputs are rotated among several sets so a
memory-bound kernel is not timed from cache; they are random, never zeros.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class TimingStats:
    median_s: float
    min_s: float
    q25_s: float
    q75_s: float
    runs: int
    device: str

    @property
    def iqr_s(self) -> float:
        return self.q75_s - self.q25_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "iqr_s": self.iqr_s}


def device_name(device: jax.Device | None = None) -> str:
    device = device or jax.devices()[0]
    return f"{device.platform}:{device.device_kind}"


def summarize(times_s: Sequence[float], device: str | None = None) -> TimingStats:
    if not times_s:
        raise ValueError("no timings to summarize")
    ts = sorted(times_s)
    q = np.quantile(ts, [0.25, 0.75]) if len(ts) > 1 else (ts[0], ts[0])
    return TimingStats(
        median_s=statistics.median(ts),
        min_s=ts[0],
        q25_s=float(q[0]),
        q75_s=float(q[1]),
        runs=len(ts),
        device=device or device_name(),
    )


def time_fn(
    fn: Callable[..., Any],
    arg_sets: Sequence[tuple],
    *,
    min_runs: int = 5,
    max_runs: int = 200,
    budget_s: float = 2.0,
) -> TimingStats:
    """Time `fn(*args)` rotating over `arg_sets` (none of them donated)."""
    for args in arg_sets:  # compile and warm every input set
        jax.block_until_ready(fn(*args))
    times: list[float] = []
    start = time.perf_counter()
    i = 0
    while len(times) < max_runs and (
        len(times) < min_runs or time.perf_counter() - start < budget_s
    ):
        args = arg_sets[i % len(arg_sets)]
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
        i += 1
    return summarize(times)


def time_loop(
    step: Callable[[Any], Any],
    carry: Any,
    *,
    warmup: int = 2,
    min_runs: int = 5,
    max_runs: int = 200,
    budget_s: float = 2.0,
) -> tuple[TimingStats, Any]:
    """Time `carry = step(carry)`, for steps whose state is donated (a KV cache)."""
    for _ in range(warmup):
        carry = jax.block_until_ready(step(carry))
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_runs and (
        len(times) < min_runs or time.perf_counter() - start < budget_s
    ):
        t0 = time.perf_counter()
        carry = jax.block_until_ready(step(carry))
        times.append(time.perf_counter() - t0)
    return summarize(times), carry


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


# ---------------------------------------------------------------------------------------------
# Measured ceilings of the machine at hand, as a ChipSpec, cached per device.
# ---------------------------------------------------------------------------------------------
def measure_matmul_flops(
    dtype: str = "f32", n: int = 2048, budget_s: float = 2.0, seed: int = 0
) -> tuple[float, TimingStats]:
    """FLOP/s of a large square `jnp.dot` (2n^3 FLOPs); bf16 and f16 accumulate in f32."""
    from kvjax.nn.layers import JNP_DTYPES

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


def available_memory_bytes(device: jax.Device | None = None) -> float | None:
    """Free memory of the device (an accelerator's allocator limit, or the host's RAM)."""
    device = device or jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # not every backend has memory stats
        stats = None
    if stats and "bytes_limit" in stats:
        return float(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    try:
        import psutil

        return float(psutil.virtual_memory().available)
    except ImportError:
        return None


def measure_ceilings(budget_s: float = 6.0, quick: bool = False):
    """Peak matmul FLOP/s (f32 and bf16, f32 accumulation) and memory bandwidth of this device,
    as a `ChipSpec` named after it. The bandwidth is the read ceiling (a reduction); the donated
    update's read + write rate is kept in `extra`."""
    from kvjax.hardware import ChipSpec

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
    from kvjax.hardware import ChipSpec

    path = path or ceilings_cache_path()
    if path.exists() and not refresh:
        data = json.loads(path.read_text())
        return ChipSpec(**data)
    from kvjax.records import write_json_atomic

    spec = measure_ceilings(quick=quick)
    write_json_atomic(path, spec.to_dict())
    return spec
