"""Step-time models for the simulator's clock: what one scheduled batch (each request's new
tokens T and the context S they reach) costs on a chip. Pure Python.

`ClosedFormStepTime`: the sum of each kernel's roofline bound (`kvjax.analytic.serving`'s
convention), where a mixed batch is split as an engine runs it: the kernels whose cost does not
depend on the context (projections, MLP or experts, norms, embedding) once over the step's
M = sum T tokens, the LM head once over the step's requests (an engine takes logits only where
it samples, the last position of each: vLLM's `logits_indices`), and the attention kernels
(those whose cost does depend on the context) per request at its own T and S (decode, prefill
from 0, or an extend of a prefill chunk: `kvjax.analytic.flash` runs a chunk of more than
`DECODE_FORM_MAX_QUERIES` tokens as prefill's block loop over the cache).
"""

from __future__ import annotations

from functools import lru_cache

from kvjax import kernels
from kvjax.analytic import Workload, roofline, step_kernels
from kvjax.analytic.costs import EXTEND
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig

LOGITS = {kernels.LM_HEAD, kernels.LOGIT_SCALE, kernels.LOGIT_SOFTCAP}  # at sampled rows only


def workload_of(tokens: int, context: int) -> Workload:
    """One request's share of a step: T new tokens reaching S positions."""
    if tokens == 1:
        return Workload("decode", 1, context)
    if tokens == context:
        return Workload("prefill", 1, context)
    return Workload(EXTEND, 1, context, new_tokens=tokens)


class ClosedFormStepTime:
    def __init__(self, cfg: ModelConfig, chip: ChipSpec):
        self.cfg, self.chip = cfg, chip
        self.peak, self.bw = chip.peak(cfg.compute_dtype), chip.bandwidth_bytes_per_s
        # shared: a decode's kernels whose cost does not move with the context; every other
        # kernel (attention, flash-decoding's combine, MLA's expansion of the cached latents in
        # an extend, a state layer's mixer: its scan differs in prefill and decode) is the
        # request's own
        a, b = (step_kernels(cfg, Workload("decode", 1, s), chip) for s in (64, 4096))
        self.shared = {
            n for n in a if n in b and (a[n].flops, a[n].bytes) == (b[n].flops, b[n].bytes)
        }
        if cfg.is_hybrid:
            from kvjax.analytic.hybrid import mixer_kernels

            for kind in set(cfg.layer_kinds) - {"A"}:
                self.shared -= {k.name for k in mixer_kernels(cfg, Workload("decode", 1, 64), kind)}
        self._shared = lru_cache(maxsize=None)(self._shared_s)
        self._request = lru_cache(maxsize=1 << 16)(self._request_s)

    def _bound(self, kernels_, keep) -> float:
        return sum(roofline.bound_time_s(k.flops, k.bytes, self.peak, self.bw)
                   for n, k in kernels_.items() if keep(n))  # fmt: skip

    def _shared_s(self, tokens: int, rows: int) -> float:
        """The context-free kernels over `tokens`, the LM head over `rows` sampled positions."""
        body = step_kernels(self.cfg, Workload("decode", tokens, 1), self.chip)
        head = step_kernels(self.cfg, Workload("decode", rows, 1), self.chip)
        return self._bound(body, lambda n: n in self.shared and n not in LOGITS) + self._bound(
            head, lambda n: n in self.shared and n in LOGITS
        )

    def _request_s(self, tokens: int, context: int) -> float:
        try:
            ks = step_kernels(self.cfg, workload_of(tokens, context), self.chip)
        except KvjaxError as exc:
            raise KvjaxError(
                f"{self.cfg.name}: a step of {tokens} tokens at {context}: {exc}"
            ) from None
        return self._bound(ks, lambda n: n not in self.shared)

    def __call__(self, batch) -> float:
        m = sum(s.tokens for s in batch)
        return self._shared(m, len(batch)) + sum(self._request(s.tokens, s.context) for s in batch)
