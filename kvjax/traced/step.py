"""The traced view: XLA's cost analysis of the real Flax model, per kernel, beside the closed form.

The model is built from abstract shapes (no weights allocated) and one step is lowered:
- decode at context S: one new token per sequence attends S positions, S - 1 of them read from
  the cache (made with max_len = S - 1) and its own; the step includes the cache append;
- prefill at context S: T = S prompt tokens into a cache with one free row (max_len = S + 1, so
  the write is a real update; a cache of exactly S rows would be replaced, not written);
- extend at context S with T new tokens: a cache of max_len = S holding S - T, the T rows written
  at their positions, then the T queries attend it.

Stages (DESIGN.md): "lowered" is the pre-optimization module (dot FLOPs are exactly 2MNK, bytes are
every unfused op's inputs + outputs) and is attributed per kernel through the `jax.named_scope`
names in its HLO text; "compiled" is after fusion on the backend and is reported as step totals
only (fusions lose the names), never mixed with the lowered figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from kvjax import analytic, kernels
from kvjax.analytic import Workload
from kvjax.analytic.moe import model_workload
from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig
from kvjax.traced.by_kind import check_layers, config_of_kinds, kind_of, layer_kinds
from kvjax.traced.hlo import Cost, attribute

STAGES = ("lowered", "compiled")


@dataclass(frozen=True)
class KernelTrace:
    layer: int | None
    kernel: str
    flops: float
    bytes: float
    transcendentals: float
    stage: str
    backend: str


@dataclass
class StepTrace:
    cfg: ModelConfig
    workload: Workload
    stage: str
    backend: str
    kernels: list[KernelTrace]  # per (layer, kernel); kernels.OTHER is glue outside every kernel
    total: Cost  # the sum of `kernels` (lowered) or XLA's compiled figure
    xla: dict[str, float]  # XLA's own whole-module cost_analysis of the traced module
    layers_traced: int
    trace_seconds: float
    roofline: dict[str, float] | None = None  # jax.experimental.roofline's opinion
    notes: list[str] = field(default_factory=list)

    def by_kernel(self) -> dict[str, Cost]:
        """Kernels summed over layers, in the closed form's order, then "other"."""
        out: dict[str, Cost] = {}
        for k in self.kernels:
            out.setdefault(k.kernel, Cost())
            out[k.kernel] += Cost(k.flops, k.transcendentals, k.bytes)
        return out


def cache_len(phase: str, context: int) -> int:
    """The cache rows of a traced step at `context` (see the module docstring)."""
    if phase == "extend":
        return context
    return context - 1 if phase == "decode" else context + 1


def step_fn(
    cfg: ModelConfig, phase: str, batch: int, context: int, model=None, new_tokens: int = 0
):
    """(function, abstract args) of one step of the abstract model (or of `model`, an abstract
    model already prepared, e.g. for sharding)."""
    from kvjax.nn import abstract_model

    if model is None:
        model = abstract_model(cfg)
    graphdef, state = nnx.split(model)
    if phase == "decode":
        if context < 2:
            raise KvjaxError(
                f"context={context}: a traced decode step needs context >= 2 (the new token "
                f"plus at least one cached position)"
            )
        cache = jax.eval_shape(lambda: model.init_cache(batch, cache_len(phase, context)))
        tokens = jax.ShapeDtypeStruct((batch,), jnp.int32)

        def step(state, tokens, cache):
            return nnx.merge(graphdef, state).decode(tokens, cache)

    elif phase == "extend":
        Workload(phase, batch, context, new_tokens=new_tokens)  # validates T against S
        cache = jax.eval_shape(lambda: model.init_cache(batch, cache_len(phase, context)))
        tokens = jax.ShapeDtypeStruct((batch, new_tokens), jnp.int32)

        def step(state, tokens, cache):
            return nnx.merge(graphdef, state).extend(tokens, cache)

    else:
        cache = jax.eval_shape(lambda: model.init_cache(batch, cache_len(phase, context)))
        tokens = jax.ShapeDtypeStruct((batch, context), jnp.int32)

        def step(state, tokens, cache):
            return nnx.merge(graphdef, state).prefill(tokens, cache)

    return step, (state, tokens, cache)


def lower_for_cost(fn: Callable, args: tuple) -> Any:
    """`jax.jit(fn).lower(*args)`, re-lowered for the CPU platform when the default backend's
    lowered module has no cost analysis (some PJRT plugins raise NotImplementedError); the
    pre-optimization numbers do not depend on the platform."""
    lowered = jax.jit(fn).lower(*args)
    try:
        lowered.cost_analysis()
        return lowered
    except NotImplementedError:
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))


def _kernel_names(cfg: ModelConfig, wl: Workload) -> tuple[str, ...]:
    return tuple(analytic.step_kernels(cfg, wl).keys())


def _roofline_opinion(fn: Callable, args: tuple) -> dict[str, float] | None:
    """jax.experimental.roofline's step totals, where it runs (its API is experimental)."""
    try:
        from jax.experimental import roofline as jr

        _, result = jr.roofline(fn)(*args)
    except Exception as exc:  # an experimental API: any failure means "no opinion"
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return {
        "flops": float(result.unfused_flops),
        "fused_flops": float(result.flops),
        "unfused_hbm_bytes": float(result.unfused_hbm_bytes),
        "hbm_bytes": float(result.hbm_bytes),
    }


def as_the_model_runs(cfg: ModelConfig) -> tuple[ModelConfig, list[str]]:
    """The config kvjax's model runs, and a note when it differs: MXFP4 experts (gpt-oss) are
    closed form only, the model holds them dequantized, so a trace and the closed form it is
    compared with both take the weight dtype."""
    if not cfg.expert_weight_dtype:
        return cfg, []
    note = (
        f"experts traced in {cfg.weight_dtype}, as kvjax's model runs them "
        f"({cfg.expert_weight_dtype} experts are sized by the closed form only: kvjax calc)"
    )
    return cfg.replace(expert_weight_dtype=""), [note]


def trace_step(
    cfg: ModelConfig,
    phase: str,
    batch: int,
    context: int,
    *,
    stage: str = "lowered",
    layers: str = "all",
    roofline: bool = False,
    new_tokens: int = 0,
) -> StepTrace:
    """One step traced from abstract shapes: per-kernel records and the step total.

    `layers="one"` traces a model of one layer of each kind (`kvjax.traced.by_kind`) and counts
    each traced layer kernel for every layer of its kind (tests check this equals the full
    unrolled trace).
    """
    cfg, notes = as_the_model_runs(cfg)
    # kvjax's model gathers every MoE token's k experts: compared at M*k expert reads
    wl = model_workload(cfg, Workload(phase, batch, context, new_tokens=new_tokens))
    _check_stage(stage, layers)
    t0 = time.perf_counter()
    traced_cfg = config_of_kinds(cfg, layer_kinds(cfg)) if layers == "one" else cfg
    fn, args = step_fn(traced_cfg, phase, batch, context, new_tokens=new_tokens)
    lowered = lower_for_cost(fn, args)
    backend = jax.default_backend()
    if stage == "compiled":
        xla = dict(lowered.compile().cost_analysis() or {})
        total = Cost(
            xla.get("flops", 0.0), xla.get("transcendentals", 0.0), xla.get("bytes accessed", 0.0)
        )
        notes.append(f"compiled on {backend}: totals after fusion, not attributable per kernel")
        traced: list[KernelTrace] = []
    else:
        traced, total, xla = _lowered_kernels(cfg, wl, lowered, layers, backend, notes)
    result = StepTrace(
        cfg=cfg,
        workload=wl,
        stage=stage,
        backend=backend,
        kernels=traced,
        total=total,
        xla=xla,
        layers_traced=traced_cfg.num_layers,
        trace_seconds=0.0,
        notes=notes,
    )
    if roofline:
        opinion = _roofline_opinion(fn, args)
        if opinion and layers == "one" and "error" not in opinion:
            opinion["note"] = "one layer traced: roofline totals are for the one-layer module"
        result.roofline = opinion
    result.trace_seconds = time.perf_counter() - t0
    return result


def _check_stage(stage: str, layers: str) -> None:
    """A known stage and layers option; the compiled stage traces every layer."""
    if stage not in STAGES:
        raise KvjaxError(f"stage={stage!r} is not supported; allowed: {', '.join(STAGES)}")
    check_layers(layers)
    if stage == "compiled" and layers == "one":
        raise KvjaxError("stage='compiled' traces every layer; use layers='all'")


def _lowered_kernels(
    cfg: ModelConfig, wl: Workload, lowered, layers: str, backend: str, notes: list[str]
) -> tuple[list[KernelTrace], Cost, dict[str, float]]:
    """The lowered module's records per (layer, kernel), its total and XLA's own figure, the
    attribution checked against that figure; a note on the fused attention joins `notes`."""
    xla = dict(lowered.cost_analysis() or {})
    text = lowered.as_text(dialect="hlo", debug_info=True)
    per_kernel, total = attribute(text, _kernel_names(cfg, wl))
    kinds = layer_kinds(cfg)
    traced = []
    for (layer, name), c in per_kernel.items():
        layer_ids = [layer]
        if layer is not None and layers == "one":  # every layer of the traced layer's kind
            layer_ids = [i for i in range(cfg.num_layers) if kind_of(cfg, i) == kinds[layer]]
        for lid in layer_ids:
            traced.append(
                KernelTrace(lid, name, c.flops, c.bytes, c.transcendentals, "lowered", backend)
            )
    if layers == "one":
        total = Cost()
        for k in traced:
            total += Cost(k.flops, k.transcendentals, k.bytes)
    fused_note = flash_trace_note(cfg, wl.phase, backend)
    if fused_note:
        notes.append(fused_note)
    if not (fused_note and fused_note.startswith("interpreted")):  # an interpreter is no cost
        # XLA counts a loop once through; kvjax times its trip count (`traced.hlo`)
        once = attribute(text, _kernel_names(cfg, wl), False)[0] if " while(" in text else None
        _check_attribution(once or per_kernel, xla)
    return traced, total, xla


def flash_trace_note(cfg: ModelConfig, phase: str, backend: str) -> str | None:
    """What the fused attention's traced row is on this host, when it is not the kernel's cost:
    a Pallas kernel lowered for the CPU runs in interpret mode (the module holds the
    interpreter's loop, not the kernel), and XLA's `dot_product_attention` on a CPU is the
    unfused composite (the scores through memory)."""
    if cfg.attention_kernel != "flash" or backend != "cpu":
        return None
    from kvjax.nn import flash

    target = "compile it for an accelerator (`kvjax trace --target h100`) for the kernel's cost"
    if phase != "prefill" or flash.prefill_impl()[0] == "pallas":
        return (
            f"interpreted on {backend}: the attention's Pallas kernel runs in interpret mode, "
            f"so its traced row is the interpreter's loop, not a cost (the module's total is "
            f"not checked against the kernels' sum); {target}"
        )
    return (
        f"unfused on {backend}: the attention's jax.nn.dot_product_attention is XLA's "
        f"composite here (the T x S scores through memory), not the fused kernel the closed "
        f"form counts; {target}"
    )


def _check_attribution(per_kernel: dict, xla: dict[str, float]) -> None:
    """The per-kernel sum must equal XLA's whole-module figure (same module, same stage)."""
    total = Cost()
    for c in per_kernel.values():
        total += c
    for ours, key in ((total.flops, "flops"), (total.bytes, "bytes accessed")):
        theirs = xla.get(key)
        # XLA sums its properties in single precision: large modules drift by ~1e-6 relative.
        if theirs is not None and abs(ours - theirs) > 1e-4 * max(1.0, theirs):
            raise AssertionError(
                f"per-kernel {key} sum {ours:.6g} != XLA's module figure {theirs:.6g}: "
                "an HLO cost rule in kvjax/traced/hlo.py drifted from XLA's"
            )


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelComparison:
    name: str
    closed_flops: float
    traced_flops: float
    closed_bytes: float
    traced_bytes: float
    closed_transcendentals: float
    traced_transcendentals: float
    explanation: str | None

    @property
    def flops_ratio(self) -> float:
        return self.traced_flops / self.closed_flops if self.closed_flops else float("nan")

    @property
    def bytes_ratio(self) -> float:
        return self.traced_bytes / self.closed_bytes if self.closed_bytes else float("nan")


def compare(trace: StepTrace) -> list[KernelComparison]:
    """Traced vs closed form per kernel (summed over layers), plus the traced-only glue."""
    if trace.stage != "lowered":
        raise KvjaxError("per-kernel comparison needs stage='lowered'")
    closed = analytic.step_kernels(trace.cfg, trace.workload)
    traced = trace.by_kernel()
    fused_note = flash_trace_note(trace.cfg, trace.workload.phase, trace.backend)
    rows = []
    for name in list(closed) + [n for n in traced if n not in closed]:
        c = closed.get(name)
        t = traced.get(name, Cost())
        rows.append(
            KernelComparison(
                name=name,
                closed_flops=c.flops if c else 0.0,
                traced_flops=t.flops,
                closed_bytes=c.bytes if c else 0.0,
                traced_bytes=t.bytes,
                closed_transcendentals=c.transcendentals if c else 0.0,
                traced_transcendentals=t.transcendentals,
                explanation=fused_note
                if fused_note and name == kernels.ATTENTION
                else kernels.bytes_note(name),
            )
        )
    return rows
