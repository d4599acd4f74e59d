"""The roofline: ridge, attainable FLOP/s, bound time and side, latency floors. Pure Python.

A kernel doing W FLOPs over Q bytes has intensity I = W / Q. On a chip with peak P and bandwidth
beta it reaches at most min(P, I * beta) FLOP/s and takes at least max(W / P, Q / beta) seconds;
the two roofs meet at the ridge I* = P / beta.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from kvjax.analytic import KernelCost


def intensity(flops: float, bytes_: float) -> float:
    return flops / bytes_ if bytes_ else math.inf


def ridge(peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> float:
    return peak_flops_per_s / bandwidth_bytes_per_s


def attainable_flops_per_s(
    intensity_: float, peak_flops_per_s: float, bandwidth_bytes_per_s: float
) -> float:
    return min(peak_flops_per_s, intensity_ * bandwidth_bytes_per_s)


def fraction_of_peak(
    intensity_: float, peak_flops_per_s: float, bandwidth_bytes_per_s: float
) -> float:
    return (
        attainable_flops_per_s(intensity_, peak_flops_per_s, bandwidth_bytes_per_s)
        / peak_flops_per_s
    )


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
    name: str
    flops: float
    bytes: float
    intensity: float
    bound_s: float
    bound: str
    attainable_flops_per_s: float

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "flops": self.flops,
            "bytes": self.bytes,
            "intensity": self.intensity,
            "bound_s": self.bound_s,
            "bound": self.bound,
            "attainable_flops_per_s": self.attainable_flops_per_s,
        }


def place(
    kernels: Iterable[KernelCost], peak_flops_per_s: float, bandwidth_bytes_per_s: float
) -> list[RooflinePoint]:
    """Each kernel placed on the roofline of one chip."""
    points = []
    for k in kernels:
        i = intensity(k.flops, k.bytes)
        points.append(
            RooflinePoint(
                name=k.name,
                flops=k.flops,
                bytes=k.bytes,
                intensity=i,
                bound_s=bound_time_s(k.flops, k.bytes, peak_flops_per_s, bandwidth_bytes_per_s),
                bound=bound_side(k.flops, k.bytes, peak_flops_per_s, bandwidth_bytes_per_s),
                attainable_flops_per_s=attainable_flops_per_s(
                    i, peak_flops_per_s, bandwidth_bytes_per_s
                ),
            )
        )
    return points
