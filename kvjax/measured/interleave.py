"""Measured sweeps that the machine cannot fool: the points are timed interleaved, round-robin,
with the read bandwidth re-measured before each round, and the results checked against their
bounds and against one another.

The 2-core machines here read memory in two modes (~40 or ~70 GB/s) that switch from one minute
to the next. Timed one after another, a sweep's points land in whichever mode held at the time,
and a trend can come out backwards; timed in turns, every point sees every mode alike.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import jax
import numpy as np

from kvjax import analytic
from kvjax.analytic import Workload
from kvjax.measured.ceilings import ReadCeiling
from kvjax.measured.kernels import check_fits
from kvjax.measured.step import served_step
from kvjax.model.config import ModelConfig
from kvjax.traced.step import cache_len


@dataclass(frozen=True)
class Timed:
    median_s: float
    iqr_s: float
    runs: int
    round_median_s: list[float]  # the median of each round, beside that round's ceiling


@dataclass(frozen=True)
class InterleavedTiming:
    points: list[Timed]
    bandwidth_rounds_bytes_per_s: list[float]


def time_interleaved(
    points: list[tuple[ModelConfig, Workload]],
    rounds: int = 3,
    budget_s: float = 1.0,
    ceiling_bytes: int = 256 * 2**20,
) -> InterleavedTiming:
    """Each point's served step (`kvjax.measured.step`) timed in `rounds` turns of about
    `budget_s / rounds` seconds each, round-robin, after the read ceiling of the round
    (`ReadCeiling` over `ceiling_bytes`: the best of a reduction and the model's GEMV)."""
    needed = sum(
        analytic.weight_bytes(c)
        + analytic.kv_cache_bytes(c, cache_len(w.phase, w.context), w.batch)
        for c, w in points
    )
    check_fits(f"the {len(points)} points of the sweep (weights + KV caches)", needed)
    served = [served_step(c, w) for c, w in points]
    carries = [s.carry for s in served]
    per_step = []
    for i, s in enumerate(served):  # compile, warm up, and size each turn
        for _ in range(2):
            carries[i] = jax.block_until_ready(s.step(carries[i]))
        t0 = time.perf_counter()
        carries[i] = jax.block_until_ready(s.step(carries[i]))
        per_step.append(time.perf_counter() - t0)
    times: list[list[float]] = [[] for _ in points]
    rounds_s: list[list[float]] = [[] for _ in points]
    bandwidth = []
    read_ceiling = ReadCeiling(ceiling_bytes)
    for _ in range(rounds):
        bandwidth.append(read_ceiling())
        for i, s in enumerate(served):
            n = max(3, int(budget_s / rounds / max(per_step[i], 1e-6)))
            this_round = []
            for _ in range(n):
                t0 = time.perf_counter()
                carries[i] = jax.block_until_ready(s.step(carries[i]))
                this_round.append(time.perf_counter() - t0)
            times[i] += this_round
            rounds_s[i].append(statistics.median(this_round))
    timed = []
    for ts, rs in zip(times, rounds_s, strict=True):
        q25, q75 = np.quantile(ts, [0.25, 0.75])
        timed.append(Timed(statistics.median(ts), float(q75 - q25), len(ts), rs))
    return InterleavedTiming(timed, bandwidth)


def flag_sweep(records: list[dict], bytes_key: str, noise: float = 0.05) -> None:
    """Add `flagged` to each measured record: None when all is well, else the reasons: below its
    bound (a roofline bound is a floor on time), or timed faster than a point of the sweep that
    moves fewer bytes (the trend against the bytes). (`flags` would shadow pandas' attribute.)"""
    flags: list[list[str]] = [[] for _ in records]
    for r, f in zip(records, flags, strict=True):
        if r["measured_s"] < (1 - noise) * r["predicted_s"]:
            f.append(
                f"below its bound: measured {r['measured_s'] * 1e3:.3g} ms < bound "
                f"{r['predicted_s'] * 1e3:.3g} ms (a ceiling too low, or data held in a cache)"
            )
    order = sorted(range(len(records)), key=lambda i: records[i][bytes_key])
    for a, b in zip(order, order[1:], strict=False):
        ra, rb = records[a], records[b]
        if rb[bytes_key] > ra[bytes_key] and rb["measured_s"] < (1 - noise) * ra["measured_s"]:
            note = (
                f"time moves against bytes: {rb[bytes_key]:.3g} B in {rb['measured_s'] * 1e3:.3g}"
                f" ms, {ra[bytes_key]:.3g} B in {ra['measured_s'] * 1e3:.3g} ms"
            )
            flags[a].append(note)
            flags[b].append(note)
    for r, f in zip(records, flags, strict=True):
        r["flagged"] = "; ".join(f) if f else None
