"""The timing harness of the measured view.

Timing excludes compilation (every input set is run once first), blocks until the result is
ready, repeats until a run count or time budget, and reports median, min and inter-quartile
spread with the device name (nanoGPT's bench.py). Inputs are rotated among several sets so a
memory-bound kernel is not timed from cache; they are random, never zeros.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import jax
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


def random_array(seed, shape, dtype=np.float32) -> jax.Array:
    """A timed kernel's input: uniform on [-sqrt(3), sqrt(3)) (mean 0, variance 1) in `dtype`,
    made by numpy on the host from `seed` (an int or a `numpy.random.SeedSequence`) and put on
    the default device. `jax.random` compiles a program per shape, half a second each on a
    CPU host, which was most of a quick bench's set-up; numpy compiles nothing. The values only
    feed kernels whose time does not depend on them."""
    x = np.random.default_rng(seed).random(shape, dtype=np.float32)
    x -= np.float32(0.5)  # in place: a bandwidth probe's gigabyte is held once, not thrice
    x *= np.float32(2 * np.sqrt(3.0))
    if x.size < 2**22:  # cast on the host: no program to compile for a small array
        return jax.device_put(x.astype(np.dtype(dtype), copy=False))
    return jax.device_put(x).astype(dtype)  # a large one: ml_dtypes casts at ~0.3 GB/s


def random_inputs(seed: int, n: int) -> list[np.random.SeedSequence]:
    """n independent seeds for `random_array`, from one."""
    return np.random.SeedSequence(seed).spawn(n)


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
