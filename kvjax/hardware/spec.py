"""What a chip is: peak FLOP/s per dtype (dense), memory bandwidth and capacity, the link, the
on-chip memory and cores a fused kernel tiles for, with the source of each number.

Rates are decimal (1 TB/s = 1e12 B/s) as the vendors state them; capacities are the vendors'
decimal GB. A chip measured on the machine at hand (`kvjax.measured.ceilings`) is a `ChipSpec`
too, and so is one given by numbers (`chip_from_numbers`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from kvjax.dtypes import canonical_dtype
from kvjax.errors import KvjaxError

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class ChipSpec:
    """One accelerator (or a CPU, when measured). `peak_flops_per_s` is keyed by dtype name."""

    name: str
    peak_flops_per_s: dict[str, float]
    bandwidth_bytes_per_s: float
    memory_bytes: float | None = None
    source: str = ""
    date: str = ""
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # Chip-to-chip bandwidth per direction (decimal bytes/s), for tensor-parallel collectives.
    interconnect_bytes_per_s: float | None = None
    # On-chip memory a fused kernel tiles into, per core (a GPU's shared memory per SM, a TPU's
    # VMEM per TensorCore), and the cores: `kvjax.analytic.flash` sizes its blocks and splits.
    onchip_bytes_per_core: float | None = None
    num_cores: int | None = None
    # The last-level cache between the cores and HBM (a GPU's L2), in bytes: what fused
    # attention's K/V re-reads are served from (`kvjax.analytic.flash.hbm_kv_positions`).
    l2_bytes: float | None = None
    # The board's rated power (the datasheet's maximum thermal design power, W): what the
    # serving clocks charge a chip per second held (`kvjax.serving.cost`); None: not published.
    power_watts: float | None = None
    special_function_ops_per_s: float | None = None  # exp2/s: the model's softmax, not the bound

    def __post_init__(self) -> None:
        if not self.peak_flops_per_s:
            raise KvjaxError(f"chip {self.name!r}: peak_flops_per_s needs at least one dtype")
        canonical = {}
        for dtype, value in self.peak_flops_per_s.items():
            _check_positive(f"chip {self.name!r}: peak_flops_per_s[{dtype!r}]", value)
            canonical[canonical_dtype(dtype, "peak_flops_per_s dtype", compute=True)] = float(value)
        object.__setattr__(self, "peak_flops_per_s", canonical)
        _check_positive(f"chip {self.name!r}: bandwidth_bytes_per_s", self.bandwidth_bytes_per_s)
        if self.memory_bytes is not None:
            _check_positive(f"chip {self.name!r}: memory_bytes", self.memory_bytes)
        if self.l2_bytes is not None:
            _check_positive(f"chip {self.name!r}: l2_bytes", self.l2_bytes)
        if self.power_watts is not None:
            _check_positive(f"chip {self.name!r}: power_watts", self.power_watts)
        if (sfu := self.special_function_ops_per_s) is not None:
            _check_positive(f"chip {self.name!r}: special_function_ops_per_s", sfu)
        if self.interconnect_bytes_per_s is not None:
            _check_positive(
                f"chip {self.name!r}: interconnect_bytes_per_s", self.interconnect_bytes_per_s
            )

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for matrix work in `dtype`."""
        key = canonical_dtype(dtype, compute=True)
        if key not in self.peak_flops_per_s:
            raise KvjaxError(
                f"chip {self.name!r} has no peak FLOP/s for dtype={dtype!r}; "
                f"known: {', '.join(self.peak_flops_per_s)}"
            )
        return self.peak_flops_per_s[key]

    def ridge(self, dtype: str) -> float:
        """I* = peak / bandwidth, in FLOPs per byte."""
        return self.peak(dtype) / self.bandwidth_bytes_per_s

    def with_overrides(
        self,
        peak_flops_per_s: float | None = None,
        bandwidth_bytes_per_s: float | None = None,
        memory_bytes: float | None = None,
        dtype: str = "bf16",
    ) -> ChipSpec:
        """Replace numbers (as the CLI's --peak-flops / --bandwidth do); the name records it."""
        peaks = dict(self.peak_flops_per_s)
        changed = []
        if peak_flops_per_s is not None:
            peaks[canonical_dtype(dtype, compute=True)] = peak_flops_per_s
            changed.append("peak")
        spec = dataclasses.replace(
            self,
            peak_flops_per_s=peaks,
            bandwidth_bytes_per_s=bandwidth_bytes_per_s or self.bandwidth_bytes_per_s,
            memory_bytes=memory_bytes if memory_bytes is not None else self.memory_bytes,
        )
        if bandwidth_bytes_per_s is not None:
            changed.append("bandwidth")
        if memory_bytes is not None:
            changed.append("memory")
        if changed:
            spec = dataclasses.replace(spec, name=f"{self.name} ({', '.join(changed)} overridden)")
        return spec

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_positive(what: str, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise KvjaxError(f"{what}={value!r} must be a positive number")


def chip_from_numbers(
    peak_flops_per_s: float,
    bandwidth_bytes_per_s: float,
    memory_bytes: float | None = None,
    dtype: str = "bf16",
    name: str = "custom",
) -> ChipSpec:
    """A chip given by numbers alone."""
    return ChipSpec(
        name=name,
        peak_flops_per_s={dtype: peak_flops_per_s},
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        memory_bytes=memory_bytes,
        source="given on the command line",
    )
