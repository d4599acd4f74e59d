"""`kvjax plan`'s answer (`kvjax.serving.plan` searches): the best option that meets the SLO, the
`kvjax simulate` line that runs it, and the report of every option with the frontier."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kvjax.serving.plan import Planner, Traffic, frontier


def best_option(rows: list[dict[str, Any]], traffic: Traffic) -> dict[str, Any] | None:
    """The option with the most predicted output tokens/s per chip that meets the SLO; on a tie
    the one of least quality cost, then the most tokens/s per user."""
    ok = [r for r in rows if r.get("predicted") and r.get("meets_slo", not traffic.has_slo)]
    if not ok:
        return None
    return max(ok, key=lambda r: (r["predicted"], -(r.get("quality_cost") or 0), r["per_user"]))


def simulate_command(
    model: str,
    chip: str,
    traffic: Traffic,
    row: dict[str, Any],
    engine: str | None,
    link: float | None = None,
) -> str:
    """The `kvjax simulate` line that runs the option under the plan's load (a disaggregated
    one's KV over `link` B/s a chip where given, else the chip's interconnect)."""
    t = traffic
    flags = row.get("model_flags")
    parts = [
        f"python3 -m kvjax simulate --model {model} --chip {chip}" + (f" {flags}" if flags else ""),
        f"--prompt-len {t.prompt_len} --output-len {t.output_len}",
    ]
    if t.concurrency is not None:
        parts.append(f"--concurrency {t.concurrency}")
    else:
        parts.append(f"--rate {row.get('rate_per_s') or t.rate:.6g}")
    if row.get("prefill"):
        x, y = row["prefill"], row["decode"]
        parts.append(f"--requests {t.requests * max(x, y)} --disaggregate {x}P{y}D")
        parts.append(f"--tp {row['tp']} --kv-dtype {row['kv_dtype']}")
        parts.append(f"--max-batch {row['max_batch']} --step-time kernels")
        if link is not None:
            parts.append(f"--link-gb-per-s {link / 1e9:g}")
        return _engine_and_slo(parts, t, engine)
    parts.append(f"--requests {t.requests * row['replicas']}")
    if row["ep"] > 1:
        parts.append(f"--ep {row['ep']} --dp-attention {row['dp_attention']}")
    else:
        parts.append(f"--tp {row['tp']} --pp {row['pp']}")
    parts.append(f"--replicas {row['replicas']} --kv-dtype {row['kv_dtype']}")
    parts.append(f"--max-batch {row['max_batch']} --step-time kernels")
    return _engine_and_slo(parts, t, engine)


def _engine_and_slo(parts: list[str], t: Traffic, engine: str | None) -> str:
    if engine:
        parts.append(f"--engine {engine}")
    if t.slo_ttft_s is not None:
        parts.append(f"--slo-ttft {t.slo_ttft_s:g}")
    # its TPOT at the percentile is the report's `tpot_s` (simulate's --slo-itl is another
    # SLO: each request's inter-token times at their P99)
    return " ".join(parts)


def plan_report(
    planner: Planner,
    model_name: str,
    engine: str | None,
    search: Callable[[Planner], list[dict[str, Any]]] | None = None,
    **about: Any,
) -> dict[str, Any]:
    """The search's answer: `planner.search()`'s, or `search(planner)`'s (`kvjax plan
    --variants`: over the model's attention variants), `about` the search in the report."""
    start = time.perf_counter()
    rows = search(planner) if search else planner.search()
    best = best_option(rows, planner.traffic)
    if best is not None and best.get("variant") and best.get("model_flags") is None:
        why = f"no simulate flags say the variant {best['variant']}"  # never the base model
        best = best | {"command": None, "command_note": why}
    elif best is not None:
        best = best | {
            "command": simulate_command(
                model_name,
                planner.chip.name,
                planner.traffic,
                best,
                engine,
                planner.link_bytes_per_s,
            )
        }
    t = planner.traffic
    counts = {
        s: sum(r["status"] == s for r in rows)
        for s in ("predicted", "screened", "pruned", "refused")
    }
    return {
        "model": planner.model.name,
        "chip": planner.chip.name,
        "chips": planner.chips,
        "nodes": planner.nodes,
        "link_gb_per_s": (planner.link_bytes_per_s or planner.chip.interconnect_bytes_per_s or 0)
        / 1e9,
        "traffic": {
            "prompt_len": t.prompt_len,
            "output_len": t.output_len,
            "rate": t.rate,
            "concurrency": t.concurrency,
            "slo_ttft_s": t.slo_ttft_s,
            "slo_tpot_s": t.slo_tpot_s,
            "slo_percentile": t.percentile,
            "requests_a_run": t.requests,
        },
        "engine": engine or "kvjax",
        **about,
        "options": rows,
        "counts": counts,
        "frontier": frontier(rows),
        "best": best,
        "seconds": time.perf_counter() - start,
    }
