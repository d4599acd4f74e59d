"""Measure: a timing harness and the read-bandwidth ceiling of the machine at hand.

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
