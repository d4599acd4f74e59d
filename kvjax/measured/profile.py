"""The step measured in situ: the served step (`kvjax.measured.step`) run under `jax.profiler`,
every executed op attributed to kernels, timed per kernel inside the real, fused step.

How (DESIGN.md): XLA:CPU emits one profiler event per executed thunk, and a GPU one per kernel,
each carrying `hlo_op` (the instruction's name in the compiled module), `hlo_module`
(`jit_<function>`) and `run_id` (one per execution). The compiled module of each jitted function
(`kvjax.traced.compiled`) maps every instruction to the kernels whose `jax.named_scope`s it holds
and gives its compiled FLOPs and bytes. Per step, each row (a kernel, or kernels XLA fused
together, named as such: `attn/softmax + attn/av`) sums the durations of its ops; the report
takes the median over steps. Rows are the connected groups of kernels that share an executed op,
so every kernel is in exactly one row and a row's closed form is the sum of its members'.

Coverage is the sum of the rows' time over the step's wall time (Python dispatch and the gaps
between ops are the rest). The trace is kept: `perfetto_trace.json.gz` (open it in the Perfetto
UI) and `*.xplane.pb` (XProf / TensorBoard's profile plugin).
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax

from kvjax import kernels
from kvjax.analytic import Workload
from kvjax.analytic.moe import model_workload
from kvjax.errors import KvjaxError
from kvjax.measured.step import served_step
from kvjax.measured.timing import device_name
from kvjax.model.config import ModelConfig
from kvjax.nn.transformer import param_kernel
from kvjax.traced.compiled import UNNAMED, CompiledOp, compiled_ops
from kvjax.traced.hlo import Cost
from kvjax.traced.target_rules import TargetCostModel


@dataclass(frozen=True)
class OpEvent:
    """One executed op: the compiled instruction `op` of module `module`, execution `run_id`."""

    op: str
    module: str
    run_id: int
    start_us: float
    duration_us: float


@dataclass
class StepProfile:
    cfg: ModelConfig
    workload: Workload
    device: str
    steps: int
    wall_s: list[float]  # per step, Python's clock around the step
    op_s: dict[tuple[str, str], list[float]]  # (module, op) -> seconds in each step
    ops: dict[tuple[str, str], CompiledOp]  # (module, op) -> its kernels and compiled cost
    trace_dir: str | None
    unmatched_events: int = 0
    notes: list[str] = field(default_factory=list)


def load_events(xplane_path: str) -> list[OpEvent]:
    """Executed-op events of a profile (`jax.profiler.ProfileData`, public API)."""
    data = jax.profiler.ProfileData.from_file(xplane_path)
    events = []
    for plane in data.planes:
        for line in plane.lines:
            for e in line.events:
                stats = dict(e.stats)
                if "hlo_op" not in stats:  # markers ("end: ...") and executor bookkeeping
                    continue
                events.append(
                    OpEvent(
                        op=str(stats["hlo_op"]),
                        module=str(stats.get("hlo_module", "")),
                        run_id=int(stats.get("run_id", -1)),
                        start_us=e.start_ns / 1e3,
                        duration_us=e.duration_ns / 1e3,
                    )
                )
    return events


def per_step_op_seconds(
    events: list[OpEvent], modules: set[str], steps: int
) -> tuple[dict[tuple[str, str], list[float]], int]:
    """Seconds of each (module, op) in each step. A module's executions (run ids) are ordered by
    their first event and numbered as steps. Where the events carry no usable run id (a backend
    that does not record it), the k-th execution of each op is given to step k."""
    runs: dict[str, dict[int, float]] = defaultdict(dict)
    for e in events:
        if e.module in modules:
            first = runs[e.module].get(e.run_id)
            runs[e.module][e.run_id] = e.start_us if first is None else min(first, e.start_us)
    index = {}
    by_order = set()
    for module in modules:
        ordered = sorted(runs[module], key=runs[module].get)
        if len(ordered) == steps:
            index.update({(module, rid): i for i, rid in enumerate(ordered)})
        elif ordered == [-1]:
            by_order.add(module)
        else:
            raise KvjaxError(
                f"the profile holds {len(ordered)} executions of {module}, expected {steps}: "
                "another program ran the same function during the trace"
            )
    seconds: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * steps)
    outside = 0
    seen: dict[tuple[str, str], int] = defaultdict(int)
    count: dict[tuple[str, str], int] = defaultdict(int)
    for e in events:
        count[(e.module, e.op)] += 1
    for e in sorted(events, key=lambda e: e.start_us):
        if e.module not in modules:
            outside += 1
            continue
        key = (e.module, e.op)
        if e.module in by_order:  # the same number of executions of an op in every step
            step = min(seen[key] // max(1, count[key] // steps), steps - 1)
            seen[key] += 1
        else:
            step = index[(e.module, e.run_id)]
        seconds[key][step] += e.duration_us * 1e-6
    return dict(seconds), outside


@dataclass
class Prepared:
    """A served step compiled, its executed ops attributed, ready to be traced repeatedly."""

    cfg: ModelConfig
    workload: Workload
    served: Any
    ops: dict[tuple[str, str], CompiledOp]
    carry: Any = None

    @property
    def modules(self) -> set[str]:
        return {f"jit_{name}" for name in self.served.jits}


def prepare(cfg: ModelConfig, wl: Workload, warmup: int = 3) -> Prepared:
    """The served step (refused before allocation if it does not fit), its compiled modules
    attributed per op (`kvjax.traced.compiled`), run `warmup` times untraced."""
    served = served_step(cfg, wl)
    wl = model_workload(cfg, wl)  # the closed form at the model's own expert reads (MoE)
    names = tuple(kernels.REGISTRY)
    ops: dict[tuple[str, str], CompiledOp] = {}
    # a GPU's module calls cuBLAS and fuses Triton GEMMs: costed by the accelerator rules
    rules = None if jax.default_backend() == "cpu" else TargetCostModel
    for name, (fn, args) in served.jits.items():
        lowered = fn.lower(*args)
        attributed = compiled_ops(
            lowered.compile().as_text(),
            names,
            param_kernel,
            lowered.as_text(dialect="hlo", debug_info=True),
            cost_model=rules,
        )
        ops.update({(f"jit_{name}", op.name): op for op in attributed})
    carry = served.carry
    for _ in range(warmup):
        carry = jax.block_until_ready(served.step(carry))
    return Prepared(cfg, wl, served, ops, carry)


def trace_steps(prepared: Prepared, steps: int, logdir: str):
    """`steps` steps under the profiler: (seconds per op per step, wall per step, trace folder)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise KvjaxError(f"steps={steps!r} must be a positive integer")
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # the default records every Python call: slow, unused
    wall = []
    carry = prepared.carry
    jax.profiler.start_trace(logdir, create_perfetto_trace=True, profiler_options=options)
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            carry = jax.block_until_ready(prepared.served.step(carry))
            wall.append(time.perf_counter() - t0)
    finally:
        jax.profiler.stop_trace()
    prepared.carry = carry
    found = sorted(
        glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")),
        key=os.path.getmtime,
    )
    if not found:
        raise KvjaxError(f"jax.profiler wrote no *.xplane.pb under {logdir}")
    op_s, _ = per_step_op_seconds(load_events(found[-1]), prepared.modules, steps)
    return op_s, wall, os.path.dirname(found[-1])


def _profile(prepared: Prepared, op_s, wall, trace_dir) -> StepProfile:
    ops = dict(prepared.ops)
    unmatched = [key for key in op_s if key not in ops]
    for key in unmatched:  # an executed op the compiled text does not list: never dropped
        ops[key] = CompiledOp(key[1], "?", (UNNAMED,), (), Cost())
    return StepProfile(
        cfg=prepared.cfg,
        workload=prepared.workload,
        device=device_name(),
        steps=len(wall),
        wall_s=list(wall),
        op_s=op_s,
        ops=ops,
        trace_dir=trace_dir,
        unmatched_events=len(unmatched),
    )


def profile_step(
    cfg: ModelConfig,
    wl: Workload,
    *,
    steps: int = 20,
    warmup: int = 3,
    trace_dir: str | None = None,
) -> StepProfile:
    """Run `steps` served steps under the profiler (after `warmup` untraced ones) and attribute
    every executed op. The trace stays in `trace_dir` (a temporary folder if None, removed)."""
    prepared = prepare(cfg, wl, warmup)
    logdir = trace_dir or tempfile.mkdtemp(prefix="kvjax-profile-")
    try:
        op_s, wall, folder = trace_steps(prepared, steps, logdir)
    finally:
        if trace_dir is None:
            shutil.rmtree(logdir, ignore_errors=True)
    return _profile(prepared, op_s, wall, folder if trace_dir else None)


def check_sweep_fits(cfgs: list[ModelConfig], wl: Workload) -> None:
    """Every model of a sweep is resident at once: refused before anything is allocated."""
    from kvjax.analytic import kv_cache_bytes, weight_bytes
    from kvjax.measured.kernels import check_fits
    from kvjax.traced.step import cache_len

    rows = cache_len(wl.phase, wl.context)
    total = sum(weight_bytes(c) + kv_cache_bytes(c, rows, wl.batch) for c in cfgs)
    check_fits(f"the {len(cfgs)} model(s) of the sweep (weights + KV caches)", total)


def profile_sweep(
    cfgs: list[ModelConfig],
    wl: Workload,
    *,
    steps: int = 10,
    rounds: int = 3,
    trace_root: str | None = None,
    between: Callable[[int], None] | None = None,
) -> list[StepProfile]:
    """The points of a sweep profiled interleaved: every model prepared first, then `rounds`
    rounds of `steps` steps each, round-robin, with `between(round)` (a ceiling measurement)
    before each round, so a change of the machine's bandwidth mode biases no point."""
    check_sweep_fits(cfgs, wl)
    prepared = [prepare(cfg, wl) for cfg in cfgs]
    op_s: list[dict] = [defaultdict(list) for _ in cfgs]
    wall: list[list[float]] = [[] for _ in cfgs]
    folders: list[list[str]] = [[] for _ in cfgs]
    for r in range(rounds):
        if between is not None:
            between(r)
        for i, p in enumerate(prepared):
            own = trace_root is None
            logdir = (
                tempfile.mkdtemp(prefix="kvjax-profile-")
                if own
                else os.path.join(trace_root, f"kv{p.cfg.num_kv_heads}", f"round{r}")
            )
            try:
                seconds, w, folder = trace_steps(p, steps, logdir)
            finally:
                if own:
                    shutil.rmtree(logdir, ignore_errors=True)
            done = len(wall[i])
            for key, values in seconds.items():
                op_s[i][key] += [0.0] * (done - len(op_s[i][key])) + values
            for key in op_s[i]:  # an op absent this round ran for no time in it
                op_s[i][key] += [0.0] * (done + steps - len(op_s[i][key]))
            wall[i] += w
            folders[i].append(None if own else folder)
    return [_profile(p, dict(op_s[i]), wall[i], folders[i][-1]) for i, p in enumerate(prepared)]
