"""Step-time models for the simulator's clock: what one scheduled batch (each request's new
tokens T and the context S they reach) costs on a chip. Pure Python.

`ClosedFormStepTime`: the sum of each kernel's roofline bound (`kvjax.analytic.serving`'s
convention), where a mixed batch is split as an engine runs it: the kernels whose cost does not
depend on the context (projections, MLP or experts, norms, embedding, LM head) once over the
step's M = sum T tokens, and the attention kernels (those whose cost does) per request at its own
T and S (decode, prefill from 0, or an extend of a prefill chunk).
"""

from __future__ import annotations

from functools import lru_cache

from kvjax.analytic import Workload, roofline, step_kernels
from kvjax.analytic.costs import EXTEND
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig


def workload_of(tokens: int, context: int) -> Workload:
    """One request's share of a step: T new tokens reaching S positions."""
    if tokens == 1:
        return Workload("decode", 1, context)
    if tokens == context:
        return Workload("prefill", 1, context)
    return Workload(EXTEND, 1, context, new_tokens=tokens)


class ClosedFormStepTime:
    def __init__(self, cfg: ModelConfig, chip: ChipSpec):
        if cfg.is_hybrid:
            raise KvjaxError(
                f"{cfg.name}: the closed form has no extend step for state layers, which chunked "
                "prefill needs; simulate a model without them"
            )
        self.cfg, self.chip = cfg, chip
        self.peak, self.bw = chip.peak(cfg.compute_dtype), chip.bandwidth_bytes_per_s
        # the kernels whose cost moves with the context: per request
        a, b = (
            step_kernels(cfg, Workload("decode", 1, 64)),
            step_kernels(cfg, Workload("decode", 1, 4096)),
        )
        self.per_request = {n for n in a if (a[n].flops, a[n].bytes) != (b[n].flops, b[n].bytes)}
        self._shared = lru_cache(maxsize=None)(self._shared_s)
        self._request = lru_cache(maxsize=1 << 16)(self._request_s)

    def _bound(self, kernels_, keep) -> float:
        return sum(roofline.bound_time_s(k.flops, k.bytes, self.peak, self.bw)
                   for n, k in kernels_.items() if keep(n))  # fmt: skip

    def _shared_s(self, tokens: int) -> float:
        ks = step_kernels(self.cfg, Workload("decode", tokens, 1))
        return self._bound(ks, lambda n: n not in self.per_request)

    def _request_s(self, tokens: int, context: int) -> float:
        try:
            ks = step_kernels(self.cfg, workload_of(tokens, context), self.chip)
        except KvjaxError as exc:
            raise KvjaxError(
                f"{self.cfg.name}: a step of {tokens} tokens at {context}: {exc}"
            ) from None
        return self._bound(ks, lambda n: n in self.per_request)

    def __call__(self, batch) -> float:
        m = sum(s.tokens for s in batch)
        return self._shared(m) + sum(self._request(s.tokens, s.context) for s in batch)
