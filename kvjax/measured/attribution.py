"""The in-situ profile as rows: time per kernel (or group of kernels XLA fused) inside the real
step, beside the compiled module's and the closed form's FLOPs and bytes, placed on the measured
roofline. Every number a row shows is either measured (time), read from the compiled module
(per instruction, `kvjax.traced.compiled`) or the closed form (`kvjax.analytic`)."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import asdict, dataclass

import numpy as np

from kvjax import analytic, kernels
from kvjax.analytic import roofline
from kvjax.hardware import ChipSpec
from kvjax.measured.profile import StepProfile
from kvjax.traced.compiled import UNNAMED

# A kernel is flagged when its median time is below its bound by more than this: timing noise
# on a shared machine is a few percent, a wrong roof or a wrong byte count is more.
ABOVE_ROOF_TOLERANCE = 0.05


@dataclass
class KernelRow:
    name: str  # the members joined by " + "
    members: tuple[str, ...]
    ops: int  # executed instructions attributed to the row
    median_s: float
    q25_s: float
    q75_s: float
    compiled_flops: float
    compiled_bytes: float
    closed_flops: float
    closed_bytes: float


def _groups(profile: StepProfile) -> list[tuple[str, ...]]:
    """Kernels that share an executed op, joined transitively (union-find), in registry order."""
    parent: dict[str, str] = {}

    def find(k: str) -> str:
        while parent.setdefault(k, k) != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for key in profile.op_s:
        names = profile.ops[key].kernels
        for other in names[1:]:
            parent[find(other)] = find(names[0])
        find(names[0])
    order = {name: i for i, name in enumerate(kernels.REGISTRY)}
    groups: dict[str, list[str]] = {}
    for k in parent:
        groups.setdefault(find(k), []).append(k)
    ranked = [tuple(sorted(g, key=lambda k: order.get(k, len(order)))) for g in groups.values()]
    return sorted(ranked, key=lambda g: order.get(g[0], len(order)))


def kernel_rows(profile: StepProfile) -> list[KernelRow]:
    closed = analytic.step_kernels(profile.cfg, profile.workload)
    rows = []
    for members in _groups(profile):
        keys = [key for key in profile.op_s if set(profile.ops[key].kernels) <= set(members)]
        per_step = np.sum([profile.op_s[key] for key in keys], axis=0)
        q25, q75 = np.quantile(per_step, [0.25, 0.75])
        rows.append(
            KernelRow(
                name=" + ".join(members),
                members=members,
                ops=len(keys),
                median_s=float(statistics.median(per_step)),
                q25_s=float(q25),
                q75_s=float(q75),
                compiled_flops=sum(profile.ops[k].cost.flops for k in keys),
                compiled_bytes=sum(profile.ops[k].cost.bytes for k in keys),
                closed_flops=sum(closed[m].flops for m in members if m in closed),
                closed_bytes=sum(closed[m].bytes for m in members if m in closed),
            )
        )
    return rows


def _place(row: dict, peak: float, bw: float) -> dict:
    """Bound, achieved rates and the above-the-roof flag of one row (or the step)."""
    t = row["median_s"]
    on_roof = roofline.point(row["name"], row["closed_flops"], row["closed_bytes"], peak, bw)
    compiled = roofline.point(row["name"], row["compiled_flops"], row["compiled_bytes"], peak, bw)
    row.update(
        bound_s=on_roof.bound_s,
        bound=on_roof.bound,
        compiled_bound_s=compiled.bound_s,
        fraction_of_bound=on_roof.bound_s / t if t else None,
        achieved_bytes_per_s=row["closed_bytes"] / t if t else None,
        achieved_compiled_bytes_per_s=row["compiled_bytes"] / t if t else None,
        achieved_flops_per_s=row["closed_flops"] / t if t else None,
        above_roof=None,
    )
    if t and t < (1 - ABOVE_ROOF_TOLERANCE) * on_roof.bound_s:
        if row["compiled_bytes"] < row["closed_bytes"]:
            row["above_roof"] = (
                "beats the closed form's bound because the fused, compiled ops move fewer bytes "
                f"({row['compiled_bytes']:.3g}) than the unfused closed form counts "
                f"({row['closed_bytes']:.3g})"
            )
        else:
            row["above_roof"] = (
                "faster than the measured ceilings allow for the bytes the closed form counts: "
                "a ceiling is too low (or a cache held the data)"
            )
    return row


def profile_report(profile: StepProfile, ceilings: ChipSpec) -> dict:
    """Rows, the whole step and coverage, on the measured roofline of `ceilings`."""
    peak = ceilings.peak(profile.cfg.compute_dtype)
    bw = ceilings.bandwidth_bytes_per_s
    rows = [_place(asdict(r), peak, bw) for r in kernel_rows(profile)]
    step = analytic.step_cost(profile.cfg, profile.workload)
    wall = statistics.median(profile.wall_s)
    attributed = sum(r["median_s"] for r in rows)
    step_row = _place(
        {
            "name": kernels.STEP_KERNEL,
            "median_s": wall,
            "closed_flops": step.flops,
            "closed_bytes": step.bytes,
            "compiled_flops": sum(r["compiled_flops"] for r in rows),
            "compiled_bytes": sum(r["compiled_bytes"] for r in rows),
        },
        peak,
        bw,
    )
    if profile.cfg.attention_kernel == "flash":  # what runs the fused attention here
        from kvjax.measured.kernels import flash_execution

        runs = flash_execution(profile.cfg, profile.workload.phase)
        for r in [*[r for r in rows if kernels.ATTENTION in r["members"]], step_row]:
            # a Pallas kernel interpreted on a CPU: its time is the interpreter's
            r.update(executed_as=runs, interpreted=runs == "pallas interpret")
    unnamed = [r["name"] for r in rows if UNNAMED in r["members"] or kernels.OTHER in r["members"]]
    return {
        "model": profile.cfg.to_dict(),
        "workload": {
            "phase": profile.workload.phase,
            "batch": profile.workload.batch,
            "context": profile.workload.context,
        },
        "device": profile.device,
        "steps": profile.steps,
        "ceilings": {
            "name": ceilings.name,
            "peak_flops_per_s": peak,
            "bandwidth_bytes_per_s": bw,
            "date": ceilings.date,
        },
        "rows": rows,
        "step": step_row,
        "coverage": attributed / wall if wall else None,
        "unattributed_rows": unnamed,
        "unmatched_ops": profile.unmatched_events,
        "trace_dir": profile.trace_dir,
    }


def _ceiling_too_low(report: dict) -> bool:
    return any("ceiling is too low" in (r["above_roof"] or "") for r in report["rows"])


def reports_on_ceilings(profiles: list[StepProfile], ceilings: ChipSpec, remeasure=None) -> list:
    """`profile_report` of each profile; when a kernel ran faster than the ceilings allow, the
    ceilings are measured again (`remeasure()`) and the rows placed on the higher of the two
    (a ceiling is an upper bound). What is still above the roof keeps its flag."""
    reports = [profile_report(p, ceilings) for p in profiles]
    if remeasure is None or not any(_ceiling_too_low(r) for r in reports):
        return reports
    fresh = remeasure()
    peaks = {
        d: max(v, fresh.peak_flops_per_s.get(d, 0.0)) for d, v in ceilings.peak_flops_per_s.items()
    }
    best = dataclasses.replace(
        ceilings,
        peak_flops_per_s=peaks,
        bandwidth_bytes_per_s=max(ceilings.bandwidth_bytes_per_s, fresh.bandwidth_bytes_per_s),
        notes=f"{ceilings.notes}; re-measured after a kernel beat it: the higher of both kept",
    )
    return [{**profile_report(p, best), "ceilings_remeasured": True} for p in profiles]


def report_records(report: dict, **common) -> list[dict]:
    """A profile report as flat records (one per row and one for the step) for a run folder:
    the `profile` experiment's and the GPU check's, drawn by `kvjax figures` (kernel_bound)."""
    wl, c = report["workload"], report["ceilings"]
    base = {
        "model": report["model"]["name"],
        "num_kv_heads": report["model"]["num_kv_heads"],
        "phase": wl["phase"],
        "batch": wl["batch"],
        "context": wl["context"],
        "device": report["device"],
        "chip": c["name"],
        "peak_flops_per_s": c["peak_flops_per_s"],
        "bandwidth_bytes_per_s": c["bandwidth_bytes_per_s"],
        "coverage": report["coverage"],
        "steps": report["steps"],
        "trace_dir": report["trace_dir"],
        "source": "in situ",
        **common,
    }
    rows = [*report["rows"], report["step"]]
    return [{**base, **{("kernel" if k == "name" else k): v for k, v in r.items()}} for r in rows]
