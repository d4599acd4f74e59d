"""Trace of the tensor-parallel program: per-device FLOPs and bytes of the compiled (SPMD
partitioned) module, and its collectives (`kvjax.traced.collectives`), beside the closed form of
`kvjax.analytic.parallel`.

The lowered module of a sharded program is still the global one; only the compiled module is
per device (DESIGN.md), so every number here is from the "compiled" stage.

Traced from abstract shapes like `kvjax.traced.step`: no weights are allocated, but the mesh needs
tp * dp devices (on a CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N before jax starts;
`kvjax trace --tp N` sets it).

Across hosts: when the mesh's devices belong to several processes (`kvjax.runs.distributed`), or
`devices_per_host` groups a single process's devices into simulated hosts (contiguous blocks of
the mesh's device order, as `jax.devices()` orders processes), each collective whose device
groups span hosts is counted as crossing hosts (`kvjax.traced.collectives.summarize`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import jax

from kvjax import analytic
from kvjax.analytic import Workload, parallel
from kvjax.analytic.moe import model_workload
from kvjax.devices import batch_per_replica
from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig
from kvjax.nn import sharding as sh
from kvjax.traced.by_kind import by_layer_kind, check_layers, layer_kinds
from kvjax.traced.collectives import Collective, collectives, summarize
from kvjax.traced.sharded_program import served_pieces, sharded_memory
from kvjax.traced.step import as_the_model_runs, cache_len

__all__ = ["ShardedTrace", "sharded_memory", "trace_in_subprocess", "trace_sharded_step"]


# ---------------------------------------------------------------------------------------------
@dataclass
class ShardedTrace:
    cfg: ModelConfig
    workload: Workload  # the whole batch
    tp: int
    dp: int
    backend: str
    flops_per_device: float  # compiled module (per device)
    bytes_per_device: float
    collectives: dict[str, dict[str, float]]  # kind -> count, bytes_per_device
    closed_flops_per_device: float
    closed_bytes_per_device: float
    closed_collective_bytes: float
    closed_collective_counts: dict[str, int]
    kv_cache_bytes_per_device: int  # from the shardings of the traced program's cache arrays
    weight_bytes_per_device: int  # and of its parameters (the most any device holds)
    layers_traced: tuple[int, ...]
    trace_seconds: float
    notes: list[str] = field(default_factory=list)
    hosts: int = 1  # hosts (processes) the mesh's devices belong to
    host_source: str = "one process"  # "processes" or "simulated: N devices a host"
    closed_collectives: dict[str, dict[str, float]] = field(default_factory=dict)  # by kind
    expert_parallel: bool = False  # the routed experts over the dp devices

    @property
    def collective_bytes(self) -> float:
        return sum(r["bytes_per_device"] for r in self.collectives.values())

    @property
    def cross_host_collective_bytes(self) -> float:
        """Bytes one device sends in collectives whose groups span hosts."""
        return sum(r.get("cross_host_bytes_per_device", 0.0) for r in self.collectives.values())

    @property
    def inter_host_link_bytes(self) -> float:
        """Bytes a step puts on links between hosts, over the whole mesh (rings host by host)."""
        return sum(r.get("inter_host_link_bytes", 0.0) for r in self.collectives.values())

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cfg"] = self.cfg.to_dict()
        d["workload"] = asdict(self.workload)
        d["collective_bytes"] = self.collective_bytes
        d["cross_host_collective_bytes"] = self.cross_host_collective_bytes
        d["within_host_collective_bytes"] = self.collective_bytes - self.cross_host_collective_bytes
        d["inter_host_link_bytes"] = self.inter_host_link_bytes
        d["stage"] = "compiled"
        return d


def _compile(cfg, mesh, phase, batch, context, count=None, host_of=None, expert_parallel=False):
    """Per-device cost and collectives of one step, summed over the jits it is served as.
    `count(text)` replaces XLA's cost analysis (an accelerator's module: kvjax counts it)."""
    cost: dict[str, float] = {}
    colls: list[Collective] = []
    for fn, args, donate in served_pieces(cfg, mesh, phase, batch, context, expert_parallel):
        with jax.set_mesh(mesh):
            compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
        counted = count(compiled.as_text()) if count else compiled.cost_analysis()
        for key, value in (counted or {}).items():
            if key in ("flops", "bytes accessed", "transcendentals"):
                cost[key] = cost.get(key, 0.0) + float(value)
        colls += collectives(compiled.as_text())
    return cost, summarize(colls, host_of)


def host_map(mesh, devices_per_host: int | None = None) -> tuple[list[int], str]:
    """Partition id (position in the mesh's device order) -> host, and where that came from."""
    procs = [d.process_index for d in mesh.devices.flat]
    if len(set(procs)) > 1 or devices_per_host is None:
        return procs, "processes" if len(set(procs)) > 1 else "one process"
    n = len(procs)
    if (
        isinstance(devices_per_host, bool)
        or not isinstance(devices_per_host, int)
        or (devices_per_host < 1 or n % devices_per_host)
    ):
        allowed = [k for k in range(1, n + 1) if n % k == 0]
        raise KvjaxError(
            f"devices_per_host={devices_per_host!r} must divide the mesh's {n} devices: one of "
            f"{allowed}"
        )
    hosts = [i // devices_per_host for i in range(n)]
    return hosts, f"simulated: {devices_per_host} devices a host"


def trace_sharded_step(
    cfg: ModelConfig,
    phase: str,
    batch: int,
    context: int,
    tp: int,
    dp: int = 1,
    *,
    layers: str = "all",
    devices=None,
    count=None,
    devices_per_host: int | None = None,
    expert_parallel: bool = False,
) -> ShardedTrace:
    """One step of the tp x dp sharded model, compiled from abstract shapes; with
    `expert_parallel`, its routed experts spread over the dp devices (tp = 1), dispatched by
    all-to-all (`kvjax.nn.expert_parallel`), against the closed form's fixed-shape all-to-alls
    at the model's capacity (capacity factor E / k: no token dropped).

    `layers="one"` compiles a one-layer and a two-layer model and extrapolates linearly to
    `num_layers` (the layers are identical; tests check it equals the full compile), which keeps
    a 70B model's trace to seconds.
    """
    cfg, dequantized_notes = as_the_model_runs(cfg)
    wl = Workload(phase, batch, context)  # validates phase, batch and context
    check_layers(layers)
    batch_per_replica(batch, dp)
    t0 = time.perf_counter()
    if devices is None and len(jax.devices()) < tp * dp:
        devices = jax.devices("cpu")  # e.g. one GPU: trace on simulated CPU devices instead
    mesh = sh.make_mesh(cfg, tp, dp, devices)
    pl = parallel.Placement(tp, dp if expert_parallel else 1, dp)
    if expert_parallel:
        sh.check_expert_parallel(cfg, tp, dp)
    backend = mesh.devices.flat[0].platform
    host_of, host_source = host_map(mesh, devices_per_host)

    def compile_step(c: ModelConfig):
        return _compile(c, mesh, phase, batch, context, count, host_of, expert_parallel)

    (cost, colls), traced_layers = _every_layer(cfg, layers, compile_step)
    held = sharded_memory(cfg, tp, dp, batch, cache_len(phase, context), expert_parallel)
    closed = analytic.step_cost(  # the model reads each token's k experts (M * k gathers)
        parallel.device_config(cfg, tp), parallel.device_workload(cfg, pl, model_workload(cfg, wl))
    )
    capacity = cfg.num_experts / cfg.experts_per_token if expert_parallel else None
    closed_colls = parallel.placed_collectives(cfg, pl, wl, capacity)
    notes = [f"compiled on {backend}: per-device totals after SPMD partitioning"]
    notes += dequantized_notes
    notes += _notes(cfg, mesh, expert_parallel, count is not None)
    return ShardedTrace(
        cfg=cfg,
        workload=wl,
        tp=tp,
        dp=dp,
        backend=backend,
        flops_per_device=float(cost.get("flops", 0.0)),
        bytes_per_device=float(cost.get("bytes accessed", 0.0)),
        collectives=colls,
        closed_flops_per_device=closed.flops,
        closed_bytes_per_device=closed.bytes,
        closed_collective_bytes=sum(c["bytes_per_device"] for c in closed_colls.values()),
        closed_collective_counts={k: c["count"] for k, c in closed_colls.items()},
        closed_collectives=closed_colls,
        expert_parallel=expert_parallel,
        kv_cache_bytes_per_device=held["kv_cache_bytes_per_device"],
        weight_bytes_per_device=held["weight_bytes_per_device"],
        layers_traced=traced_layers,
        trace_seconds=time.perf_counter() - t0,
        notes=notes,
        hosts=len(set(host_of)),
        host_source=host_source,
    )


def _every_layer(cfg: ModelConfig, layers: str, compile_step):
    """(cost, collectives) of the whole model and the layer counts compiled: every layer, or
    one and two layers of each kind extrapolated (`kvjax.traced.by_kind.by_layer_kind`)."""
    L = cfg.num_layers
    if layers == "all" or L <= len(layer_kinds(cfg)):
        return compile_step(cfg), (L,)
    return by_layer_kind(cfg, compile_step)


def _notes(cfg: ModelConfig, mesh, expert_parallel: bool, counted: bool) -> list[str]:
    """What the compiled figures leave out or count otherwise than the closed form."""
    notes = []
    if expert_parallel:
        notes.append(
            "expert parallel: fixed-shape all-to-alls of E x C rows (C = a device's tokens, none "
            "dropped); the experts compute all E x C rows, E/k x the routed FLOPs, which the "
            "closed form's per-device FLOPs (routed rows only) do not count"
        )
    if counted:
        notes.append(
            f"compiled for {mesh.devices.flat[0].device_kind} on this host; FLOPs (without "
            "the converts XLA also counts) and HBM bytes counted by kvjax from the module "
            "(kvjax.traced.target_costs)"
        )
    if cfg.compute_dtype != "f32" and mesh.devices.flat[0].platform == "cpu":
        notes.append(
            "XLA:CPU computes bf16 products in f32 (converts counted as FLOPs and bytes, and "
            "the all-reduces run in f32): compare in f32 (--weight-dtype f32 --kv-dtype f32)"
        )
    return notes


def trace_in_subprocess(
    cfg: ModelConfig,
    phase: str,
    batch: int,
    context: int,
    tp: int,
    dp: int = 1,
    layers="one",
    devices_per_host: int | None = None,
) -> dict:
    """`trace_sharded_step(...).to_dict()` run in a fresh Python with tp * dp simulated CPU
    devices, so a caller with one device (a launcher also timing kernels) need not change."""
    import json
    import os
    import subprocess
    import sys

    from kvjax.devices import FLAG, request_host_devices

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SLURM_"))}
    # one process of a multi-process run has its own device count: this trace asks for its own
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if FLAG not in f)
    request_host_devices(tp * dp, env)
    env["JAX_PLATFORMS"] = "cpu"
    request = dict(
        cfg=cfg.to_dict(),
        phase=phase,
        batch=batch,
        context=context,
        tp=tp,
        dp=dp,
        layers=layers,
        devices_per_host=devices_per_host,
    )
    done = subprocess.run(
        [sys.executable, "-m", "kvjax.traced.sharded"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise KvjaxError(f"sharded trace of {cfg.name} at tp={tp} dp={dp} failed: {last}")
    return json.loads(done.stdout)


def _main() -> None:
    import json
    import sys

    request = json.load(sys.stdin)
    cfg = ModelConfig(**request.pop("cfg"))
    try:
        result = trace_sharded_step(cfg, **request)
    except KvjaxError as exc:
        sys.exit(f"error: {exc}")
    print(json.dumps(result.to_dict()))


if __name__ == "__main__":
    _main()
