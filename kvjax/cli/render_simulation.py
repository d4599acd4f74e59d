"""`kvjax simulate`'s report as tables: the deployment, the latencies' percentiles, energy and
cost, throughput and goodput."""

from __future__ import annotations

from typing import Any


def print_simulation(r: dict[str, Any]) -> None:
    from rich.table import Table

    from kvjax.cli.render import console
    from kvjax.units import fmt_seconds

    con = console()
    on = f"{r['tp']} x {r['chip']} (tensor parallel)" if r.get("tp", 1) > 1 else r["chip"]
    con.print(
        f"[bold]{r['model']}[/bold] on {on} | KV cache: {r['kv_pool_tokens']:,} tokens "
        f"({r['kv_pool_pages']:,} pages of {r['page_size']}"
        + (", each device its share of the heads" if r.get("tp", 1) > 1 else "")
        + f") | step time: {r['step_time']}"
    )
    if r.get("tp_note"):
        con.print(f"  ({r['tp_note']})")
    if r.get("engine"):
        _print_engine(con, r["engine"])
    if r.get("slot_bytes_per_request"):
        con.print(
            f"  each running request also holds {r['slot_bytes_per_request']:,} B of "
            "sliding windows and states (reserved for --max-batch requests)"
        )
    fit = r.get("fit")
    if fit:
        served = ", ".join(f"{v:.2f}x" for v in fit["served_speed"]) or "none saved"
        con.print(
            f"  fitted to {fit['steps']:,} steps of {fit['calibration_runs']} calibration "
            f"run(s) (median step error {fit['median_relative_error']:.1%}); the served "
            f"run, left out, ran at {served} the fit's time"
        )
    if r.get("whole_prefill_reason"):
        con.print(
            f"  prompts prefilled whole (token budget {r['token_budget']:,}), no prefix "
            f"cache: {r['whole_prefill_reason']}"
        )
    load = f", a closed loop of {r['concurrency']} clients" if r.get("concurrency") else ""
    t = Table(title=f"{r['requests_out']:,} of {r['requests_in']:,} requests served{load}")
    for col in ("", "mean", "P50", "P90", "P99"):
        t.add_column(col, justify="left" if not col else "right")
    for name, key in (
        ("time to first token", "ttft_s"),
        ("inter-token latency", "itl_s"),
        ("end to end", "e2e_s"),
    ):
        s = r[key]
        t.add_row(
            name,
            *("-" if s[k] is None else fmt_seconds(s[k]) for k in ("mean", "p50", "p90", "p99")),
        )
    con.print(t)
    if r.get("disaggregated"):
        n, tp = r["instances"], r["tp"]
        con.print(
            f"  disaggregated: prefill on {n['prefill']} instance(s), decode on "
            f"{n['decode']}, of {tp} chip(s) each ({(n['prefill'] + n['decode']) * tp} chips)"
        )
    if r.get("energy_j_per_output_token") is not None:
        price = r.get("cost_per_million_output_tokens")
        con.print(
            f"  energy {r['energy_j_per_output_token']:.3g} J/output token ({r['chips']} x "
            f"{r['power_watts']:g} W for the run)"
            + ("" if price is None else f"; ${price:.3g} per million output tokens")
        )
    slo = r["slo"]
    hit = "-" if r["prefix_hit_rate"] is None else f"{r['prefix_hit_rate']:.1%}"
    limits = [
        f"{name} <= {v} s"
        for name, v in (("TTFT", slo["ttft_s"]), ("ITL P99", slo["itl_p99_s"]))
        if v is not None
    ]
    met = f"{slo['met']} met " + ", ".join(limits) if limits else "no SLO given"
    con.print(
        f"  throughput {r['throughput_tokens_per_s']:,.0f} tokens/s; goodput "
        f"{r['goodput_requests_per_s']:.3g} requests/s ({met}); {r['preemptions']} preemptions; "
        f"peak {r['peak_pages_in_use']:,} pages; prefix hit rate {hit}"
    )


def _print_engine(con, engine: dict[str, Any]) -> None:
    """The --engine's profile and each setting it ran with: the value and where it comes from
    (the engine's cited line, or `given` by a flag)."""
    con.print(f"  engine {engine['profile']} ({engine['entry']}):")
    for name, used in engine["settings"].items():
        source = "a flag" if used["from"] == "given" else used["from"]
        con.print(f"    {name} = {used['value']}  [dim]({source})[/dim]")
