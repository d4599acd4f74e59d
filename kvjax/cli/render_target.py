"""`kvjax trace --target`: the executable an accelerator would run, per kernel, as tables."""

from __future__ import annotations

from typing import Any

from kvjax.cli.render_common import _ratio, attention_label, console
from kvjax.units import fmt_bytes, fmt_count, fmt_rate


def _executed(kinds: dict[str, int]) -> str:
    return ", ".join(f"{n}x {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))


def print_target_trace(report: dict[str, Any]) -> None:
    from rich.table import Table

    con = console()
    m, wl, tg = report["model"], report["workload"], report["target"]
    con.print(
        f"[bold]{m['name']}[/bold] {attention_label(m)} | {wl['phase']} | B={wl['batch']:,} | "
        f"S={wl['context']:,} | compiled for [bold]{tg['device']}[/bold] ({tg['target']}) on "
        f"this host in {tg['compile_seconds']:.1f} s"
    )
    t = Table(title="per kernel, summed over layers: closed form vs the target's executable")
    for col in (
        "kernel",
        "closed FLOPs",
        "compiled FLOPs",
        "ratio",
        "closed bytes",
        "compiled bytes",
        "ratio",
        "executed as",
        "temporaries / extra",
    ):
        t.add_column(col, justify="left" if col[0] in "ket" else "right")
    for k in tg["kernels"]:
        extra = [f"{n}x {name}" for name, n in k["temporaries"].items()]
        if k["split_k_bytes"]:
            extra.append(f"split-K partials {fmt_rate(k['split_k_bytes'], 'B')}")
        if k["copy_bytes"]:
            extra.append(f"copies {fmt_rate(k['copy_bytes'], 'B')}")
        if k["convert_flops"] and k["kind"] == "matmul":
            extra.append(f"+{fmt_count(k['convert_flops'])} convert FLOPs")
        if k["fused_with"]:
            extra.append(
                "fused with "
                + ", ".join(k["fused_with"][:3])
                + ("..." if len(k["fused_with"]) > 3 else "")
            )
        t.add_row(
            k["name"],
            fmt_count(k["closed_flops"]) if k["closed_flops"] else "0",
            fmt_count(k["compiled_flops"]) if k["compiled_flops"] else "0",
            _ratio(k["flops_ratio"]),
            fmt_rate(k["closed_bytes"], "B"),
            fmt_rate(k["compiled_bytes"], "B"),
            _ratio(k["bytes_ratio"]),
            _executed(k["executed_as"]),
            "; ".join(extra),
        )
    con.print(t)
    tot, mem = tg["total"], tg["memory"]
    con.print(
        f"  step    FLOPs closed {fmt_count(tot['closed_flops'])} / compiled "
        f"{fmt_count(tot['compiled_flops'])}; bytes closed {fmt_rate(tot['closed_bytes'], 'B')} "
        f"/ compiled {fmt_rate(tot['compiled_bytes'], 'B')}; "
        f"{tot['executed_instructions']} executed instructions"
    )
    capacity = mem["device_memory_bytes"]
    verdict = "fits" if mem["fits"] else "[red]does not fit[/red]"
    con.print(
        f"  memory  {fmt_bytes(mem['step_bytes'])} a step (arguments "
        f"{fmt_bytes(mem['argument_bytes'])}, outputs {fmt_bytes(mem['output_bytes'])}, "
        f"aliased {fmt_bytes(mem['alias_bytes'])}, temporaries {fmt_bytes(mem['temp_bytes'])})"
        + (f" of {fmt_bytes(capacity)}: {verdict}" if capacity else "")
    )
    for note in tg["notes"]:
        con.print(f"  note    {note}")
