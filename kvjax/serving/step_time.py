"""Step-time models for the simulator's clock: what one scheduled batch (each request's new
tokens T and the context S they reach) costs on a chip. Pure Python.

`ClosedFormStepTime`: the sum of each kernel's roofline bound (`kvjax.analytic.serving`'s
convention), where a mixed batch is split as an engine runs it: the kernels whose cost does not
depend on the context (projections, MLP or experts, norms, embedding) once over the step's
M = sum T tokens, the LM head once over the step's requests (an engine takes logits only where
it samples, the last position of each: vLLM's `logits_indices`), and the attention kernels
(those whose cost does depend on the context) per request at its own T and S (decode, prefill
from 0, or an extend of a prefill chunk: `kvjax.analytic.flash` runs a chunk of more than
`DECODE_FORM_MAX_QUERIES` tokens as prefill's block loop over the cache). A decode's share is
planned with the step's other decodes, as one batched kernel plans them (flash-decoding's splits
fill the cores over the whole batch: a decode planned alone would split its cache B times finer,
and its partials would spill out of the L2): the cost of the step's D decodes all at its S, over D.
"""

from __future__ import annotations

from functools import lru_cache

from kvjax import kernels
from kvjax.analytic import Workload, roofline, step_kernels
from kvjax.analytic.costs import EXTEND
from kvjax.analytic.flash import attention_form
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig

LOGITS = {kernels.LM_HEAD, kernels.LOGIT_SCALE, kernels.LOGIT_SOFTCAP}  # at sampled rows only


def workload_of(tokens: int, context: int, decodes: int = 1) -> Workload:
    """One request's share of a step: T new tokens reaching S positions (a decode among the
    step's `decodes`: that many at S)."""
    if tokens == 1:
        return Workload("decode", decodes, context)
    if tokens == context:
        return Workload("prefill", 1, context)
    return Workload(EXTEND, 1, context, new_tokens=tokens)


class ClosedFormStepTime:
    def __init__(self, cfg: ModelConfig, chip: ChipSpec):
        self.cfg, self.chip = cfg, chip
        self.peak, self.bw = chip.peak(cfg.peak_dtype), chip.bandwidth_bytes_per_s
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

    def _kernel_s(self, name: str, k, phase: str, wl: Workload | None = None) -> float:
        """One kernel's time (summed over its layers) in a share of workload `wl`: its roofline
        bound."""
        return roofline.bound_time_s(k.flops, k.bytes, self.peak, self.bw)

    def _cost(self, kernels_, keep, phase: str = "decode", wl: Workload | None = None):
        """(sum of the kept kernels' times, their FLOPs, their bytes)."""
        kept = [(n, k) for n, k in kernels_.items() if keep(n)]
        return (
            sum(self._kernel_s(n, k, phase, wl) for n, k in kept),
            sum(k.flops for _, k in kept),
            sum(k.bytes for _, k in kept),
        )

    def _shared_s(self, tokens: int, rows: int) -> tuple[float, float, float]:
        """The context-free kernels over `tokens`, the LM head over `rows` sampled positions."""
        body = step_kernels(self.cfg, Workload("decode", tokens, 1), self.chip)
        head = step_kernels(self.cfg, Workload("decode", rows, 1), self.chip)
        a = self._cost(body, lambda n: n in self.shared and n not in LOGITS)
        b = self._cost(head, lambda n: n in self.shared and n in LOGITS)
        return tuple(x + y for x, y in zip(a, b, strict=True))

    def _request_s(self, tokens: int, context: int, decodes: int = 1) -> tuple[float, float, float]:
        """A request's share: T tokens at S, or a decode's 1/D of the step's D decodes at S."""
        wl = workload_of(tokens, context, decodes)
        try:
            ks = step_kernels(self.cfg, wl, self.chip)
        except KvjaxError as exc:
            raise KvjaxError(
                f"{self.cfg.name}: a step of {tokens} tokens at {context}: {exc}"
            ) from None
        n = decodes if tokens == 1 else 1
        form = attention_form(self.cfg, wl)  # the attention's kernel: prefill's or decode's
        return tuple(x / n for x in self._cost(ks, lambda name: name not in self.shared, form, wl))

    def step_cost(self, batch) -> tuple[float, float, float]:
        """The batch's (sum of kernel bounds in seconds, FLOPs, bytes), split as above."""
        d = sum(s.tokens == 1 for s in batch)
        parts = [
            self._shared(sum(s.tokens for s in batch), len(batch)),
            *(self._request(s.tokens, s.context, d if s.tokens == 1 else 1) for s in batch),
        ]
        return tuple(sum(p[i] for p in parts) for i in range(3))

    def __call__(self, batch) -> float:
        return self.step_cost(batch)[0]

    def decode_steps(self, contexts, steps: int):
        """The times of `steps` steps in a row in which the same requests, at `contexts` before
        the first, each decode one token (step k: context + k): the simulator's fast path. Each
        step's parts are summed in `step_cost`'s order (sequentially, from 0), so every time is
        the one `__call__` gives that step's batch, to the last bit."""
        import numpy as np

        n, c = len(contexts), np.asarray(contexts, dtype=np.int64)
        need, at = np.unique(c[:, None] + np.arange(1, steps + 1)[None, :], return_inverse=True)
        per_s = np.array([self._request(1, int(s), n) for s in need])  # (contexts, 3)
        parts = np.concatenate(
            [np.broadcast_to(self._shared(n, n), (1, steps, 3)), per_s[at.reshape(n, steps)]],
            axis=0,
        )
        t, flops, nbytes = np.cumsum(parts, axis=0)[-1].T
        return self._times(t, flops, nbytes)

    def _times(self, t, flops, nbytes):
        return t


class PredictedStepTime(ClosedFormStepTime):
    """What a compiled engine's step is predicted to take (`kvjax.predict`): the corpus's `step`
    class, fitted on published engine steps, t = L t0 + max(F / (e_c P), Q / (e_b BW)) (t0 paid
    once by each of the model's L layers) over the
    step's FLOPs F and bytes Q as `ClosedFormStepTime` splits a mixed batch, on the step as
    those engines run it: fused attention, and a request's share as configured where the closed
    form has no fused form for it (as `kvjax.predict.apply.engine_step_cost`). For a batch of
    decodes, `frontier --predict`'s step prediction."""

    def __init__(self, cfg: ModelConfig, chip: ChipSpec, fit=None):
        from kvjax.predict.validate import corpus_fits

        self.configured = cfg
        fused = cfg.replace(attention_kernel="flash")
        try:
            step_kernels(fused, workload_of(1, 64), chip)
        except KvjaxError:
            fused = cfg
        super().__init__(fused, chip)
        self.fused = fused.attention_kernel == "flash"
        self._unfused: ClosedFormStepTime | None = None
        self.fit = fit or corpus_fits()["step"]  # `fit`: one that left a source group out

    def _request_s(self, tokens: int, context: int, decodes: int = 1) -> tuple[float, float, float]:
        try:
            return super()._request_s(tokens, context, decodes)
        except KvjaxError:
            if not self.fused:
                raise
        # no fused form for this share: as configured (a refusal there is named as above)
        if self._unfused is None:
            self._unfused = ClosedFormStepTime(self.configured, self.chip)
            self._unfused.shared = self.shared
        return self._unfused._request_s(tokens, context, decodes)

    def __call__(self, batch) -> float:
        _, flops, nbytes = self.step_cost(batch)
        f = self.fit
        return f.t0_s * self.cfg.num_layers + max(
            flops / (f.compute_efficiency * self.peak), nbytes / (f.bandwidth_efficiency * self.bw)
        )

    def _times(self, t, flops, nbytes):
        import numpy as np

        f = self.fit
        return f.t0_s * self.cfg.num_layers + np.maximum(
            flops / (f.compute_efficiency * self.peak), nbytes / (f.bandwidth_efficiency * self.bw)
        )


class KernelStepTime(PredictedStepTime):
    """A step predicted from its kernels (`kvjax.predict.steps`): each kernel of the batch, split
    as `ClosedFormStepTime` splits it, by its corpus class (GEMMs by `matmul`, the fused
    attention by `attention_prefill` or `attention_decode` in the form it runs), a kernel with
    no class at its bound, plus the fixed time per layer fitted on published engine steps.
    `fits` and `overhead`: ones that left a source group out (default: every group's);
    `weight_scale`: the weights' bytes against the config's dtype (NVFP4 on an fp8 config)."""

    def __init__(
        self, cfg: ModelConfig, chip: ChipSpec, fits=None, overhead=None, weight_scale: float = 1.0
    ):
        from kvjax.predict import steps
        from kvjax.predict.validate import corpus_classes

        super().__init__(cfg, chip)
        self.fits = fits or steps.kernel_fits(corpus_classes(), None)
        self.overhead = overhead or steps.corpus_steps()["all"]
        self.weight_scale = weight_scale
        self.layers = steps.kernel_layers(self.cfg, chip)  # the layers that run each kernel

    def _kernel_s(self, name: str, k, phase: str, wl: Workload | None = None) -> float:
        from kvjax.predict.plans import attention_fill, attention_stretch
        from kvjax.predict.steps import kernel_s, scale_weights

        k = scale_weights(k, self.weight_scale)
        attn = name == kernels.ATTENTION and wl is not None
        fill = attention_fill(self.cfg, wl, self.chip) if attn else 1.0
        stretch = attention_stretch(self.cfg, wl, self.chip) if attn else 0.0
        return kernel_s(
            self.fits,
            name,
            k,
            phase,
            self.layers.get(name, 1),
            self.chip,
            self.peak,
            fill=fill,
            dtype=self.cfg.peak_dtype,
            stretch=stretch,
        )

    def __call__(self, batch) -> float:
        return self.overhead.t0_s * self.cfg.num_layers + self.step_cost(batch)[0]

    def _times(self, t, flops, nbytes):
        return self.overhead.t0_s * self.cfg.num_layers + t


class PlacedStepTime:
    """A step on `tp` chips in tensor parallel: one device's shard of it (`inner`, a step-time
    model of `parallel.device_config(cfg, tp)`), then the step's collectives over the link, run
    after it (the serial schedule, as the sum of kernel bounds runs kernels one after another):
    2 L + 1 ring all-reduces of the step's M x D activations and the all-gather of the sampled
    rows' f32 logits, bytes per device over the chip's interconnect. `achieved`: each collective
    as engines reach it (`kvjax.predict.collectives`: NCCL's bus bandwidth and the custom
    all-reduce's latency, sourced per chip) for a predicted step; else the line rate."""

    def __init__(self, inner, cfg: ModelConfig, chip: ChipSpec, tp: int, achieved: bool = False):
        from kvjax.predict.collectives import tensor_parallel_link

        self.inner, self.tp = inner, tp
        self._link = tensor_parallel_link(cfg, chip, tp, achieved)  # refuses a chip without one

    def link_s(self, tokens: int, rows: int) -> float:
        return self._link(tokens, rows)

    def __call__(self, batch) -> float:
        return self.inner(batch) + self.link_s(sum(s.tokens for s in batch), len(batch))

    def decode_steps(self, contexts, steps: int):
        n = len(contexts)
        return self.inner.decode_steps(contexts, steps) + self.link_s(n, n)


# `kvjax simulate --step-time`'s models of a chip's step (`fitted`, the engine's, is apart)
STEP_MODELS = {
    "bound": ClosedFormStepTime,
    "predicted": PredictedStepTime,
    "kernels": KernelStepTime,
}
