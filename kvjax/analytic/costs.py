"""The closed form's vocabulary: a workload, and the FLOPs and bytes of a kernel or a step.

A workload is a phase, a batch B and a context S (letters: `kvjax.kernels`):
- prefill: T = S prompt tokens attend to themselves and fill the cache;
- decode: T = 1 new token per sequence attends to S positions (the new one included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from kvjax.config import DTYPE_BYTES
from kvjax.errors import KvjaxError

PHASES = ("prefill", "decode")
SCORE_BYTES = DTYPE_BYTES[
    "f32"
]  # scores and logits are kept in f32; probabilities in compute dtype
INDEX_BYTES = 4  # int32 token ids


@dataclass(frozen=True)
class Workload:
    """`experts_touched`: MoE experts read per MoE layer by this step (None: the expectation under
    uniform routing, `kvjax.analytic.moe`; kvjax's model reads M*k, the trace's count)."""

    phase: str
    batch: int
    context: int
    experts_touched: float | None = None

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise KvjaxError(f"phase={self.phase!r} is not supported; allowed: {', '.join(PHASES)}")
        for field in ("batch", "context"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise KvjaxError(f"{field}={value!r} must be a positive integer (> 0)")
        touched = self.experts_touched
        if touched is not None and (
            isinstance(touched, bool) or not isinstance(touched, int | float) or not touched > 0
        ):
            raise KvjaxError(f"experts_touched={touched!r} must be a positive number (or None)")

    @property
    def query_len(self) -> int:
        """T: tokens per sequence processed by this step."""
        return self.context if self.phase == "prefill" else 1

    @property
    def tokens(self) -> int:
        """M = B * T."""
        return self.batch * self.query_len


@dataclass(frozen=True)
class KernelCost:
    """FLOPs and bytes of one kernel; `weight_bytes` and `kv_bytes` are parts of `bytes`."""

    name: str
    flops: float
    bytes: float
    transcendentals: float = 0.0
    weight_bytes: float = 0.0
    kv_bytes: float = 0.0

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf

    def scaled(self, factor: int) -> KernelCost:
        return KernelCost(
            self.name,
            *(getattr(self, f.name) * factor for f in fields(self) if f.name != "name"),
        )

    def __add__(self, other: KernelCost) -> KernelCost:
        return KernelCost(
            self.name,
            *(
                getattr(self, f.name) + getattr(other, f.name)
                for f in fields(self)
                if f.name != "name"
            ),
        )


@dataclass(frozen=True)
class StepCost:
    flops: float
    bytes: float
    transcendentals: float
    weight_bytes: float
    kv_bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @classmethod
    def total(cls, kernels) -> StepCost:
        """The sum of the kernels' costs."""
        kernels = list(kernels)
        return cls(
            flops=sum(k.flops for k in kernels),
            bytes=sum(k.bytes for k in kernels),
            transcendentals=sum(k.transcendentals for k in kernels),
            weight_bytes=sum(k.weight_bytes for k in kernels),
            kv_bytes=sum(k.kv_bytes for k in kernels),
        )
