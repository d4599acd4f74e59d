"""A whole step predicted from its kernels: each kernel by the corpus class that
fits its kind (`apply.kernel_seconds`: GEMMs by `matmul`, the fused attention by
`attention_prefill` or `attention_decode`), a kernel with no class (norms, RoPE, elementwise
ops) at its bound, plus one fixed time `t0` per layer (each layer's launches and the tails of
its kernels, over several chips its all-reduces' latency; the engine's host work between steps
spread over them), the only parameter fitted on whole steps. Per layer, not per step: a 70B
model's 80 layers pay it 2.5 times as often as an 8B's 32, as the published steps do.

Why beside the `step` class (t0 + max(F / (e_c P), Q / (e_b BW)) on a step's totals): every
published step but TensorRT-LLM's is a memory-bound decode, so the `step` fit that leaves
TensorRT-LLM out cannot see a compute efficiency (its prior keeps e_c = 1). Here the compute
side comes from the GEMMs and attention kernels of other groups (DeepGEMM, cuBLAS,
FlashAttention), measured where they are compute-bound.

A row over several chips (tensor parallel) adds its collectives as engines reach them
(`kvjax.predict.collectives`), as the simulator's placed steps do. Held out as everything in
`kvjax.predict`: a step row of group g is predicted with the kernel classes' fits that left g out
(where a class has g's rows) and the `t0` fitted without g; its 80% interval is nested
split-conformal (the residuals of every other group h under a t0 fitted on neither g nor h; 3
groups at least, so that a pair left out leaves one to fit). Pure numpy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvjax import kernels
from kvjax.analytic import roofline
from kvjax.analytic.costs import Workload
from kvjax.analytic.flash import attention_form
from kvjax.analytic.step import step_kernels
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec, get_chip
from kvjax.model.config import ModelConfig
from kvjax.predict import heldout
from kvjax.predict.apply import kernel_layers, kernel_seconds
from kvjax.predict.bounds import special_seconds, step_config
from kvjax.predict.collectives import tensor_parallel_link
from kvjax.predict.model import Fit, huber_loss
from kvjax.predict.plans import attention_fill, attention_stretch

_T0 = np.concatenate([[0.0], np.geomspace(1e-6, 0.1, 1001)])


@dataclass(frozen=True)
class Overhead:
    """The fixed time per layer and the 80% interval's log(measured / predicted) ends."""

    t0_s: float
    lo: float = 0.0
    hi: float = 0.0
    rows: int = 0
    groups: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def kernel_s(
    fits: dict[str, Fit],
    name: str,
    k,
    phase: str,
    layers: int,
    chip: ChipSpec,
    peak: float,
    chips: int = 1,
    fill: float = 1.0,
    dtype: str = "",
    stretch: float = 0.0,
) -> float:
    """One kernel of a step (summed over the `layers` that run it: `kernel_layers`; over `chips`
    chips as one aggregate roof) by its class, or at its bound where it has none; `fill`: the
    fused attention's pipeline fill (`plans.attention_fill`) and a decode's busiest core over
    its mean (`plans.attention_stretch`); `dtype`: its matmuls' (a GEMM's
    family, `gemm.gemm_family`)."""
    f, q = k.flops / chips, k.bytes / chips
    attn = name == kernels.ATTENTION
    special = special_seconds(k.transcendentals, chip, chips) if attn else 0
    t = kernel_seconds(
        fits,
        name,
        f,
        q,
        phase,
        layers,
        chip,
        peak,
        special,
        fill if attn else 1.0,
        dtype,
        stretch if attn else 0.0,
    )
    return t if t is not None else roofline.bound_time_s(f, q, peak, chip.bandwidth_bytes_per_s)


def kernels_s(
    fits: dict[str, Fit],
    cfg: ModelConfig,
    wl: Workload,
    chip: ChipSpec,
    chips: int = 1,
    int4: bool = False,
) -> float:
    """A whole step's kernels, each by its class (weight-only int4: half of int8's weight
    bytes, computed in bf16 as `bounds.closed_form` counts it)."""
    peak = chip.peak(cfg.peak_dtype)
    layers = kernel_layers(cfg, chip)
    ks = step_kernels(cfg, wl, chip)
    # the fused attention's pipeline fill, once a step (kernel_s applies it to that kernel only)
    fill = attention_fill(cfg, wl, chip) if kernels.ATTENTION in ks else 1.0
    stretch = attention_stretch(cfg, wl, chip) if kernels.ATTENTION in ks else 0.0
    total = 0.0
    for name, k in ks.items():
        k = scale_weights(k, 0.5) if int4 else k
        total += kernel_s(
            fits,
            name,
            k,
            attention_form(cfg, wl),
            layers.get(name, 1),
            chip,
            peak,
            chips,
            fill,
            cfg.peak_dtype,
            stretch,
        )
    return total


def scale_weights(k, scale: float):
    """A kernel whose weights take `scale` of the bytes its config's dtype gives them (weight-only
    int4: 0.5 of int8's; NVFP4: 4.5 bits, 0.5625 of fp8's)."""
    if scale == 1 or not k.weight_bytes:
        return k
    cut = k.weight_bytes * (1 - scale)
    return type(k)(
        k.name, k.flops, k.bytes - cut, k.transcendentals, k.weight_bytes - cut, k.kv_bytes
    )


def fit_t0(kernel_s_: np.ndarray, measured_s: np.ndarray, layers=None) -> float:
    """The t0 >= 0 that minimizes the Huber loss (`model.huber_loss`) of the log error of
    layers x t0 + kernels against measured (`layers` None: 1 each)."""
    n = np.ones(len(kernel_s_)) if layers is None else np.asarray(layers, float)
    pred = _T0[:, None] * n[None, :] + kernel_s_[None, :]
    err = huber_loss(np.log(pred) - np.log(measured_s)[None, :]).sum(1)
    return float(_T0[int(np.argmin(err))])


def leave_one_group_out(
    kernel_s_: Sequence[float],
    measured_s: Sequence[float],
    groups: Sequence[str],
    layers: Sequence[float] | None = None,
) -> tuple[dict[str, Overhead], Overhead, np.ndarray]:
    """Per group, the overhead (per layer: `layers`, None: 1 a row) fitted on the other groups
    with its nested interval (`heldout.leave_one_group_out`); the overhead on every group (its
    interval from every group's held-out residuals); each row's held-out log(measured /
    predicted)."""
    s, y = np.asarray(kernel_s_, float), np.asarray(measured_s, float)
    n = np.ones(len(s)) if layers is None else np.asarray(layers, float)
    g = np.asarray(groups)
    names = sorted(set(groups))
    if len(names) < 3:  # a nested interval leaves two groups out and fits on a third
        raise KvjaxError(f"leave-one-group-out needs 3 groups or more, got {names}")

    def t0_without(*left: str) -> float:
        keep = ~np.isin(g, left)
        return fit_t0(s[keep], y[keep], n[keep])

    def predict(t0: float, rows: np.ndarray) -> np.ndarray:
        return t0 * n[rows] + s[rows]

    nested = heldout.leave_one_group_out(groups, y, t0_without, predict)
    held = {
        name: Overhead(nested.alone[name], lo, hi, int((g != name).sum()), len(names) - 1)
        for name, (lo, hi) in nested.ends.items()
    }
    lo, hi = heldout.conformal_ends(nested.resid)
    return held, Overhead(fit_t0(s, y, n), lo, hi, len(y), len(names)), nested.resid


@dataclass(frozen=True)
class StepRow:
    """A published step row as predicted from its kernels: its group, the measured time, the
    kernels' sum (with its collectives), its layers, and the held-out predicted / measured."""

    group: str
    measured_s: float
    kernels_s: float
    layers: int
    ratio: float = float("nan")


@functools.cache
def corpus_steps(without: str | None = None) -> dict:
    """The committed corpus's step rows (the fastest of each shape) predicted from their
    kernels: `held` (group -> Overhead without it), `all` (Overhead on every group), and `rows`
    (`StepRow`s, each with its held-out ratio). `without`: every row of that serving
    implementation's own code left out, its kernels' and its steps' (the kernel classes fitted
    without them too)."""
    from kvjax.predict.validate import best_of_each_shape, corpus_classes, corpus_rows

    rows = corpus_rows(without)
    best = best_of_each_shape(rows)
    classes = corpus_classes(without)
    out = [
        _step_row(r, classes)
        for r, b in zip(rows, best, strict=True)
        if b and r.kernel in ("decode_step", "prefill_step")
    ]
    held, whole, resid = leave_one_group_out(
        [o.kernels_s for o in out],
        [o.measured_s for o in out],
        [o.group for o in out],
        [o.layers for o in out],
    )
    rows_out = [replace(o, ratio=float(np.exp(-e))) for o, e in zip(out, resid, strict=True)]
    return {"held": held, "all": whole, "rows": rows_out}


def _step_row(r, classes: dict) -> StepRow:
    """One step row's kernels predicted by the fits that left its group out, and its
    collectives over several chips as engines reach them (after compute)."""
    fits = kernel_fits(classes, r.group)
    cfg = step_config(r)
    wl = Workload("decode" if r.kernel == "decode_step" else "prefill", r.batch, r.context)
    chip, chips = get_chip(r.chip), r.num_chips or 1
    t = kernels_s(fits, cfg, wl, chip, chips, r.dtype == "int4")
    if chips > 1:
        t += tensor_parallel_link(cfg, chip, chips, achieved=True)(wl.tokens, wl.batch)
    return StepRow(r.group, r.measured_s, t, cfg.num_layers)


def kernel_fits(classes: dict, group: str | None) -> dict[str, Fit]:
    """The kernel classes' fits for a row of `group`: each class's fit that left the group out
    where the class has its rows, else the fit on every group."""
    return {
        cls: (v.held_fits.get(group) if group else None) or v.fit
        for cls, v in classes.items()
        if cls != "step"
    }


def step_summary() -> dict:
    """The held-out error, coverage and interval width of steps predicted from their kernels."""
    c = corpus_steps()
    rows = c["rows"]
    ends = [(c["held"][r.group].lo, c["held"][r.group].hi) for r in rows]
    e = heldout.summary(
        [r.ratio for r in rows],
        [lo <= -np.log(r.ratio) <= hi for r, (lo, hi) in zip(rows, ends, strict=True)],
        [np.exp(hi) - np.exp(lo) for lo, hi in ends],
    )
    return {
        "rows": e["rows"],
        "groups": len({r.group for r in rows}),
        "loso_median_abs_error": e["median_abs_error"],
        "loso_coverage_80": e["coverage_80"],
        "interval_80_median_width": e["interval_80_median_width"],
        "t0_s": c["all"].t0_s,
    }


def step_from_kernels(cfg: ModelConfig, wl: Workload, chip: ChipSpec) -> dict[str, float]:
    """The whole step as its kernels predict it (`kvjax.predict.steps`: each by its class, the
    fixed time per layer fitted on published steps), on fused attention where the closed form
    has it, with the held-out steps' 80% interval."""
    from kvjax.predict.validate import corpus_classes

    fits = kernel_fits(corpus_classes(), None)
    try:
        engine = cfg.replace(attention_kernel="flash")
        t = kernels_s(fits, engine, wl, chip)
    except KvjaxError:
        engine = cfg
        t = kernels_s(fits, cfg, wl, chip)
    peak, bw = chip.peak(engine.peak_dtype), chip.bandwidth_bytes_per_s
    bound = sum(
        roofline.bound_time_s(k.flops, k.bytes, peak, bw)
        for k in step_kernels(engine, wl, chip).values()
    )
    o = corpus_steps()["all"]
    p = o.t0_s * engine.num_layers + t
    return {
        "class": "kernels",
        "predicted_s": p,
        "predicted_lo_s": max(p * math.exp(o.lo), bound),  # no lower than its kernels' bounds
        "predicted_hi_s": p * math.exp(o.hi),
    }
