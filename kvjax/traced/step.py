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


# ---------------------------------------------------------------------------------------------
LAYERS = ("all", "one")


def check_layers(layers: str) -> None:
    if layers not in LAYERS:
        raise KvjaxError(f"layers={layers!r} is not supported; allowed: {', '.join(LAYERS)}")


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


def _kind(cfg: ModelConfig, layer: int) -> tuple[bool, bool, bool, str]:
    """(MoE, sliding, NoPE, layer_kinds letter) of a layer: what makes layers' kernels differ."""
    return (cfg.layer_is_moe(layer), cfg.layer_is_sliding(layer), not cfg.layer_has_rope(layer),
            cfg.layer_kind(layer))  # fmt: skip


def layer_kinds(cfg: ModelConfig) -> list[tuple[bool, bool, bool, str]]:
    """The distinct kinds of layer the model has, dense first (an MoE model's dense layers are
    its first)."""
    return sorted({_kind(cfg, i) for i in range(cfg.num_layers)})


def config_of_kinds(cfg: ModelConfig, kinds: list[tuple[bool, bool, bool, str]]) -> ModelConfig:
    """`cfg` with one layer of each kind in `kinds` (sorted, dense first; repeats allowed)."""
    pattern = "".join("L" if sliding else "G" for _, sliding, _, _ in kinds)
    rope = "".join("N" if nope else "R" for _, _, nope, _ in kinds)
    dense = sum(not moe for moe, _, _, _ in kinds) if cfg.is_moe else 0
    return cfg.replace(
        num_layers=len(kinds), layer_pattern=pattern, first_dense_layers=dense,
        rope_pattern=rope, moe_layer_step=1, layer_kinds="".join(k[3] for k in kinds),
    )  # fmt: skip


def by_layer_kind(cfg: ModelConfig, measure):
    """`measure(config)` (numbers in nested dicts, lists, tuples) of the whole model from small
    ones: a model with one layer of each kind (A), and for each kind with n_k > 1 layers that
    model with the kind's layer twice (B_k): A + sum_k (n_k - 1) (B_k - A). With one kind this is
    one + (L - 1) (two - one). Returns (total, the layer counts traced)."""
    kinds = layer_kinds(cfg)
    base_cfg = config_of_kinds(cfg, kinds)
    base = measure(base_cfg)
    terms, traced = [(1, base)], [base_cfg.num_layers]
    for i, kind in enumerate(kinds):
        n = sum(_kind(cfg, j) == kind for j in range(cfg.num_layers))
        if n > 1:
            twice = config_of_kinds(cfg, kinds[: i + 1] + kinds[i:])
            terms += [(n - 1, measure(twice)), (1 - n, base)]
            traced.append(twice.num_layers)
    return linear_combination(terms), tuple(traced)


def linear_combination(terms):
    """sum of coef * tree over (coef, tree) pairs, leaf by leaf (a key missing from a dict is
    zero there)."""
    trees = [t for _, t in terms]
    first = next((t for t in trees if t is not None), None)
    if isinstance(first, dict):
        keys = list(dict.fromkeys(k for t in trees for k in (t or {})))
        return {k: linear_combination([(c, (t or {}).get(k)) for c, t in terms]) for k in keys}
    if isinstance(first, tuple | list):
        return type(first)(
            linear_combination([(c, t[i]) for c, t in terms]) for i in range(len(first))
        )
    return sum(c * (t or 0) for c, t in terms)


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

    `layers="one"` traces a one-layer model and multiplies each layer kernel by `num_layers`
    (the layers are identical; tests check this equals the full unrolled trace).
    """
    cfg, dequantized_notes = as_the_model_runs(cfg)
    # kvjax's model gathers every MoE token's k experts: compared at M*k expert reads
    wl = model_workload(cfg, Workload(phase, batch, context, new_tokens=new_tokens))
    if stage not in STAGES:
        raise KvjaxError(f"stage={stage!r} is not supported; allowed: {', '.join(STAGES)}")
    check_layers(layers)
    if stage == "compiled" and layers == "one":
        raise KvjaxError("stage='compiled' traces every layer; use layers='all'")
    t0 = time.perf_counter()
    # "one": one layer of each kind (dense/MoE, global/sliding) the model has, each standing
    # for its kind; the dense kinds first (an MoE model's dense layers are its first)
    kinds = layer_kinds(cfg)
    traced_cfg = cfg
    if layers == "one":
        traced_cfg = config_of_kinds(cfg, kinds)
    fn, args = step_fn(traced_cfg, phase, batch, context, new_tokens=new_tokens)
    lowered = lower_for_cost(fn, args)
    backend = jax.default_backend()
    notes: list[str] = list(dequantized_notes)
    if stage == "compiled":
        compiled = lowered.compile()
        xla = dict(compiled.cost_analysis() or {})
        total = Cost(
            xla.get("flops", 0.0), xla.get("transcendentals", 0.0), xla.get("bytes accessed", 0.0)
        )
        notes.append(f"compiled on {backend}: totals after fusion, not attributable per kernel")
        traced: list[KernelTrace] = []
    else:
        xla = dict(lowered.cost_analysis() or {})
        text = lowered.as_text(dialect="hlo", debug_info=True)
        per_kernel, total = attribute(text, _kernel_names(cfg, wl))
        traced = []
        for (layer, name), c in per_kernel.items():
            layer_ids = [layer]
            if layer is not None and layers == "one":  # every layer of the traced layer's kind
                kind = kinds[layer]
                layer_ids = [i for i in range(cfg.num_layers) if _kind(cfg, i) == kind]
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
        if not (fused_note and fused_note.startswith("interpreted")):  # not costed
            # XLA counts a loop once through; kvjax times its trip count (`traced.hlo`)
            once = attribute(text, _kernel_names(cfg, wl), False)[0] if " while(" in text else None
            _check_attribution(once or per_kernel, xla)
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
        return (f"interpreted on {backend}: the attention's Pallas kernel runs in interpret mode, "
                f"so its traced row is the interpreter's loop, not a cost (the module's total is "
                f"not checked against the kernels' sum); {target}")  # fmt: skip
    return (f"unfused on {backend}: the attention's jax.nn.dot_product_attention is XLA's "
            f"composite here (the T x S scores through memory), not the fused kernel the closed "
            f"form counts; {target}")  # fmt: skip


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
