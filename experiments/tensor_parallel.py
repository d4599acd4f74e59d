"""Tensor parallelism over tp devices: per-device weights and KV cache, collectives and the
decode floor with its link term (closed form, kvjax.analytic.parallel), each point checked
against the sharded program itself:
- per-device weights and KV cache read from the shardings the model is placed with
  (kvjax.traced.sharded.sharded_memory, an abstract mesh: any tp, no devices);
- for tp <= options.trace_up_to_tp, the sharded step compiled on tp x dp simulated CPU devices
  (a subprocess): per-device FLOPs and collective bytes against the closed form. XLA:CPU runs
  bf16 products and all-reduces in f32, so this check traces the f32 variant of the model
  (options.trace_dtype) and compares it with that variant's closed form.

Across processes (`kvjax run --processes N`, srun): a traced point compiles on the global mesh,
every process the same program together (`runs_together`), so collectives whose device groups
span processes are counted as crossing hosts (traced_cross_host_collective_bytes); the other
points run one per process. In one process, options.devices_per_host splits the simulated devices
into hosts (contiguous blocks, as processes order them) to count the same.
"""

from kvjax.analytic import Workload
from kvjax.runs import options as o
from kvjax.runs.config import resolve

OPTIONS = {
    "link_latency_s": o.NONNEGATIVE,
    "trace_up_to_tp": o.NONNEGATIVE_INT,
    "trace_dtype": o.dtype_of("f32", "bf16", "f16"),
    "devices_per_host": o.POSITIVE_INT,
}

TENSOR_PARALLEL = True


def _traced(point) -> bool:
    return 1 < int(point.workload.tp) <= int(point.options.get("trace_up_to_tp", 0))


def runs_together(point) -> bool:
    """Multi-process: a traced point whose mesh fits the global devices compiles on them."""
    from kvjax.runs import distributed

    if not (distributed.is_multiprocess() and _traced(point)):
        return False
    import jax

    return int(point.workload.tp) * int(point.workload.dp) <= jax.device_count()


def run_point(point) -> list[dict]:
    from kvjax.analytic.placement_point import tensor_parallel_point
    from kvjax.traced.sharded import sharded_memory, trace_in_subprocess

    cfg, wl, chip = resolve(point)
    tp, dp = int(point.workload.tp), int(point.workload.dp)
    opts = point.options
    wl_device = Workload(wl.phase, wl.batch // dp, wl.context)
    latency = float(opts.get("link_latency_s", 0.0))  # per ring message; 0 = bandwidth only
    closed = tensor_parallel_point(cfg, tp, wl_device, chip, latency)
    held = sharded_memory(cfg, tp, dp, wl.batch, wl.context)
    record = {
        "model": cfg.name,
        "num_kv_heads": cfg.num_kv_heads,
        "phase": wl.phase,
        "batch": wl.batch,
        "context": wl.context,
        "dp": dp,
        "chip": chip.name,
        "interconnect_bytes_per_s": chip.interconnect_bytes_per_s,
        "weight_dtype": cfg.weight_dtype,
        "kv_dtype": cfg.kv_dtype,
        **closed.to_dict(),
        "sharded_weight_bytes_per_device": held["weight_bytes_per_device"],
        "sharded_kv_cache_bytes_per_device": held["kv_cache_bytes_per_device"],
        "source": "closed form",
    }
    if _traced(point):
        dtype = opts.get("trace_dtype")
        traced_cfg = cfg.replace(weight_dtype=dtype, kv_dtype=dtype) if dtype else cfg
        args = (traced_cfg, wl.phase, wl.batch, wl.context, tp, dp)
        per_host = opts.get("devices_per_host")
        if runs_together(point):
            from kvjax.traced.sharded import trace_sharded_step

            t = trace_sharded_step(*args, layers="one", devices_per_host=per_host).to_dict()
        else:
            t = trace_in_subprocess(*args, layers="one", devices_per_host=per_host)
        record.update(
            traced_dtype=traced_cfg.compute_dtype,
            traced_flops_per_device=t["flops_per_device"],
            traced_closed_flops_per_device=t["closed_flops_per_device"],
            traced_bytes_per_device=t["bytes_per_device"],
            traced_closed_bytes_per_device=t["closed_bytes_per_device"],
            traced_collective_bytes=t["collective_bytes"],
            traced_closed_collective_bytes=t["closed_collective_bytes"],
            traced_collective_counts={k: v["count"] for k, v in t["collectives"].items()},
            traced_backend=t["backend"],
            traced_hosts=t["hosts"],
            traced_cross_host_collective_bytes=t["cross_host_collective_bytes"],
            traced_inter_host_link_bytes=t["inter_host_link_bytes"],
        )
    return [record]
