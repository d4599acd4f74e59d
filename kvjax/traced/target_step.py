"""One decoder step compiled for an accelerator target on this host, per kernel, beside the
closed form (`kvjax trace --target h100 --stage compiled`).

The step is `kvjax.traced.step.step_fn` (abstract shapes: a 70B model costs no memory) with its
cache donated, as a server runs it (XLA then updates the cache in place instead of copying it).
The same step lowered for this host's CPU gives the pre-optimization products, which name the
products whose metadata XLA dropped. Every executed instruction of the target's module is
costed and attributed by `kvjax.traced.target_costs`.

Whether the step fits: the compiler's memory analysis (arguments + outputs - aliased + temporary
bytes, per device) against the chip's memory; a TPU compile of a step too large fails with
RESOURCE_EXHAUSTED, refused here with the compiler's numbers.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from kvjax import analytic, hardware, kernels
from kvjax.analytic import Workload
from kvjax.analytic.moe import model_workload
from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig
from kvjax.traced.target_compile import compile_for_target
from kvjax.traced.target_costs import TargetModuleCosts, dumps_thunk, module_kernel_costs
from kvjax.traced.targets import Target

CACHE_ARG = 2  # step(state, tokens, cache)


@dataclass
class TargetTrace:
    cfg: ModelConfig
    workload: Workload
    target: Target
    device_kind: str
    costs: TargetModuleCosts
    memory: dict[str, int]
    xla_cost: dict[str, float] | None
    compile_seconds: float
    trace_seconds: float
    text: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def step_bytes(self) -> int:
        """Peak device memory of the step: arguments + outputs - aliased + temporaries."""
        m = self.memory
        return m["argument_bytes"] + m["output_bytes"] - m["alias_bytes"] + m["temp_bytes"]


def _fused_lowering(cfg: ModelConfig, wl: Workload, target):
    """A flash model's kernels lowered for the target (Triton on a GPU, Mosaic on a TPU), the
    decode cache split and the prefill tiled as `kvjax.analytic.flash.plan` sizes them for the
    target's chip."""
    import contextlib

    if cfg.attention_kernel != "flash":
        return contextlib.nullcontext()
    from kvjax.analytic import flash as flash_form
    from kvjax.nn import flash

    chip = hardware.get_chip(target.spec.chip)
    tiles = flash_form.plan(cfg, wl, chip.onchip_bytes_per_core, chip.num_cores)
    if target.platform == "tpu":
        return flash.lowering_for("tpu", tiles.splits)
    # cuDNN's fused attention lowers only where a CUDA driver is present: a GPU target compiled
    # here runs kvjax's own Pallas prefill in the closed form's tiles (Triton)
    return flash.lowering_for(
        "gpu", tiles.splits, prefill="pallas", block_q=tiles.block_q, block_k=tiles.block_k
    )


def trace_target_step(
    cfg: ModelConfig, phase: str, batch: int, context: int, target: Target | str
) -> TargetTrace:
    from kvjax.nn.transformer import param_kernel
    from kvjax.traced.step import as_the_model_runs, lower_for_cost, step_fn
    from kvjax.traced.targets import parse_target

    cfg, dequantized_notes = as_the_model_runs(cfg)  # MXFP4 experts: run dequantized
    target = parse_target(target) if isinstance(target, str) else target
    if target.num_devices != 1:
        raise KvjaxError(
            f"target {target.name} has {target.num_devices} devices: a sharded step needs --tp "
            "(kvjax trace --target ... --tp N)"
        )
    wl = model_workload(cfg, Workload(phase, batch, context))
    t0 = time.perf_counter()
    fn, args = step_fn(cfg, phase, batch, context)
    lowered = lower_for_cost(fn, args)
    names = tuple(analytic.step_kernels(cfg, wl)) + tuple(kernels.REGISTRY)
    names = tuple(dict.fromkeys(names))
    from kvjax.units import fmt_bytes

    held = analytic.weight_bytes(cfg) + analytic.kv_cache_bytes(cfg, context, batch)
    needs = f"{cfg.name} holds {fmt_bytes(held)} of weights and KV cache by the closed form"
    with _fused_lowering(cfg, wl, target):  # a fresh function: not the CPU lowering's trace
        compiled = compile_for_target(
            lambda *a: fn(*a), args, target, donate_argnums=(CACHE_ARG,), needs=needs
        )
    costs = module_kernel_costs(
        compiled.text,
        names,
        param_kernel,
        lowered.as_text(dialect="hlo", debug_info=True),
        hbm_only=target.platform == "tpu",
    )
    return TargetTrace(
        cfg=cfg,
        workload=wl,
        target=target,
        device_kind=compiled.device_kind,
        costs=costs,
        memory=compiled.memory,
        xla_cost=compiled.cost,
        compile_seconds=compiled.compile_seconds,
        trace_seconds=time.perf_counter() - t0,
        text=compiled.text,
        notes=dequantized_notes,
    )


def _fused_with(trace: TargetTrace) -> dict[str, list[str]]:
    """Per kernel, the other kernels that share an executed instruction with it."""
    out: dict[str, set[str]] = {}
    for t in trace.costs.thunks:
        for k in t.kernels:
            out.setdefault(k, set()).update(x for x in t.kernels if x != k)
    return {k: sorted(v) for k, v in out.items()}


def kernel_rows(trace: TargetTrace) -> list[dict[str, Any]]:
    """Closed form vs compiled-for-target, per kernel (summed over layers). The executable's
    bytes are what its instructions ask of global memory, so the closed form beside them is
    tiled for the chip but counts no L2 hits (`ChipSpec.l2_bytes` unset): the L2 is a
    run-time cache the compiled module does not show."""
    chip = dataclasses.replace(hardware.get_chip(trace.target.spec.chip), l2_bytes=None)
    closed = analytic.step_kernels(trace.cfg, trace.workload, chip)
    compiled = trace.costs.by_kernel()
    fused = _fused_with(trace)
    by_name = {t.name: t for t in trace.costs.thunks}
    rows = []
    for name in list(closed) + [n for n in compiled if n not in closed]:
        c = closed.get(name)
        t = compiled.get(name)
        kinds: dict[str, int] = {}
        temps: dict[str, int] = {}
        for thunk in sorted(t.thunks) if t else []:
            th = by_name[thunk]
            kinds[th.kind] = kinds.get(th.kind, 0) + 1
            if th.temporary:
                temps[th.temporary] = temps.get(th.temporary, 0) + 1
        kind = kernels.REGISTRY[name].kind if name in kernels.REGISTRY else kernels.GLUE
        # a product's FLOPs compare with its 2MNK: the converts XLA also counts are apart
        arithmetic = (t.flops - (t.convert_flops if kind == kernels.MATMUL else 0.0)) if t else 0.0
        remaining = None
        if t and c and c.bytes:
            remaining = (t.bytes - t.split_k_bytes - t.copy_bytes) / c.bytes
        note = None
        if remaining is not None and abs(remaining - 1) > 0.05:
            note = (
                f"fused with {', '.join(fused[name])}: what passes between fused kernels is not "
                "written, and each fused instruction's reads and writes are on the row of the "
                "kernel that uses or produces them"
                if fused.get(name)
                else "not fused: the executed instructions move other bytes than the closed form's"
            )
        closed_flops = c.flops if c else 0.0
        closed_bytes = c.bytes if c else 0.0
        rows.append(
            {
                "name": name,
                "kind": kind,
                "closed_flops": closed_flops,
                "compiled_flops": t.flops if t else 0.0,
                "convert_flops": t.convert_flops if t else 0.0,
                "flops_ratio": arithmetic / closed_flops if closed_flops else None,
                "closed_bytes": closed_bytes,
                "compiled_bytes": t.bytes if t else 0.0,
                "split_k_bytes": t.split_k_bytes if t else 0.0,
                "bytes_ratio": (t.bytes / closed_bytes) if (t and closed_bytes) else None,
                "copy_bytes": t.copy_bytes if t else 0.0,
                # what remains once the temporaries XLA added are named and set apart
                "bytes_ratio_without_temporaries": remaining,
                "bytes_note": note,
                "compiled_transcendentals": t.transcendentals if t else 0.0,
                "executed_as": kinds,
                "temporaries": temps,
                "fused_with": fused.get(name, []),
            }
        )
    return rows


def trace_dict(trace: TargetTrace, with_thunks: bool = False) -> dict[str, Any]:
    closed = analytic.step_cost(trace.cfg, trace.workload)
    total = trace.costs.total
    capacity = _capacity(trace)
    out = {
        "target": trace.target.name,
        "platform": trace.target.platform,
        "device": trace.device_kind,
        "kernels": kernel_rows(trace),
        "total": {
            "closed_flops": closed.flops,
            "compiled_flops": total.flops,
            "closed_bytes": closed.bytes,
            "compiled_bytes": total.bytes,
            "executed_instructions": len(trace.costs.thunks),
        },
        "memory": {
            **trace.memory,
            "step_bytes": trace.step_bytes,
            "device_memory_bytes": capacity,
            "fits": capacity is None or trace.step_bytes <= capacity,
        },
        "xla_cost_analysis": trace.xla_cost,
        "compile_seconds": trace.compile_seconds,
        "trace_seconds": trace.trace_seconds,
        "notes": trace.notes + _notes(trace),
    }
    if with_thunks:
        out["executed"] = [dumps_thunk(t) for t in trace.costs.thunks]
    return out


def _capacity(trace: TargetTrace) -> int | None:
    spec = trace.target.spec
    if getattr(spec, "memory_bytes", None):
        return int(spec.memory_bytes)
    from kvjax.hardware import CHIPS

    chip = CHIPS.get(spec.chip)
    return int(chip.memory_bytes) if chip and chip.memory_bytes else None


def _notes(trace: TargetTrace) -> list[str]:
    notes = [
        f"compiled for {trace.device_kind} on this host (no device: XLA's default tiles, "
        "no autotuning); FLOPs and bytes counted by kvjax from the optimized module"
    ]
    if trace.target.platform == "tpu":
        notes.append(
            "TPU bytes are HBM traffic: operands in on-chip memory (S(1)) excluded, "
            "each prefetch (copy-start) read once"
        )
    return notes
