"""Benchmark: how long `kvjax plan` takes to search, on the 8-chip case of its issue (Llama-3.1-70B
on 8 H200, prompts 2,048, outputs 256, TTFT 2 s and TPOT 50 ms at P99) and on the same traffic
over 64 chips, each run once in this process; its answer beside its time (the best option, its
prediction and bound, the options screened, refined, pruned and refused). Writes
experiments/results/plan_search.json and, for the 8-chip case, paper_figures/plan.png.

    python3 -m experiments.benchmarks.plan_search [--cases 8,64]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import subprocess
import time
from pathlib import Path

import jax

from kvjax.cli.main import build_parser
from kvjax.cli.plan import planner_of
from kvjax.files import write_json_atomic
from kvjax.serving.plan_report import plan_report

CASE = (
    "plan --model llama-3.1-70b --chip h200 --prompt-len 2048 --output-len 256 "
    "--slo-ttft 2 --slo-tpot 0.05 --chips"
)
# what the JSON keeps of the best option
BEST = "option bound predicted predicted_lo predicted_hi per_user ttft_s tpot_s rate_per_s command"
OUT = Path("experiments/results/plan_search.json")
FIGURE = Path("paper_figures/plan.png")


def run_case(chips: int) -> dict:
    args = build_parser().parse_args([*CASE.split(), str(chips)])
    planner = planner_of(args)
    start = time.perf_counter()
    report = plan_report(planner, "llama-3.1-70b", None)
    seconds = time.perf_counter() - start
    best = report["best"] or {}
    return {
        "command": f"python3 -m kvjax {CASE} {chips}",
        "seconds": seconds,
        "counts": report["counts"],
        "best": {k: best.get(k) for k in BEST.split()},
        "frontier": [r["option"] for r in report["frontier"]],
        "report": report,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="8,64", help="chip counts, comma-separated")
    a = p.parse_args()
    git = ["git", "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, capture_output=True, text=True).stdout.strip()
    out = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "jax": jax.__version__,
        "commit": commit,
        "cases": {},
    }
    for chips in (int(c) for c in a.cases.split(",")):
        case = run_case(chips)
        print(f"{chips} chips: {case['seconds']:.1f} s, {case['counts']}, best {case['best']}")
        if chips == 8:
            from kvjax.plotting.plan import plan_figure

            plan_figure(case["report"], FIGURE)
        # the refined options kept (the README's table), the screened, pruned and refused counted
        report = case["report"]
        report["options"] = [r for r in report["options"] if r["status"] == "predicted"]
        out["cases"][str(chips)] = case
    write_json_atomic(OUT, out)


if __name__ == "__main__":
    main()
