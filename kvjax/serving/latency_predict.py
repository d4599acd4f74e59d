"""MLPerf's P99 latencies predicted: a Server or Interactive submission's P99 time to first token
and time per output token, simulated at the rate the submission ran (its `rate_per_s`, queries/s,
a replica its share) on the same held-out deployment as its throughput row
(`system_predict.deployment`: the kernels and engine steps fitted without the row's
implementation), as LoadGen computes them (`slo_search.slo_percentiles`). The interval: the runs
repeated with every step at the held-out steps' 80% interval's ends (the simulator's own; no
latency row of another implementation calibrates it).

`experiments/benchmarks/latency_predictions.py` writes experiments/results/latency_predictions.csv;
`kvjax validate --json` summarizes it under `latency`: per metric the median |predicted /
measured - 1|, the interval's coverage and the median ratio, pooled and by chip family.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from kvjax.predict.groups import chip_family
from kvjax.serving.slo_search import SLO_SCENARIOS, slo_percentiles

LATENCY_METRICS = ("ttft_p99_s", "tpot_p99_s")  # in slo_percentiles' order
LATENCY_CSV = Path(__file__).parents[2] / "experiments" / "results" / "latency_predictions.csv"


def why_not_latency(row: dict[str, Any]) -> str | None:
    """Why this P99 row cannot be simulated (None: it can), as its throughput row would be."""
    from kvjax.serving.system_predict import why_not

    if row["metric"] not in LATENCY_METRICS or row["scenario"] not in SLO_SCENARIOS:
        return "only Server and Interactive rows' P99 TTFT and TPOT"
    if not row["rate_per_s"]:
        return "a latency row without the rate it ran at"
    # as a fixed-rate throughput row (no search over the rate: three runs, on any chip whose
    # offline rows are simulated, the B200's and GB200's with other chips' prefill fits)
    return why_not({**row, "metric": "output_tokens_per_s", "scenario": "rate"})


def predict_latency(row: dict[str, Any]) -> dict[str, tuple[float, float, float]]:
    """The row's P99 TTFT and TPOT at its rate, each (predicted, lo, hi), by metric."""
    from kvjax.serving.system_predict import deployment, held_fits

    fits = held_fits(row.get("implementation"))
    run = deployment(row, fits)
    pct = 100 * float(row["slo_percentile"] or 0.99)
    rate = float(row["rate_per_s"]) / run.replicas
    ends = (math.exp(fits.overhead.lo), math.exp(fits.overhead.hi))
    at = [slo_percentiles(run.serve(rate, f), pct) for f in (1.0, *ends)]
    return {
        m: (at[0][i], min(a[i] for a in at[1:]), max(a[i] for a in at[1:]))
        for i, m in enumerate(LATENCY_METRICS)
    }


def predict_latencies(
    rows: Iterable[dict[str, Any]], on_row: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Every simulable P99 row predicted (one set of runs a submission: its TTFT and TPOT)."""
    todo = [r for r in rows if why_not_latency(r) is None]
    out, runs = [], {}
    for r in todo:
        start = time.perf_counter()
        if r["source"] not in runs:
            runs[r["source"]] = predict_latency(r)
        v, lo, hi = runs[r["source"]][r["metric"]]
        p = {
            "source": r["source"],
            "metric": r["metric"],
            "chip": r["chip"],
            "implementation": r.get("implementation") or "",
            "rate_per_s": float(r["rate_per_s"]),
            "predicted_value": v,
            "predicted_lo": lo,
            "predicted_hi": hi,
            "measured": float(r["measured"]),
            "ratio": v / float(r["measured"]),
            "seconds": time.perf_counter() - start,
        }
        out.append(p)
        if on_row:
            on_row(p)
    return out


def _stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratio = np.array([r["predicted_value"] / r["measured"] for r in rows])
    inside = [r["predicted_lo"] <= r["measured"] <= r["predicted_hi"] for r in rows]
    return {
        "rows": len(rows),
        "median_abs_error": float(np.median(np.abs(ratio - 1))),
        "median_ratio": float(np.median(ratio)),
        "coverage_80": float(np.mean(inside)),
    }


def latency_summary(path: Path = LATENCY_CSV) -> dict[str, Any]:
    """Per metric, pooled and by chip family (empty where no predictions are committed)."""
    import pandas as pd

    if not Path(path).exists():
        return {}
    rows = pd.read_csv(path).to_dict("records")
    out: dict[str, Any] = {}
    for m in LATENCY_METRICS:
        mine = [r for r in rows if r["metric"] == m]
        if not mine:
            continue
        families = sorted({chip_family(r["chip"]) for r in mine})
        out[m] = _stats(mine) | {
            "by_chip_family": {
                f: _stats([r for r in mine if chip_family(r["chip"]) == f]) for f in families
            }
        }
    return out
