"""`kvjax trace`: XLA's cost analysis of the Flax model, per kernel, beside the closed form; with
`--tp`/`--dp`, one device's compiled step of the sharded program and its collectives."""

from __future__ import annotations

import argparse
import time
from typing import Any

from kvjax import analytic, kernels
from kvjax.analytic import parallel, placement_point, roofline
from kvjax.cli import render, render_parallel, render_target
from kvjax.cli.args import (
    add_chip_args,
    add_model_args,
    add_workload_args,
    emit,
    finite,
    positive_int,
    resolve_chip,
    resolve_model,
    resolve_workload,
)
from kvjax.cli.calc_report import workload_report
from kvjax.devices import batch_per_replica
from kvjax.errors import KvjaxError
from kvjax.traced.targets import GPU_TARGETS, TPU_TARGETS, parse_target


def add_parser(sub) -> None:
    trace = sub.add_parser(
        "trace",
        help="XLA's cost analysis of the real Flax model, per kernel, beside the closed form",
        description="Trace one step of the Flax model from abstract shapes (no weights allocated) "
        "and compare XLA's per-kernel FLOPs and bytes with the closed form.",
    )
    add_model_args(trace)
    add_workload_args(trace, extend=True)
    add_chip_args(trace)
    trace.add_argument(
        "--stage",
        choices=("lowered", "compiled"),
        default=None,
        help="lowered: pre-optimization, per kernel (default); compiled: after fusion, totals "
        "(the only stage with --tp/--dp)",
    )
    trace.add_argument(
        "--trace-layers",
        choices=("all", "one"),
        default="all",
        help="trace every layer (default) or one layer times num_layers (identical layers)",
    )
    trace.add_argument("--roofline", action="store_true", help="add jax.experimental.roofline")
    trace.add_argument(
        "--tp",
        type=positive_int,
        default=1,
        help="tensor-parallel degree: trace the sharded program per device, with its "
        "collectives (on a CPU, tp x dp simulated devices)",
    )
    trace.add_argument(
        "--dp",
        "--dp-attention",
        dest="dp",
        type=positive_int,
        default=1,
        help="data-parallel degree: each of N groups runs batch/N sequences with its own cache "
        "(data-parallel attention; the experts too unless --ep)",
    )
    trace.add_argument(
        "--ep",
        type=positive_int,
        default=1,
        help="MoE: spread the routed experts over the --dp-attention devices (ep = dp, tp = 1), "
        "dispatched by all-to-all",
    )
    trace.add_argument(
        "--target",
        default=None,
        metavar="NAME",
        help="compile for an accelerator on this host (no device needed): a GPU "
        f"({', '.join(GPU_TARGETS)}) or a TPU ({', '.join(TPU_TARGETS)}; a slice as "
        "tpu-v5e:2x2 with --tp); implies --stage compiled, per kernel",
    )
    trace.add_argument(
        "--executed",
        action="store_true",
        help="with --target and --json: list every executed instruction with its kernels",
    )
    trace.add_argument(
        "--devices-per-host",
        type=positive_int,
        default=None,
        help="with --tp/--dp: count collectives crossing hosts as if every N devices of the "
        "mesh were one host (processes already are)",
    )
    trace.add_argument(
        "--processes",
        type=int,
        default=None,
        help="with --tp/--dp: trace on N local processes joined by jax.distributed (4 simulated "
        "CPU devices each); process 0 prints",
    )
    trace.add_argument("--json", action="store_true", help="print one JSON object")
    trace.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvjax.cli.runs import without_processes
    from kvjax.runs import distributed

    if args.processes is not None or distributed.requested() is not None:
        if args.tp * args.dp == 1 or args.target is not None:
            raise KvjaxError(
                "several processes trace the sharded program on this host's CPU devices: add "
                "--tp/--dp and drop --target"
            )
        if args.processes is not None and distributed.check_processes(args.processes) > 1:
            return distributed.launch(without_processes(args.argv), args.processes)
        distributed.initialize()
    if (args.devices_per_host is not None) and args.tp * args.dp == 1:
        raise KvjaxError("--devices-per-host counts a sharded program's hosts: add --tp/--dp")
    if args.phase == "extend" and (args.target is not None or args.tp > 1 or args.dp > 1):
        raise KvjaxError(
            "--phase extend is traced on this host, one device (drop --target, --tp, --dp)"
        )
    if args.target is not None:
        report = target_trace_report(args)
        if "target" in report and isinstance(report["target"], str):  # a partitioned slice
            return emit(args, report, render_parallel.print_sharded_trace)
        return emit(args, report, render_target.print_target_trace)
    if args.executed:
        raise KvjaxError("--executed lists a target's executed instructions; add --target NAME")
    if args.ep > 1 and (args.ep != args.dp or args.target is not None):
        raise KvjaxError(
            f"--ep {args.ep} spreads the experts over the data-parallel attention devices: pass "
            f"--dp-attention {args.ep} (and --tp 1; no --target)"
        )
    sharded = args.tp > 1 or args.dp > 1
    if sharded:
        if args.stage == "lowered":
            raise KvjaxError(
                "--tp/--dp trace the compiled module (the lowered module of a sharded program "
                "is the global one); drop --stage or pass --stage compiled"
            )
        if args.roofline:
            raise KvjaxError("--roofline is for the single-device trace; drop it with --tp/--dp")
        from kvjax.devices import request_host_devices

        if not distributed.is_multiprocess():
            request_host_devices(args.tp * args.dp)
        report = sharded_trace_report(args)
        if distributed.process_index():
            return 0  # every process compiled the same program; process 0 prints it
        return emit(args, report, render_parallel.print_sharded_trace)
    args.stage = args.stage or "lowered"
    return emit(args, trace_report(args), render.print_trace)


def trace_report(args: argparse.Namespace) -> dict[str, Any]:
    """The traced view beside the closed form, as the JSON `kvjax trace --json` prints."""
    from kvjax.traced.step import trace_step

    cfg, wl = resolve_model(args), resolve_workload(args)
    chip = resolve_chip(args, cfg)
    peak, bw = chip.peak(cfg.peak_dtype), chip.bandwidth_bytes_per_s
    t0 = time.perf_counter()
    with render.progress(
        f"lowering {cfg.name} ({cfg.num_layers} layers, tracing {args.trace_layers})"
    ):
        trace = trace_step(
            cfg,
            wl.phase,
            wl.batch,
            wl.context,
            stage=args.stage,
            layers=args.trace_layers,
            roofline=args.roofline,
            new_tokens=wl.new_tokens,
        )
    return {
        "model": cfg.to_dict(),
        "workload": workload_report(wl),
        "chip": {"name": chip.name, "peak_flops_per_s": peak, "bandwidth_bytes_per_s": bw},
        "stage": trace.stage,
        "backend": trace.backend,
        "layers_traced": trace.layers_traced,
        "kernels": _kernel_rows(trace, peak, bw) if trace.stage == "lowered" else [],
        "total": _total(trace, analytic.step_cost(cfg, wl), peak, bw),
        "xla_module": {
            k: v
            for k, v in trace.xla.items()
            if k in ("flops", "bytes accessed", "transcendentals")
        },
        "roofline_opinion": trace.roofline,
        "notes": trace.notes,
        "interpreted": any(n.startswith("interpreted") for n in trace.notes),
        "trace_seconds": trace.trace_seconds,
        "command_seconds": time.perf_counter() - t0,
    }


def _kernel_rows(trace, peak: float, bw: float) -> list[dict[str, Any]]:
    """Each kernel of the lowered module beside its closed form, on the chip's roofline."""
    from kvjax.traced.step import compare

    rows = []
    for r in compare(trace):
        on_roof = roofline.point(r.name, r.traced_flops, r.traced_bytes, peak, bw)
        rows.append(
            {
                "name": r.name,
                "closed_flops": r.closed_flops,
                "traced_flops": r.traced_flops,
                "flops_ratio": finite(r.flops_ratio),
                "closed_bytes": r.closed_bytes,
                "traced_bytes": r.traced_bytes,
                "bytes_ratio": finite(r.bytes_ratio),
                "closed_transcendentals": r.closed_transcendentals,
                "traced_transcendentals": r.traced_transcendentals,
                "intensity": finite(on_roof.intensity),
                "bound_s": on_roof.bound_s,
                "bound": on_roof.bound,
                "explanation": r.explanation,
            }
        )
    return rows


def _total(trace, closed, peak: float, bw: float) -> dict[str, Any]:
    """The whole step, traced against the closed form, and both on the chip's roofline."""
    traced_step = roofline.point(
        kernels.STEP_KERNEL, trace.total.flops, trace.total.bytes, peak, bw
    )
    return {
        "closed_flops": closed.flops,
        "traced_flops": trace.total.flops,
        "flops_ratio": trace.total.flops / closed.flops,
        "closed_bytes": closed.bytes,
        "traced_bytes": trace.total.bytes,
        "bytes_ratio": trace.total.bytes / closed.bytes,
        "traced_transcendentals": trace.total.transcendentals,
        "intensity": traced_step.intensity,
        "bound_s": traced_step.bound_s,
        "closed_bound_s": roofline.point(
            kernels.STEP_KERNEL, closed.flops, closed.bytes, peak, bw
        ).bound_s,
    }


def sharded_trace_report(args: argparse.Namespace, devices=None, count=None) -> dict[str, Any]:
    """`kvjax trace --tp N`: the compiled per-device step and its collectives vs closed form
    (on `devices`, a TPU slice's, counted by `count`; default this host's)."""
    from kvjax.traced.sharded import trace_sharded_step

    cfg, wl = resolve_model(args), resolve_workload(args)
    chip = resolve_chip(args, cfg)
    batch_per_replica(wl.batch, args.dp, ("--batch", "--dp"))
    ep = getattr(args, "ep", 1)
    with render.progress(
        f"compiling {cfg.name} on {args.tp * args.dp} devices (tp={args.tp}, dp={args.dp}"
        f"{f', ep={ep}' if ep > 1 else ''})"
    ):
        t = trace_sharded_step(
            cfg,
            wl.phase,
            wl.batch,
            wl.context,
            args.tp,
            args.dp,
            layers=args.trace_layers,
            devices=devices,
            count=count,
            devices_per_host=getattr(args, "devices_per_host", None),
            expert_parallel=ep > 1,
        )
    capacity = cfg.num_experts / cfg.experts_per_token if ep > 1 else None
    pl = parallel.Placement(args.tp, ep, args.dp)
    closed = placement_point.placement_point(cfg, pl, wl, chip, capacity_factor=capacity).to_dict()
    peak, bw = chip.peak(cfg.peak_dtype), chip.bandwidth_bytes_per_s
    link = chip.interconnect_bytes_per_s
    traced_floor = roofline.point(
        kernels.STEP_KERNEL, t.flops_per_device, t.bytes_per_device, peak, bw
    ).bound_s
    report = t.to_dict()
    report.update(
        chip={
            "name": chip.name,
            "peak_flops_per_s": peak,
            "bandwidth_bytes_per_s": bw,
            "interconnect_bytes_per_s": link,
        },
        closed_form=closed,
        flops_ratio=t.flops_per_device / t.closed_flops_per_device,
        bytes_ratio=t.bytes_per_device / t.closed_bytes_per_device,
        collective_ratio=(
            t.collective_bytes / t.closed_collective_bytes if t.closed_collective_bytes else None
        ),
        # XLA:CPU widens bf16 products and all-reduces to f32: its compiled costs of a bf16
        # model are not the chip's, so no traced floor is derived from them
        comparable=t.backend != "cpu" or cfg.compute_dtype == "f32",
        traced_floor_s=traced_floor,
        traced_link_s=(t.collective_bytes / link) if link else None,
    )
    return report


def target_trace_report(args: argparse.Namespace) -> dict[str, Any]:
    """`kvjax trace --target NAME`: the step compiled for an accelerator, per kernel."""
    from kvjax.traced.target_step import trace_dict, trace_target_step

    target = parse_target(args.target)
    if args.chip is None and args.peak_flops is None and args.bandwidth is None:
        args.chip = target.spec.chip  # the roofline of the chip compiled for
    if args.stage == "lowered":
        raise KvjaxError(
            "--target compiles for the chip: its module is the compiled stage (the lowered "
            "module is the same on every target); drop --stage or pass --stage compiled"
        )
    if args.tp > 1 or args.dp > 1 or target.num_devices > 1:
        return target_sharded_report(args, target)
    if args.roofline or args.trace_layers != "all":
        raise KvjaxError(
            "--target compiles every layer as the chip would run it; drop --roofline and "
            "--trace-layers"
        )
    cfg, wl = resolve_model(args), resolve_workload(args)
    with render.progress(f"compiling {cfg.name} for {target.name} ({cfg.num_layers} layers)"):
        trace = trace_target_step(cfg, wl.phase, wl.batch, wl.context, target)
    report = trace_dict(trace, with_thunks=args.executed)
    return {
        "model": cfg.to_dict(),
        "workload": {"phase": wl.phase, "batch": wl.batch, "context": wl.context},
        "stage": "compiled",
        "backend": target.platform,
        "device": trace.device_kind,
        "target": report,
    }


def target_sharded_report(args: argparse.Namespace, target) -> dict[str, Any]:
    """`kvjax trace --target tpu-v5e:2x2 --tp 4`: one device's partitioned module on the slice,
    its collectives beside the closed form's (as `--tp` on this host's simulated devices)."""
    from functools import partial

    from kvjax.traced.target_compile import target_devices
    from kvjax.traced.target_costs import module_totals

    if target.platform != "tpu":
        raise KvjaxError(
            f"--tp/--dp with --target need a TPU slice (tpu-v5e:2x2); {target.name} compiles for "
            "one device"
        )
    if args.tp * args.dp != target.num_devices:
        raise KvjaxError(
            f"--tp {args.tp} x --dp {args.dp} = {args.tp * args.dp} devices, but "
            f"{target.name} has {target.num_devices}: they must be equal"
        )
    report = sharded_trace_report(
        args, devices=target_devices(target), count=partial(module_totals, hbm_only=True)
    )
    report.update(target=target.name, device=target_devices(target)[0].device_kind)
    return report
