"""The roofline: ridge, attainable FLOP/s, bound time and side, latency floors. Pure Python.

A kernel doing W FLOPs over Q bytes has intensity I = W / Q. On a chip with peak P and bandwidth
beta it reaches at most min(P, I * beta) FLOP/s and takes at least max(W / P, Q / beta) seconds;
the two roofs meet at the ridge I* = P / beta.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from kvjax.analytic.costs import KernelCost


def intensity(flops: float, bytes_: float) -> float:
    return flops / bytes_ if bytes_ else math.inf


def ridge(peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> float:
    return peak_flops_per_s / bandwidth_bytes_per_s


def attainable_flops_per_s(
    intensity_: float, peak_flops_per_s: float, bandwidth_bytes_per_s: float
) -> float:
    return min(peak_flops_per_s, intensity_ * bandwidth_bytes_per_s)


def bound_time_s(
    flops: float, bytes_: float, peak_flops_per_s: float, bandwidth_bytes_per_s: float
) -> float:
    return max(flops / peak_flops_per_s, bytes_ / bandwidth_bytes_per_s)


def bound_side(
    flops: float, bytes_: float, peak_flops_per_s: float, bandwidth_bytes_per_s: float
) -> str:
    """'compute' when FLOPs take longer than bytes (I >= ridge), else 'memory'."""
    return "compute" if flops / peak_flops_per_s >= bytes_ / bandwidth_bytes_per_s else "memory"


def memory_floor_s(bytes_: float, bandwidth_bytes_per_s: float) -> float:
    """The seed's latency floor t_min = bytes / bandwidth (2N / beta for bf16 weights alone)."""
    return bytes_ / bandwidth_bytes_per_s


@dataclass(frozen=True)
class RooflinePoint:
    """A kernel (or a step) on one chip's roofline: every view places its numbers with `point`."""

    name: str
    flops: float
    bytes: float
    intensity: float
    bound_s: float
    bound: str  # "memory" or "compute"
    attainable_flops_per_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def point(
    name: str, flops: float, bytes_: float, peak_flops_per_s: float, bandwidth_bytes_per_s: float
) -> RooflinePoint:
    """FLOPs and bytes placed on the roofline of a chip with this peak and bandwidth."""
    i = intensity(flops, bytes_)
    return RooflinePoint(
        name=name,
        flops=flops,
        bytes=bytes_,
        intensity=i,
        bound_s=bound_time_s(flops, bytes_, peak_flops_per_s, bandwidth_bytes_per_s),
        bound=bound_side(flops, bytes_, peak_flops_per_s, bandwidth_bytes_per_s),
        attainable_flops_per_s=attainable_flops_per_s(i, peak_flops_per_s, bandwidth_bytes_per_s),
    )


def place(
    kernels: Iterable[KernelCost], peak_flops_per_s: float, bandwidth_bytes_per_s: float
) -> list[RooflinePoint]:
    """Each kernel placed on the roofline of one chip."""
    return [
        point(k.name, k.flops, k.bytes, peak_flops_per_s, bandwidth_bytes_per_s) for k in kernels
    ]
