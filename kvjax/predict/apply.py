"""Predictions beside bounds for any model, step and chip (`calc --predict`,
`frontier --predict`): the corpus's fit of each kernel's class applied to kvjax's closed form.

A matmul kernel takes the `matmul` class, the fused attention the `attention_prefill` or
`attention_decode` class, the whole step the `step` class; the step's other kernels (norms,
RoPE, elementwise ops, unfused attention) have no published class and get no prediction (None).
Kernels inside a step carry no wave term (their tiles are not counted here).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kvjax import kernels
from kvjax.analytic.costs import StepCost, Workload
from kvjax.analytic.step import layer_kernels, layer_kinds, step_cost
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig
from kvjax.predict.bounds import special_seconds
from kvjax.predict.gemm import gemm_family
from kvjax.predict.model import Features, Fit
from kvjax.predict.plans import attention_fill, attention_stretch
from kvjax.predict.validate import corpus_fits


def kernel_class(name: str, phase: str) -> str | None:
    if name == kernels.ATTENTION:
        return "attention_prefill" if phase == "prefill" else "attention_decode"
    if (
        name in kernels.REGISTRY
        and kernels.REGISTRY[name].kind == kernels.MATMUL
        and name
        not in (
            kernels.SCORES,
            kernels.AV,
        )
    ):
        return "matmul"
    return None


def _interval(
    fit: Fit,
    flops: float,
    nbytes: float,
    peak: float,
    chip: ChipSpec,
    calls: int = 1,
    special_s: float = 0.0,
    launches: int = 1,
    fill: float = 1.0,
    dtype: str = "",
    stretch: float = 0.0,
) -> dict[str, float]:
    """`calls` launches of one kernel (its layers), each of 1/calls of the FLOPs and bytes (and of
    the exponentials' `special_s`; `fill`: a block loop's `plans.pipeline_fill`), on `chip` (its
    bandwidth, its compute family's e_c); a whole step pays the fit's fixed term once per layer
    (`launches`)."""
    x = Features(
        flops / calls,
        nbytes / calls,
        peak,
        chip.bandwidth_bytes_per_s,
        special_s=special_s / calls,
        family=gemm_family(chip, dtype),
        launches=launches,
        fill=fill,
        stretch=stretch,
    )
    p, lo, hi = fit.interval([x])
    return {
        "predicted_s": calls * float(p[0]),
        "predicted_lo_s": calls * float(lo[0]),
        "predicted_hi_s": calls * float(hi[0]),
    }


def kernel_layers(cfg: ModelConfig, chip=None) -> dict[str, int]:
    """How many layers run each per-layer kernel (attention in a hybrid's attention layers only,
    the experts in the MoE layers, the dense MLP in the others), over a decode's and a
    prefill's kernels."""
    out: dict[str, int] = {}
    for wl in (Workload("decode", 1, 64), Workload("prefill", 1, 64)):
        counts: Counter = Counter()
        for (sliding, moe, rope, kind), count in layer_kinds(cfg):
            for name in layer_kernels(cfg, wl, sliding, moe, chip, rope, kind):
                counts[name] += count
        for name, count in counts.items():
            out.setdefault(name, count)
    return out


def kernel_seconds(
    fits: dict[str, Fit],
    name: str,
    flops: float,
    nbytes: float,
    phase: str,
    layers: int,
    chip: ChipSpec,
    peak: float,
    special_s: float = 0.0,
    fill: float = 1.0,
    dtype: str = "",
    stretch: float = 0.0,
) -> float | None:
    """One kernel of a step (summed over its layers) as its class predicts it: `layers` launches
    of 1/layers of its FLOPs, bytes and exponentials' `special_s` (a per-layer kernel), with the
    fused attention's pipeline `fill` and a decode's `stretch` (`plans.attention_stretch`), no
    other wave term; None where the kernel has no class (norms, RoPE, elementwise ops, unfused
    attention)."""
    cls = kernel_class(name, phase)
    if cls not in fits or flops + nbytes <= 0:
        return None
    calls = layers if kernels.REGISTRY[name].per_layer else 1
    x = Features(
        flops / calls,
        nbytes / calls,
        peak,
        chip.bandwidth_bytes_per_s,
        special_s=special_s / calls,
        family=gemm_family(chip, dtype),
        fill=fill,
        stretch=stretch,
    )
    return calls * float(fits[cls].predict([x])[0])


def predict_step(
    placed: list[dict[str, Any]],
    cfg: ModelConfig,
    wl: Workload,
    chip: ChipSpec,
) -> dict[str, Any]:
    """Per kernel (the placed kernels of `kvjax calc`, summed over their layers: a per-layer
    kernel is predicted as one launch a layer that runs it, `kernel_layers`) and for the whole
    step as an engine runs it (`engine_step_cost`): predicted time and its 80% interval, with the
    class that predicted it."""
    fits = corpus_fits()
    phase, layers = wl.phase, kernel_layers(cfg, chip)
    peak = chip.peak(cfg.peak_dtype)
    out = []
    # the fused attention's exponentials (at the chip's special-function rate), its block loop's
    # pipeline fill and a decode's busiest core over its mean (`plans.attention_stretch`)
    exps, fill, stretch = 0.0, 1.0, 0.0
    if any(k["name"] == kernels.ATTENTION for k in placed):
        from kvjax.analytic.step import step_kernels

        fused = step_kernels(cfg, wl, chip).get(kernels.ATTENTION)
        exps = special_seconds(fused.transcendentals, chip) if fused is not None else 0.0
        if cfg.attention_kernel == "flash":
            fill, stretch = attention_fill(cfg, wl, chip), attention_stretch(cfg, wl, chip)
    for k in placed:
        cls = kernel_class(k["name"], phase)
        row = {"name": k["name"], "class": cls, "bound_s": k["bound_s"]}
        if cls in fits and k["flops"] + k["bytes"] > 0:
            calls = layers.get(k["name"], 1) if kernels.REGISTRY[k["name"]].per_layer else 1
            attn = k["name"] == kernels.ATTENTION
            row.update(
                _interval(
                    fits[cls],
                    k["flops"],
                    k["bytes"],
                    peak,
                    chip,
                    calls,
                    exps if attn else 0.0,
                    fill=fill if attn else 1.0,
                    dtype=cfg.peak_dtype,
                    stretch=stretch if attn else 0.0,
                )
            )
        else:
            row.update(predicted_s=None, predicted_lo_s=None, predicted_hi_s=None)
        out.append(row)
    engine = engine_step_cost(cfg, wl, chip)
    step = {
        "class": "step",
        **_interval(fits["step"], engine.flops, engine.bytes, peak, chip, launches=cfg.num_layers),
    }
    return {"kernels": out, "step": step, "fits": {c: f.to_dict() for c, f in fits.items()}}


def predict_step_s(
    flops: float, nbytes: float, chip: ChipSpec, dtype: str, layers: int
) -> dict[str, float]:
    """The whole step's prediction: what a compiled engine's step of `layers` layers (each
    paying the fit's fixed term once) is predicted to take."""
    return _interval(corpus_fits()["step"], flops, nbytes, chip.peak(dtype), chip, launches=layers)


def engine_step_cost(cfg: ModelConfig, wl: Workload, chip: ChipSpec) -> StepCost:
    """The step as the corpus's engines run it (fused attention, what the `step` class was
    fitted on); the step as configured where the fused form is not modelled."""
    try:
        return step_cost(cfg.replace(attention_kernel="flash"), wl, chip)
    except KvjaxError:
        return step_cost(cfg, wl, chip)
