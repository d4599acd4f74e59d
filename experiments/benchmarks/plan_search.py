"""Benchmark: how long `kvjax plan` takes to search, on the 8-chip case of its issue (Llama-3.1-70B
on 8 H200, prompts 2,048, outputs 256, TTFT 2 s and TPOT 50 ms at P99) and on the same traffic
over 64 chips, each run once in this process; its answer beside its time (the best option, its
prediction and bound, the options screened, refined, pruned and refused). Two more cases show
prefill and decode apart winning and losing (Llama-3.1-8B on 8 H100: 8,192-token prompts under a
12 ms TPOT; 256-token prompts and 512-token outputs under 50 ms). Writes
experiments/results/plan_search.json and, for the 8-chip case, paper_figures/plan.png.

    python3 -m experiments.benchmarks.plan_search [--cases 8,64,disagg-wins,disagg-loses]
"""

from __future__ import annotations

import argparse
import datetime
import json
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
DISAGG = "plan --model llama-3.1-8b --chip h100-sxm --chips 8 --kv-dtypes bf16 --slo-ttft 2 "
CASES = {
    "8": f"{CASE} 8",
    "64": f"{CASE} 64",
    "disagg-wins": DISAGG + "--prompt-len 8192 --output-len 256 --slo-tpot 0.012",
    "disagg-loses": DISAGG + "--prompt-len 256 --output-len 512 --slo-tpot 0.05",
}
# what the JSON keeps of the best option
BEST = "option bound predicted predicted_lo predicted_hi per_user ttft_s tpot_s rate_per_s command"
OUT = Path("experiments/results/plan_search.json")
FIGURE = Path("paper_figures/plan.png")


def run_case(name: str) -> dict:
    args = build_parser().parse_args(CASES[name].split())
    planner = planner_of(args)
    start = time.perf_counter()
    report = plan_report(planner, args.model, None)
    seconds = time.perf_counter() - start
    best = report["best"] or {}
    return {
        "command": f"python3 -m kvjax {CASES[name]}",
        "seconds": seconds,
        "counts": report["counts"],
        "best": {k: best.get(k) for k in BEST.split()},
        "frontier": [r["option"] for r in report["frontier"]],
        "report": report,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help="of CASES, comma-separated")
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
    old = OUT.exists() and json.loads(OUT.read_text())
    if old and old.get("commit"):  # the cases not run this time stay
        out["cases"] = old["cases"]
    for name in a.cases.split(","):
        case = run_case(name)
        print(f"{name}: {case['seconds']:.1f} s, {case['counts']}, best {case['best']}")
        if name == "8":
            from kvjax.plotting.plan import plan_figure

            plan_figure(case["report"], FIGURE)
        # the refined options kept (the README's table), the screened, pruned and refused counted
        report = case["report"]
        report["options"] = [r for r in report["options"] if r["status"] == "predicted"]
        out["cases"][name] = case | {"commit": commit, "date": out["date"]}
    write_json_atomic(OUT, out)


if __name__ == "__main__":
    main()
