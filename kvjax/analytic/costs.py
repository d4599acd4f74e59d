"""The closed form's vocabulary: a workload, and the FLOPs and bytes of a kernel or a step.

A workload is a phase, a batch B and a context S (letters: `kvjax.kernels`):
- prefill: T = S prompt tokens attend to themselves and fill the cache;
- decode: T = 1 new token per sequence attends to S positions (the new one included);
- extend: T = `new_tokens` per sequence appended to a cache holding S - T, each attending the
  cached positions and the new ones up to itself: a chunk of a chunked prefill, a speculative
  verify step (T = k + 1), decode's generalisation (`kvjax.analytic.serving`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvjax.errors import KvjaxError
from kvjax.model.config import DTYPE_BYTES

PHASES = ("prefill", "decode")  # what every command runs
EXTEND = "extend"  # calc, trace: T new tokens on S - T cached
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
    new_tokens: int = 0  # T of an extend step (0 for prefill and decode)

    def __post_init__(self) -> None:
        if self.phase not in (*PHASES, EXTEND):
            raise KvjaxError(
                f"phase={self.phase!r} is not supported; allowed: {', '.join((*PHASES, EXTEND))}"
            )
        T = self.new_tokens
        if isinstance(T, bool) or not isinstance(T, int):
            raise KvjaxError(f"new_tokens={T!r} must be an integer")
        if self.phase == EXTEND and not 1 <= T <= self.context:
            raise KvjaxError(
                f"new_tokens={T} must lie in 1 .. context={self.context} for phase='extend' "
                "(T new tokens on context - T cached)"
            )
        if self.phase != EXTEND and T:
            raise KvjaxError(
                f"new_tokens={T} applies to phase='extend' only (phase={self.phase!r})"
            )
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
        if self.phase == EXTEND:
            return self.new_tokens
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
            self.flops * factor,
            self.bytes * factor,
            self.transcendentals * factor,
            self.weight_bytes * factor,
            self.kv_bytes * factor,
        )

    def __add__(self, other: KernelCost) -> KernelCost:
        return KernelCost(
            self.name,
            self.flops + other.flops,
            self.bytes + other.bytes,
            self.transcendentals + other.transcendentals,
            self.weight_bytes + other.weight_bytes,
            self.kv_bytes + other.kv_bytes,
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
