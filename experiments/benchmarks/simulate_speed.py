"""Benchmark: how long `kvjax simulate` takes on issue 50's case (Llama-3-8B FP8 on one H100, 3,000
requests of 1000/1000 tokens at once, bound step times), run in this process, the median of
`--repeat` runs, and the result's digest, so a faster simulator is seen to give the same answer.

    python3 -m experiments.benchmarks.simulate_speed [--repeat 3] [--max-batch 256]
        [--out experiments/results/simulate_speed.json]

`--label` names the code measured (a commit); each run appends its record to the file's list, so
the file holds the before and the after side by side. The digest is of what the simulation
computed (`RESULT`: every time, rate and count of the report), so equal digests are the same
answer to the last bit.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

from kvjax.cli.main import build_parser
from kvjax.cli.simulate import simulate_report
from kvjax.files import write_json_atomic

CASE = ("simulate --model llama-3-8b --chip h100-sxm --weight-dtype fp8 --kv-dtype fp8 "
        "--attention-kernel flash --rate 1000 --requests 3000 --prompt-len 1000 --output-len 1000 "
        "--token-budget 8192 --step-time bound")  # fmt: skip


# what the simulation computed (the report's keys; not the flags echoed beside them)
RESULT = ("requests_in", "requests_out", "ttft_s", "itl_s", "e2e_s", "throughput_tokens_per_s",
          "goodput_requests_per_s", "slo", "preemptions", "steps", "busy_fraction",
          "mean_requests_in_system", "peak_pages_in_use", "prefix_hit_rate", "output_tokens",
          "duration_s")  # fmt: skip


def digest(result: dict) -> str:
    picked = {k: result[k] for k in RESULT}
    return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--label", default=None, help="default: the checkout's commit")
    p.add_argument("--out", default="experiments/results/simulate_speed.json")
    a = p.parse_args()
    args = build_parser().parse_args([*CASE.split(), "--max-batch", str(a.max_batch)])
    times, digests, result = [], set(), None
    for _ in range(a.repeat):
        start = time.perf_counter()
        result = simulate_report(args)
        times.append(time.perf_counter() - start)
        digests.add(digest(result))
    label = a.label or subprocess.run(["git", "rev-parse", "--short", "HEAD"], text=True,
                                      capture_output=True).stdout.strip()  # fmt: skip
    record = {
        "label": label, "command": f"kvjax {CASE} --max-batch {a.max_batch}",
        "seconds": times, "median_s": statistics.median(times), "result_digests": sorted(digests),
        "throughput_tokens_per_s": result["throughput_tokens_per_s"],
        "preemptions": result["preemptions"], "steps": result["steps"],
        "machine": platform.processor() or platform.machine(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }  # fmt: skip
    out = Path(a.out)
    records = json.loads(out.read_text()) if out.exists() else []
    write_json_atomic(out, [*records, record])
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
