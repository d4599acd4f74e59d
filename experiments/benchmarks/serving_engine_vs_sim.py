"""Benchmark: the serving simulator, its step-time model fitted to this machine's measured steps,
against the real engine (`kvjax.measured.engine`) on the same small model, arrivals and lengths.

    python3 -m experiments.benchmarks.serving_engine_vs_sim [--model tiny-gqa] [--requests 150]
        [--prompt-len uniform:64:256] [--output-len uniform:32:64] [--out FILE]

One engine (one compile) serves every run:
1. saturation: every request at t = 0 (seed 1), three times; the median run's requests/s and
   tokens/s (another process may share the cores: the 1-minute load average is recorded around
   every run);
2. calibration: two runs on other seeds (101 at t = 0, 102 Poisson at 60% of saturation) and a
   sweep whose prompts are each chunk bucket long (every compiled shape measured), whose
   measured steps (batch composition and wall seconds) fit `kvjax.serving.fitted.FittedStepTime`
   by non-negative least squares; the compared runs below are never fitted on;
3. Poisson arrivals (seed 0) at 30%, 60% and 90% of the measured saturation rate, served by the
   engine and simulated with the fitted model on the same requests (same arrivals and lengths);
   the saturation run is simulated too.
The bounds (issue 41): TTFT and ITL P50 within 15%, P90 within 25%, saturation throughput within
15% (simulated / measured - 1). f32 on CPU (DESIGN.md). One JSON with every number, the command,
the jax version, the backend and device, and the date.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

from kvjax.files import write_json_atomic
from kvjax.model.config import get_model_config
from kvjax.serving.fitted import FittedStepTime
from kvjax.serving.load import generate
from kvjax.serving.scheduler import Request
from kvjax.serving.simulate import report, simulate

BOUNDS = {"p50": 0.15, "p90": 0.25, "saturation": 0.15}
LOADS = (0.3, 0.6, 0.9)
DIMS = {"layers": "num_layers", "d-model": "d_model", "heads": "num_heads",
        "kv-heads": "num_kv_heads", "head-dim": "head_dim", "d-ff": "d_ff",
        "vocab": "vocab_size"}  # fmt: skip


def _requests(n, rate, prompt, output, seed):
    reqs = generate(n, rate or 1.0, prompt, output, seed)
    if rate is None:  # saturation: everything at t = 0
        for r in reqs:
            r.arrival_s = 0.0
    return reqs


def _bucket_sweep(buckets, output_len: int = 8, each: int = 3, gap_s: float = 0.05):
    """Calibration that reaches every compiled chunk shape: `each` requests whose prompt is
    exactly a bucket long (one chunk of that bucket when it is admitted), `gap_s` apart, so
    some chunks run beside the decodes of the requests before them."""
    lens = [b for b in buckets for _ in range(each)]
    return [Request(i, i * gap_s, p, output_len) for i, p in enumerate(lens)]


def _latencies(rep: dict) -> dict:
    return {k: {q: rep[k][q] for q in ("mean", "p50", "p90", "p99")} for k in ("ttft_s", "itl_s")}


def _compare(engine_rep: dict, sim_rep: dict) -> dict:
    out = {}
    for k in ("ttft_s", "itl_s"):
        for q in ("p50", "p90"):
            e, s = engine_rep[k][q], sim_rep[k][q]
            err = s / e - 1
            out[f"{k[:-2]}_{q}"] = {
                "engine_s": e, "simulated_s": s, "relative_error": err, "bound": BOUNDS[q],
                "within": abs(err) <= BOUNDS[q],
            }  # fmt: skip
    return out


def run(model: str, overrides: dict, n: int, prompt: str, output: str, max_batch: int, max_len: int,
        token_budget: int, page_size: int, saturation_runs: int = 3) -> dict:  # fmt: skip
    import jax

    from kvjax.measured.engine import Engine
    from kvjax.measured.timing import device_name

    cfg = get_model_config(model, **overrides)
    if overrides:
        cfg = cfg.replace(name=f"{model}-" + "-".join(f"{k}{v}" for k, v in overrides.items()))
    eng = Engine(cfg, max_batch, max_len, token_budget, page_size)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    log(f"{cfg.name}: compiled {eng.compilations} shapes in {eng.warmup_s:.1f} s")

    loads = []  # the machine's load average around each run: another process shares the cores

    def serve(reqs, what):
        start, before = time.perf_counter(), os.getloadavg()[0]
        res = eng.serve(reqs)
        rep = report(res)
        loads.append({"run": what, "loadavg_1min_before": before,
                      "loadavg_1min_after": os.getloadavg()[0]})  # fmt: skip
        log(f"  {what}: {res.steps} steps, {time.perf_counter() - start:.1f} s, "
            f"{rep['throughput_tokens_per_s']:.0f} tokens/s, load {before:.1f}")  # fmt: skip
        return res, rep

    # 1. saturation: the median of repeated runs (the machine's speed moves between runs)
    sats = [serve(_requests(n, None, prompt, output, 1), f"saturation {k + 1}")[1]
            for k in range(saturation_runs)]  # fmt: skip
    sat_rep = sorted(sats, key=lambda r: r["throughput_tokens_per_s"])[len(sats) // 2]
    sat_rps = n / sat_rep["duration_s"]
    # 2. calibration on other seeds
    calib = [
        serve(_requests(n, None, prompt, output, 101), "calibration at t = 0")[0],
        serve(_requests(n, 0.6 * sat_rps, prompt, output, 102), "calibration at 60%")[0],
        serve(_bucket_sweep(eng.buckets), "calibration over the buckets")[0],
    ]
    steps = [(s.batch, s.wall_s) for r in calib for s in r.measured]
    mean_model, fit = FittedStepTime.fit(steps, eng.buckets)
    # each simulated step: the fitted mean times a measured/fitted ratio of a calibration step
    fitted = FittedStepTime(mean_model.coefficients_s, eng.buckets, spread=fit.spread, seed=0)
    log(f"  fit on {fit.steps} steps: median relative error {fit.median_relative_error:.1%}, "
        f"total {fit.total_relative_error:+.1%}")  # fmt: skip

    def sim(rate, seed):
        return report(simulate(_requests(n, rate, prompt, output, seed), eng.scheduler(), fitted))

    sim_sat = sim(None, 1)
    sat_err = sim_sat["throughput_tokens_per_s"] / sat_rep["throughput_tokens_per_s"] - 1
    points = []
    for load in LOADS:
        rate = load * sat_rps
        res, rep = serve(_requests(n, rate, prompt, output, 0), f"{load:.0%} of saturation")
        s = sim(rate, 0)
        points.append({
            "load": load, "rate_requests_per_s": rate,
            "engine": {**_latencies(rep), "throughput_tokens_per_s": rep["throughput_tokens_per_s"],
                       "steps": rep["steps"], "busy_fraction": rep["busy_fraction"],
                       "preemptions": rep["preemptions"],
                       "compilations_after_warmup": res.compilations_after_warmup},
            "simulated": {**_latencies(s), "throughput_tokens_per_s": s["throughput_tokens_per_s"],
                          "steps": s["steps"], "busy_fraction": s["busy_fraction"]},
            "comparison": _compare(rep, s),
        })  # fmt: skip
    within = all(c["within"] for p in points for c in p["comparison"].values())
    return {
        "benchmark": "serving_engine_vs_sim",
        "command": "python3 -m experiments.benchmarks.serving_engine_vs_sim "
        + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device": device_name(),
        "host": platform.node(),
        "model": cfg.to_dict(),
        "engine": {
            "max_batch": max_batch,
            "max_len": max_len,
            "token_budget": token_budget,
            "page_size": page_size,
            "buckets": list(eng.buckets),
            "kv_pool_tokens": eng.pool_pages * page_size,
            "prefix_caching": False,
            "compilations_at_warmup": eng.compilations,
            "warmup_s": eng.warmup_s,
        },  # fmt: skip
        "load": {
            "requests": n,
            "prompt_len": prompt,
            "output_len": output,
            "arrivals": "Poisson, seed 0 (compared); saturation seed 1; calibration seeds "
            "101 (t = 0) and 102 (Poisson at 60%), and the bucket sweep",
        },  # fmt: skip
        "saturation": {
            "engine_requests_per_s": sat_rps,
            "engine_tokens_per_s": sat_rep["throughput_tokens_per_s"],
            "engine_tokens_per_s_runs": [r["throughput_tokens_per_s"] for r in sats],
            "simulated_requests_per_s": n / sim_sat["duration_s"],
            "simulated_tokens_per_s": sim_sat["throughput_tokens_per_s"],
            "relative_error": sat_err,
            "bound": BOUNDS["saturation"],
            "within": abs(sat_err) <= BOUNDS["saturation"],
            "engine": _latencies(sat_rep),
            "simulated": _latencies(sim_sat),
        },  # fmt: skip
        "fit": {
            "steps": fit.steps,
            "coefficients_s": fit.coefficients_s,
            "median_relative_error": fit.median_relative_error,
            "mean_relative_error": fit.mean_relative_error,
            "total_relative_error": fit.total_relative_error,
        },  # fmt: skip
        "points": points,
        "machine_load": loads,
        "all_within_bounds": within and abs(sat_err) <= BOUNDS["saturation"],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-gqa")
    for flag, field in DIMS.items():
        parser.add_argument(f"--{flag}", type=int, default=None, help=f"override {field}")
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--prompt-len", default="uniform:64:256")
    parser.add_argument("--output-len", default="uniform:32:64")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=320)
    parser.add_argument("--token-budget", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument(
        "--out", type=Path, default=Path("experiments/results/serving_engine_vs_sim.json")
    )
    args = parser.parse_args(argv)
    given = {f: getattr(args, k.replace("-", "_")) for k, f in DIMS.items()}
    overrides = {f: v for f, v in given.items() if v is not None}
    result = run(args.model, overrides, args.requests, args.prompt_len, args.output_len,
                 args.max_batch, args.max_len, args.token_budget, args.page_size)  # fmt: skip
    write_json_atomic(args.out, result)
    s = result["saturation"]
    name = result["model"]["name"]
    print(f"{result['device']} {name}: saturation {s['engine_requests_per_s']:.1f} "
          f"requests/s, {s['engine_tokens_per_s']:.0f} tokens/s measured, "
          f"{s['simulated_tokens_per_s']:.0f} simulated ({s['relative_error']:+.1%})")  # fmt: skip
    for p in result["points"]:
        row = "; ".join(
            f"{k} {c['engine_s'] * 1e3:.2f} vs {c['simulated_s'] * 1e3:.2f} ms "
            f"({c['relative_error']:+.0%}{'' if c['within'] else ' OUT'})"
            for k, c in p["comparison"].items()
        )
        print(f"  {p['load']:.0%} ({p['rate_requests_per_s']:.1f}/s): {row}")
    print(f"all within bounds: {result['all_within_bounds']}; wrote {args.out}")


if __name__ == "__main__":
    main()
