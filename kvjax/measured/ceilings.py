"""The roofline of the machine at hand, measured: peak matmul FLOP/s per dtype and memory
bandwidth, as a `ChipSpec` cached per device (`kvjax ceilings`)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp

from kvjax.files import write_json_atomic
from kvjax.hardware import ChipSpec
from kvjax.measured.timing import (
    TimingStats,
    available_memory_bytes,
    device_name,
    random_array,
    random_inputs,
    time_fn,
)
from kvjax.nn.layers import JNP_DTYPES, linear


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
    arrays = [random_array(k, (n,), jnp.float32) for k in random_inputs(seed, copies)]
    total = jax.jit(jnp.sum)
    best = None
    for _ in range(trials):
        stats = time_fn(total, [(a,) for a in arrays], budget_s=budget_s / trials)
        if best is None or stats.median_s < best.median_s:
            best = stats
    return n * 4 / best.median_s, best


def bandwidth_probes(nbytes: int) -> dict[str, tuple[Callable, list[tuple], float]]:
    """Memory-bound kernels over f32 arrays of `nbytes` (two copies each, rotated): name ->
    (jitted function, argument sets, bytes moved per call). `gemv` is the model's own `linear`
    at B=1, reading an (out, in) weight as the decode step's products do."""
    n = nbytes // 4
    k = random_inputs(0, 8)
    vec = [random_array(k[i], (n,)) for i in range(4)]
    cols = 4096
    rows = max(1, n // cols)
    x = random_array(k[4], (1, 1, cols))
    weights = [random_array(k[5 + i], (rows, cols)) for i in range(2)]
    return {
        "read": (jax.jit(jnp.sum), [(v,) for v in vec[:2]], 4.0 * n),
        "gemv": (jax.jit(linear), [(x, w) for w in weights], 4.0 * (rows * cols + cols + rows)),
        # written in place (donated): a fresh 512 MB output would time the OS zeroing its pages
        "copy": (_Donating(lambda a: a + 1.0, vec[2]), [()], 2 * 4.0 * n),
        "triad": (_Donating(lambda a, b: a + 2.0 * b, vec[3], vec[0]), [()], 3 * 4.0 * n),
    }


class _Donating:
    """`a = f(a, *rest)` with `a` donated, callable with no arguments (for `time_fn`)."""

    def __init__(self, f, a, *rest):
        self.f, self.a, self.rest = jax.jit(f, donate_argnums=0), a, rest

    def __call__(self):
        self.a = self.f(self.a, *self.rest)
        return self.a


def flops_probes(dtype: str, quick: bool) -> dict[str, tuple[Callable, list[tuple], float]]:
    """Compute-bound products in `dtype` (f32 accumulation): a square `jnp.dot` and the model's
    `linear` at the prefill shapes of a decoder (M tokens x D into F and back)."""
    jdt = JNP_DTYPES[dtype]
    k = random_inputs(1, 8)
    n = 512 if quick else 2048
    m, d, f = (256, 512, 1024) if quick else (1024, 2048, 5632)
    dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
    lin = jax.jit(lambda x, w: linear(x, w, out_dtype=jnp.float32))
    return {
        f"square{n}": (
            dot,
            [tuple(random_array(k[j], (n, n), jdt) for j in (i, i + 1)) for i in (0, 2)],
            2.0 * n**3,
        ),
        f"linear{m}x{d}x{f}": (
            lin,
            [
                (random_array(k[4 + i], (1, m, d), jdt), random_array(k[6 + i], (f, d), jdt))
                for i in (0, 1)
            ],
            2.0 * m * d * f,
        ),
        f"linear{m}x{f}x{d}": (
            lin,
            [(random_array(k[5], (1, m, f), jdt), random_array(k[7], (d, f), jdt))],
            2.0 * m * d * f,
        ),
    }


def best_rates(probes: dict, trials: int, budget_s: float) -> dict[str, list[float]]:
    """Rates (amount / median time) of every probe in every trial, the probes interleaved within
    each trial so that a change of the machine's mode shows in all of them alike."""
    rates: dict[str, list[float]] = {name: [] for name in probes}
    share = budget_s / max(1, trials * len(probes))
    for _ in range(trials):
        for name, (fn, arg_sets, amount) in probes.items():
            stats = time_fn(fn, arg_sets, min_runs=3, budget_s=share)
            rates[name].append(amount / stats.median_s)
    return rates


class ReadCeiling:
    """The read ceiling (best of `jnp.sum` and the model's GEMV) measured again and again during
    a run, its probes built once: `ceiling()` -> bytes/s now. A bound is taken against the best of
    these in-run measurements (the machine's mode in that run), never against another run's."""

    def __init__(self, nbytes: int = 256 * 2**20):
        probes = bandwidth_probes(nbytes)
        self.probes = {name: probes[name] for name in ("read", "gemv")}

    def __call__(self, budget_s: float = 0.4) -> float:
        return max(max(r) for r in best_rates(self.probes, 1, budget_s).values())

    @classmethod
    def beside(cls, ceilings: ChipSpec) -> ReadCeiling:
        """The in-run read ceiling of a run placed under `ceilings`: arrays of 256 MiB, or of
        the size the ceilings were measured at where smaller (quick ceilings: 32 MiB)."""
        measured = int(ceilings.extra.get("bandwidth_array_bytes", 256 * 2**20))
        return cls(min(256 * 2**20, measured))


def in_run_ceilings(ceilings: ChipSpec, bandwidths: list[float]) -> ChipSpec:
    """`ceilings` with the bandwidth measured in this run (the best of `bandwidths`): the roof
    the run's kernels are placed under; the cached value is kept in `extra`."""
    if not bandwidths:
        return ceilings
    return dataclasses.replace(
        ceilings,
        bandwidth_bytes_per_s=max(bandwidths),
        notes=f"{ceilings.notes}; bandwidth: the read ceiling measured in the run",
        extra={
            **ceilings.extra,
            "cached_bandwidth_bytes_per_s": ceilings.bandwidth_bytes_per_s,
            "in_run_bandwidths_bytes_per_s": list(bandwidths),
        },
    )


def measure_ceilings(budget_s: float = 8.0, quick: bool = False, trials: int = 3) -> ChipSpec:
    """This device's roofline as a `ChipSpec`: a ceiling is an upper bound, so each is the best
    rate of several kernels over several interleaved trials, at sizes far above the last-level
    cache, on all the cores XLA uses. Bandwidth: the best read rate, of a reduction and of the
    step's own matrix-vector product (a decode step's bytes are reads: weights and cache). The
    in-place copy and triad (STREAM's kernels) read and write at once and reach more bytes per
    second on a CPU; they are kept as `read_write_bandwidth_bytes_per_s`, the roof a kernel that
    writes as much as it reads can reach. Peak FLOP/s per dtype: the best of a square product and
    the step's own products at prefill shapes. Every trial's rate is kept in `extra` (this kind
    of machine reads memory in two modes)."""
    nbytes = (32 if quick else 512) * 2**20
    bw = best_rates(bandwidth_probes(nbytes), trials, budget_s / 2)
    peaks, flops = {}, {}
    for dtype in ("f32", "bf16"):
        flops[dtype] = best_rates(flops_probes(dtype, quick), 1 if quick else 2, budget_s / 4)
        peaks[dtype] = max(max(r) for r in flops[dtype].values())
    best_bw = {name: max(r) for name, r in bw.items()}
    return ChipSpec(
        name=f"measured {device_name()}",
        peak_flops_per_s=peaks,
        bandwidth_bytes_per_s=max(best_bw["read"], best_bw["gemv"]),
        memory_bytes=available_memory_bytes(),
        source=f"measured by kvjax on {device_name()} (jax {jax.__version__})",
        date=datetime.date.today().isoformat(),
        notes="bandwidth: best read (jnp.sum, the model's GEMV); peak: best of square and "
        f"prefill-shaped products; {trials} interleaved trials",
        extra={
            "bandwidth_bytes_per_s_by_kernel": best_bw,
            "bandwidth_trials_bytes_per_s": bw,
            "flops_trials_per_s": flops,
            "bandwidth_array_bytes": nbytes,
            "read_write_bandwidth_bytes_per_s": max(best_bw["copy"], best_bw["triad"]),
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
