"""Rendering of the placed reports (`kvjax calc --tp/--ep/--pp`, `kvjax trace --tp`) as rich
tables. No numbers are computed here."""

from __future__ import annotations

from typing import Any

from kvjax.cli.render_common import _ratio, attention_label, console
from kvjax.units import fmt_bytes, fmt_count, fmt_rate, fmt_seconds


def print_placements(report: dict[str, Any]) -> None:
    if report.get("tensor_parallel"):
        print_tensor_parallel(report, report["tensor_parallel"])
    if report.get("pipeline"):
        print_pipeline(report["pipeline"])


def print_pipeline(p: dict[str, Any]) -> None:
    """`calc --pp`: each stage on one device, and what runs between them."""
    from rich.table import Table

    t = Table(
        title=f"pipeline: {p['pp']} stages x tp {p['tp']} = {p['devices']} devices (one device "
        "of each stage)"
    )
    for col in ("stage", "layers", "weights", "KV cache", "FLOPs", "bytes", "bound"):
        t.add_column(col, justify="right")
    for st in p["stages"]:
        t.add_row(
            str(st["index"]),
            str(st["layers"]),
            fmt_bytes(st["weight_bytes"]),
            fmt_bytes(st["kv_cache_bytes"]),
            f"{st['flops']:.3g}",
            fmt_bytes(st["bytes"]),
            fmt_seconds(st["bound_s"]),
        )
    con = console()
    con.print(t)
    hop = "-" if p["stage_link_s"] is None else fmt_seconds(p["stage_link_s"])
    con.print(
        f"  between stages: {fmt_bytes(p['stage_message_bytes'])} a device a step ({hop} over "
        f"the link); period {fmt_seconds(p['period_s'])} (the slowest stage, micro-batches in "
        f"flight), latency {fmt_seconds(p['latency_s'])} through all; one micro-batch alone "
        f"idles {p['bubble_with_one_micro_batch']:.0%}"
    )


def print_tensor_parallel(report: dict[str, Any], points: list[dict[str, Any]]) -> None:
    from rich.table import Table

    wl = report["workload"]
    t = Table(
        title=f"placed on devices: per device, {wl['phase']} B={wl['batch']:,} S={wl['context']:,} "
        "(sizes GiB binary; collectives per step, ring; link = bytes / link bandwidth"
        + (
            f" + messages x {fmt_seconds(points[0]['link_latency_s'])})"
            if points and points[0]["link_latency_s"]
            else ", bandwidth only)"
        )
    )
    for col in (
        "devices",
        "split",
        "KV heads/dev",
        "KV copies",
        "weights/dev",
        "KV cache/dev",
        "fits",
        "collectives/dev",
        "HBM floor",
        "link",
        "step floor (overlapped)",
        "serial",
    ):
        t.add_column(col, justify="right")
    for p in points:
        t.add_row(
            str(p.get("devices", p["tp"])),
            split_label(p),
            str(p["kv_heads_per_device"]),
            f"{p['kv_replication']:g}x",
            fmt_bytes(p["weight_bytes_per_device"]),
            fmt_bytes(p["kv_cache_bytes_per_device"]),
            "-" if p["fits_in_memory"] is None else ("yes" if p["fits_in_memory"] else "no"),
            collectives_cell(p),
            fmt_seconds(p["compute_memory_floor_s"]),
            "-" if p["link_s"] is None else fmt_seconds(p["link_s"]) if p["link_s"] else "0",
            "-" if p["step_floor_s"] is None else fmt_seconds(p["step_floor_s"]),
            "-" if p.get("serial_step_s") is None else fmt_seconds(p["serial_step_s"]),
        )
    console().print(t)


def split_label(p: dict[str, Any]) -> str:
    """tp8, dp8 x ep8, dp2 x tp4: the axes over one."""
    parts = [
        f"{n}{p.get(k, 1)}"
        for n, k in (("dp", "dp_attention"), ("tp", "tp"), ("ep", "ep"))
        if p.get(k, 1) > 1
    ]
    return " x ".join(parts) or "1"


def collectives_cell(p: dict[str, Any]) -> str:
    """Bytes one device sends a step, and by kind where there are several kinds."""
    kinds = p.get("collectives") or {}
    total = fmt_rate(p["collective_bytes_per_step"], "B")
    if len(kinds) < 2 and "all-to-all" not in kinds:
        return total
    return (
        total
        + " ("
        + ", ".join(f"{k} {fmt_rate(v['bytes_per_device'], 'B')}" for k, v in kinds.items())
        + ")"
    )


def print_sharded_trace(report: dict[str, Any]) -> None:
    """`kvjax trace --tp N`: one device's compiled step and its collectives vs the closed form."""

    con = console()
    m, wl, c = report["cfg"], report["workload"], report["closed_form"]
    con.print(
        f"[bold]{m['name']}[/bold] {attention_label(m)} | {wl['phase']} | "
        f"B={wl['batch']:,} | S={wl['context']:,} | tp={report['tp']} dp={report['dp']}"
        f"{' ep=' + str(report['dp']) if report.get('expert_parallel') else ''} | XLA "
        f"compiled stage on {report['backend']}, per device (layers compiled: "
        f"{'/'.join(map(str, report['layers_traced']))}) | {report['trace_seconds']:.1f} s"
    )
    _print_device_step(con, report)
    _print_collectives(con, report)
    if report.get("hosts", 1) > 1:
        total = report["collective_bytes"]
        con.print(
            f"  across {report['hosts']} hosts ({report['host_source']}): a device sends "
            f"{fmt_rate(report['cross_host_collective_bytes'], 'B')} in collectives whose groups "
            f"span hosts and {fmt_rate(total - report['cross_host_collective_bytes'], 'B')} "
            f"within one; the step puts {fmt_rate(report['inter_host_link_bytes'], 'B')} on "
            "links between hosts (each group's ring ordered host by host)"
        )
    chip = report["chip"]
    link = report["traced_link_s"]
    traced = (
        f"traced floor {fmt_seconds(report['traced_floor_s'])} + link "
        f"{'-' if link is None else fmt_seconds(link)}"
        if report["comparable"]
        else "no traced floor (see the note)"
    )
    con.print(
        f"  on {chip['name']}: closed form KV cache/device "
        f"{fmt_bytes(c['kv_cache_bytes_per_device'])} ({c['kv_heads_per_device']} KV heads, "
        f"{c['kv_replication']:g}x copies), weights/device "
        f"{fmt_bytes(c['weight_bytes_per_device'])}"
        f"; floor {fmt_seconds(c['compute_memory_floor_s'])}, link "
        f"{'-' if c['link_s'] is None else fmt_seconds(c['link_s'])} (overlapped in the bound: "
        f"the larger); {traced}"
    )
    for note in report["notes"]:
        con.print(f"  note: {note}")


def _print_device_step(con, report: dict[str, Any]) -> None:
    """One device's FLOPs, bytes and collective bytes: the closed form against the compiled."""
    from rich.table import Table

    t = Table(title="one device's step: closed form vs compiled module")
    for col in ("", "closed form", "traced", "ratio"):
        t.add_column(col, justify="left" if not col else "right")
    t.add_row(
        "FLOPs",
        fmt_count(report["closed_flops_per_device"]),
        fmt_count(report["flops_per_device"]),
        _ratio(report["flops_ratio"]),
    )
    t.add_row(
        "bytes",
        fmt_rate(report["closed_bytes_per_device"], "B"),
        fmt_rate(report["bytes_per_device"], "B"),
        _ratio(report["bytes_ratio"]),
    )
    t.add_row(
        "collective bytes sent",
        fmt_rate(report["closed_collective_bytes"], "B"),
        fmt_rate(report["collective_bytes"], "B"),
        _ratio(report["collective_ratio"]),
    )
    con.print(t)


def _print_collectives(con, report: dict[str, Any]) -> None:
    """Each kind of collective in the compiled HLO: counts and bytes, closed form and traced."""
    from rich.table import Table

    k = Table(title="collectives in the compiled HLO (bytes one device sends, ring algorithms)")
    closed_kinds = report.get("closed_collectives") or {}
    for col in ("kind", "closed count", "traced count", "closed bytes", "traced bytes"):
        k.add_column(col, justify="left" if col == "kind" else "right")
    kinds = list(report["closed_collective_counts"]) + [
        x for x in report["collectives"] if x not in report["closed_collective_counts"]
    ]
    for kind in kinds:
        row = report["collectives"].get(kind, {"count": 0, "bytes_per_device": 0})
        k.add_row(
            kind,
            str(report["closed_collective_counts"].get(kind, 0)),
            f"{row['count']:g}",
            fmt_rate(closed_kinds.get(kind, {}).get("bytes_per_device", 0), "B"),
            fmt_rate(row["bytes_per_device"], "B"),
        )
    if kinds:
        con.print(k)
