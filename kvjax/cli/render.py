"""Rendering of `kvjax trace` and `kvjax bench` (plain dicts) as rich tables, and the spinner
shown while a large model lowers. No numbers are computed here; `calc`'s report is drawn by
`render_calc`, the sharded and target traces by `render_parallel` and `render_target`."""

from __future__ import annotations

from typing import Any

from kvjax.cli.render_common import (  # noqa: F401 (re-exported)
    _ratio,
    attention_label,
    console,
)
from kvjax.units import fmt_count, fmt_rate, fmt_seconds, sig


class progress:
    """A spinner on stderr while a large model lowers (silent when stderr is not a terminal)."""

    def __init__(self, message: str):
        from rich.console import Console

        self.console = Console(stderr=True)
        self.status = self.console.status(message) if self.console.is_terminal else None

    def __enter__(self):
        if self.status:
            self.status.__enter__()
        return self

    def __exit__(self, *exc):
        if self.status:
            self.status.__exit__(*exc)


def print_trace(report: dict[str, Any]) -> None:
    from rich.table import Table

    con = console()
    m, wl = report["model"], report["workload"]
    con.print(
        f"[bold]{m['name']}[/bold] {attention_label(m)} | {wl['phase']} | "
        f"B={wl['batch']:,} | S={wl['context']:,} | XLA {report['stage']} stage on "
        f"{report['backend']} ({report['layers_traced']} layer(s) traced) | chip "
        f"{report['chip']['name']} | traced in {report['trace_seconds']:.1f} s"
    )
    if report["kernels"]:
        t = Table(title="per kernel, summed over layers: closed form vs XLA (lowered stage)")
        for col in (
            "kernel",
            "closed FLOPs",
            "traced FLOPs",
            "ratio",
            "closed bytes",
            "traced bytes",
            "ratio",
            "FLOP/byte",
            "bound",
            "side",
            "note",
        ):
            t.add_column(col, justify="left" if col in ("kernel", "side", "note") else "right")
        for k in report["kernels"]:
            note = ""
            off = k["bytes_ratio"] is None or abs(k["bytes_ratio"] - 1) > 0.05
            if k["explanation"] and (off or k["explanation"].startswith("interpreted")):
                note = k["explanation"].split(":")[0]
            t.add_row(
                k["name"],
                fmt_count(k["closed_flops"]) if k["closed_flops"] else "0",
                fmt_count(k["traced_flops"]) if k["traced_flops"] else "0",
                _ratio(k["flops_ratio"]),
                fmt_rate(k["closed_bytes"], "B"),
                fmt_rate(k["traced_bytes"], "B"),
                _ratio(k["bytes_ratio"]),
                sig(k["intensity"]) if k["intensity"] is not None else "-",
                fmt_seconds(k["bound_s"]),
                k["bound"],
                note,
            )
        con.print(t)
    tot = report["total"]
    con.print(
        f"  step        FLOPs closed {fmt_count(tot['closed_flops'])} / traced "
        f"{fmt_count(tot['traced_flops'])} (x{tot['flops_ratio']:.4f}); bytes closed "
        f"{fmt_rate(tot['closed_bytes'], 'B')} / traced {fmt_rate(tot['traced_bytes'], 'B')} "
        f"(x{tot['bytes_ratio']:.3f}); traced intensity {sig(tot['intensity'])} FLOP/byte; "
        f"bound {fmt_seconds(tot['bound_s'])} (closed form {fmt_seconds(tot['closed_bound_s'])})"
    )
    xla = report["xla_module"]
    if xla:
        con.print(
            f"  XLA module  flops {fmt_count(xla.get('flops', 0))}, bytes accessed "
            f"{fmt_rate(xla.get('bytes accessed', 0), 'B')} "
            f"({report['stage']}; "
            + ("not checked: see the note)" if report.get("interpreted") else "kernels sum to it)")
        )
    op = report["roofline_opinion"]
    if op:
        if "error" in op:
            con.print(f"  jax.experimental.roofline: no opinion ({op['error']})")
        else:
            con.print(
                f"  jax.experimental.roofline: {fmt_count(op['flops'])}FLOP unfused, "
                f"{fmt_rate(op['unfused_hbm_bytes'], 'B')} unfused HBM bytes"
            )
    for note in report["notes"]:
        con.print(f"  note: {note}")


def print_bench(report: dict[str, Any]) -> None:
    from rich.table import Table

    con = console()
    c, wl = report["ceilings"], report["workload"]
    con.print(
        f"[bold]{report['model']['name']}[/bold] {attention_label(report['model'])} | "
        f"{wl['phase']} | B={wl['batch']:,} | "
        f"S={wl['context']:,} | {report['device']}: {fmt_rate(c['peak_flops_per_s'], 'FLOP/s')}, "
        f"{fmt_rate(c['bandwidth_bytes_per_s'], 'B/s')} measured {c['date']}"
    )
    t = Table(title="measured kernels (one layer each; step = the whole step as served)")
    cols = (
        "h_kv",
        "kernel",
        "bound",
        "closed bytes",
        "traced bytes",
        "median",
        "IQR",
        "achieved",
        "of bound",
    )
    for col in cols:
        t.add_column(col, justify="left" if col == "kernel" else "right")
    marked = []
    for p in report["points"]:
        mark = ""
        if p.get("executed_as"):
            mark = " *" if p.get("interpreted") else " †"
            marked.append(f"{p['kernel']}{mark} runs as {p['executed_as']}")
        t.add_row(
            str(p["num_kv_heads"]),
            p["kernel"] + mark,
            f"{fmt_seconds(p['bound_s'])} {p['bound'][:3]}",
            fmt_rate(p["closed_bytes"], "B"),
            fmt_rate(p["traced_bytes"], "B") if p.get("traced_bytes") else "-",
            fmt_seconds(p["median_s"]),
            fmt_seconds(p["iqr_s"]) if p["iqr_s"] > 0 else "0",
            fmt_rate(p["achieved_bytes_per_s"], "B/s"),
            f"{100 * p['fraction_of_bound']:.0f}%",
        )
    con.print(t)
    for line in dict.fromkeys(marked):
        con.print(f"  {line}")
    if any(p.get("interpreted") for p in report["points"]):
        con.print(
            "  * interpreted: Pallas has no CPU backend, so this time is the interpreter's, "
            "not the kernel's (its values are checked against XLA's form); time it on a GPU"
        )
