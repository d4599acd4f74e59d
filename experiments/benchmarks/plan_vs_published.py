"""Benchmark: `kvjax plan` against what was deployed. For every MLPerf Server and Interactive
submission kvjax predicts (`kvjax.serving.system_predict.runnable`), plan searches the
submission's chips for its model in its dtypes, at its dataset's mean lengths, under its SLO at
its percentile, on its engine's settings (its max batch and token budget: the submission's
configuration file where stated), each step from the kernels held out from the submission's
implementation, as the row's own prediction is. Writes experiments/results/plan_vs_published.csv:
the measured result, the submitted placement's predicted value and its rank among the options
plan considered, plan's best option and its prediction, interval and bound, and what the row
says:

- `pessimistic`: plan's best < 0.9 x measured (its predictions are slow, or it misses a
  configuration the submitter ran);
- `try`: plan's best > 1.1 x its prediction of the submitted option, under another
  configuration (it names one to try);
- `optimistic`: its prediction of the submitted option > 1.1 x measured (a best above the
  measured result is the prediction's error, not a configuration to try);
- `agrees`: otherwise.

Submissions of one configuration (chips, model, dtypes, lengths, SLO, engine) share one search.

    python3 -m experiments.benchmarks.plan_vs_published [--only TEXT] [--limit N] [--out F]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import pandas as pd

from kvjax.files import write_text_atomic
from kvjax.serving.deployment import Placement
from kvjax.serving.plan import Planner
from kvjax.serving.plan_options import Option, Traffic
from kvjax.serving.slo_search import SLO_REQUESTS, SLO_SCENARIOS
from kvjax.serving.system_predict import deployment, held_fits, placement_of, runnable
from kvjax.serving.systems import read_systems

OUT = Path("experiments/results/plan_vs_published.csv")
LOW, HIGH = 0.9, 1.1  # plan's best against the measured result: pessimistic below, `try` above
# A row's own prediction serves SLO_REQUESTS a replica (a P99 over 1,000); the search screens every
# option on fewer and refines the best few, and the submitted option, on as many as its row's.
SCREEN_REQUESTS = 200
REFINED = 2


def submissions() -> list[dict[str, Any]]:
    """The MLPerf Server and Interactive rows kvjax predicts."""
    return [
        r
        for r in runnable(read_systems())
        if r["source"].startswith("mlperf-") and r["scenario"] in SLO_SCENARIOS
    ]


def planner_for(row: dict[str, Any], requests: int) -> tuple[Planner, Option]:
    """The row's search (on its chips, model, lengths, SLO and engine) and its submitted option."""
    fits = held_fits(row.get("implementation"))
    run = deployment(row, fits)
    d = run.deployment
    traffic = Traffic(
        run.input_len,
        run.output_len,
        slo_ttft_s=float(row["slo_ttft_s"]),
        slo_tpot_s=float(row["slo_tpot_s"]),
        percentile=100 * float(row["slo_percentile"] or 0.99),
        requests=requests,
    )
    planner = Planner(
        d.model,
        d.chip,
        int(row["num_chips"]),
        traffic,
        d.engine,
        (d.model.kv_dtype,),
        (d.engine.max_batch,),
        fits=fits,
        weight_scale=d.weight_scale,
        screen_requests=SCREEN_REQUESTS,
        refined_best=REFINED,
        refined_edge=0,
    )
    tp, pp, ep = placement_of(row)
    submitted = Placement(tp=tp, pp=pp, ep=ep, dp_attention=ep, replicas=run.replicas)
    return planner, Option(submitted, d.model.kv_dtype, d.engine.max_batch)


def value(r: dict[str, Any]) -> float:
    """An option's predicted output tokens/s a chip under the SLO (refined, else screened)."""
    if "predicted" in r:
        return r["predicted"] if r.get("meets_slo") else 0.0
    return r.get("screened", 0.0) if r.get("screened_meets") else 0.0


def search(planner: Planner, submitted: Option) -> dict[str, Any]:
    """Plan's search, the submitted option refined where the search did not, ranked."""
    start = time.perf_counter()
    rows = planner.search()
    mine = next(r for r in rows if r["option"] == submitted.label)
    if "predicted" not in mine and mine["status"] != "refused":
        mine |= planner.refine(submitted, planner.deployment(submitted))
    ranked = sorted((r for r in rows if value(r) > 0), key=value, reverse=True)
    best = ranked[0] if ranked else {}
    return {
        "options": len(rows),
        "considered": sum(r["status"] not in ("refused", "pruned") for r in rows),
        "submitted_predicted": value(mine),
        "submitted_rank": 1 + sum(value(r) > value(mine) for r in ranked) if value(mine) else None,
        "submitted_status": mine["status"],
        "best_option": best.get("option"),
        "best_predicted": value(best) if best else 0.0,
        "best_lo": best.get("predicted_lo"),
        "best_hi": best.get("predicted_hi"),
        "best_bound": best.get("bound"),
        "seconds": time.perf_counter() - start,
    }


def verdict(measured: float, submitted: float, best: float, same: bool) -> str:
    """What a row says of plan (module docstring), the first that holds."""
    if best < LOW * measured:
        return "pessimistic"
    if best > HIGH * submitted and not same:
        return "try"
    if submitted > HIGH * measured:
        return "optimistic"
    return "agrees"


def write_verdicts(path: Path) -> None:
    """The verdict column of a written table, again from its columns."""
    t = pd.read_csv(path)
    t["verdict"] = [
        verdict(
            r.measured_per_chip,
            r.submitted_predicted,
            r.best_predicted,
            r.best_option == r.submitted,
        )
        for r in t.itertuples()
    ]
    write_text_atomic(path, t.to_csv(index=False))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--requests", type=int, default=SLO_REQUESTS, help="a replica's in a refined run"
    )
    p.add_argument("--only", default="", help="sources containing this text only")
    p.add_argument("--limit", type=int, default=None, help="the first N submissions only")
    p.add_argument("--out", default=str(OUT))
    p.add_argument(
        "--verdicts", action="store_true", help="only the verdicts of --out, again from its columns"
    )
    p.add_argument("--resume", action="store_true", help="keep the rows --out holds, run the rest")
    a = p.parse_args()
    if a.verdicts:
        return write_verdicts(Path(a.out))
    rows, done = [], {}
    if a.resume and Path(a.out).exists():
        rows = pd.read_csv(a.out).to_dict("records")
    kept = {r["source"] for r in rows}
    for row in [r for r in submissions() if a.only in r["source"]][: a.limit]:
        if row["source"] in kept:
            continue
        planner, submitted = planner_for(row, a.requests)
        key = (planner.model, planner.chip.name, planner.chips, planner.traffic, planner.engine)
        if key not in done:
            done[key] = search(planner, submitted)
        found = done[key]
        chips, measured = planner.chips, float(row["measured"])
        per_chip = measured / chips if row["scope"] == "system" else measured
        out = {
            "source": row["source"],
            "scenario": row["scenario"],
            "model": row["model"],
            "chip": row["chip"],
            "chips": chips,
            "measured_per_chip": per_chip,
            "submitted": submitted.label,
            **found,
        }
        out["best_over_measured"] = out["best_predicted"] / per_chip
        out["submitted_over_best"] = (
            out["submitted_predicted"] / out["best_predicted"] if out["best_predicted"] else None
        )
        out["verdict"] = verdict(
            per_chip,
            out["submitted_predicted"],
            out["best_predicted"],
            out["best_option"] == submitted.label,
        )
        rows.append(out)
        print(
            f"{row['source']}: measured {per_chip:,.0f}/chip, submitted {submitted.label} "
            f"{out['submitted_predicted']:,.0f} (rank {out['submitted_rank']}), best "
            f"{out['best_option']} {out['best_predicted']:,.0f}: {out['verdict']}",
            flush=True,
        )
        write_text_atomic(a.out, pd.DataFrame(rows).to_csv(index=False))  # each row kept


if __name__ == "__main__":
    main()
