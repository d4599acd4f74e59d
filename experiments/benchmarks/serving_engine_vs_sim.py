"""Benchmark: the serving simulator, its step-time model fitted to this machine's measured steps,
against the real engine (`kvjax.measured.engine`) on the same small model, arrivals and lengths.

    python3 -m experiments.benchmarks.serving_engine_vs_sim [--model tiny-gqa] [--requests 200]
        [--prompt-len uniform:64:256] [--output-len uniform:32:64] [--rounds 5] [--out FILE]

One engine (one compile) serves every run. The machine is shared (another process may take a
core) and its speed moves between runs by tens of percent, so the runs are interleaved in rounds
(the house style of kvjax's measured sweeps) and medians compared:
1. saturation: every request at t = 0 (seed 1), a run left out, then three; their median
   requests/s fixes the compared rates, 30%, 60% and 90% of it (each point also records its rate
   over the median saturation of the rounds, the load it turned out to be);
2. a calibration sweep whose prompts are each chunk bucket long (every compiled shape measured);
3. `--rounds` rounds, each: two calibration runs on their own seeds (t = 0, and Poisson at 60%),
   the compared runs (Poisson, seed 0: the same requests every round) at the three rates, and a
   saturation run (seed 1);
4. `kvjax.serving.fitted.FittedStepTime` fitted (non-negative least squares) on the calibration
   runs' measured steps only; round k's speed is its own two calibration runs' measured time over
   the fit's; round k's simulation runs the fit at that speed, each step times one calibration
   step's measured/fitted ratio drawn at random (seed k);
5. per rate (and at saturation), each engine metric's median over the rounds against the
   simulated rounds' median, on the same requests (same arrivals and lengths).
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

import numpy as np

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


METRICS = ("ttft_s", "itl_s")


def _metrics(rep: dict) -> dict:
    out = {f"{k}_{q}": rep[k][q] for k in METRICS for q in ("mean", "p50", "p90", "p99")}
    out["throughput_tokens_per_s"] = rep["throughput_tokens_per_s"]
    out["requests_per_s"] = rep["requests_out"] / rep["duration_s"]
    return out


def _median(reps: list[dict]) -> dict:
    """Each metric's median over repeated runs (engine rounds, or simulations' seeds)."""
    return {k: float(np.median([r[k] for r in reps])) for k in reps[0]}


def _compare(engine: dict, sim: dict) -> dict:
    out = {}
    for k in METRICS:
        for q in ("p50", "p90"):
            e, s = engine[f"{k}_{q}"], sim[f"{k}_{q}"]
            err = s / e - 1
            out[f"{k[:-2]}_{q}"] = {
                "engine_s": e, "simulated_s": s, "relative_error": err, "bound": BOUNDS[q],
                "within": abs(err) <= BOUNDS[q],
            }  # fmt: skip
    return out


def run(model: str, overrides: dict, n: int, prompt: str, output: str, max_batch: int,
        max_len: int, token_budget: int, page_size: int, rounds: int = 3) -> dict:  # fmt: skip
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
    compiled = 0

    def serve(reqs, what):
        nonlocal compiled
        start, before = time.perf_counter(), os.getloadavg()[0]
        res = eng.serve(reqs)
        rep = report(res)
        compiled += res.compilations_after_warmup
        loads.append({"run": what, "loadavg_1min_before": before,
                      "loadavg_1min_after": os.getloadavg()[0],
                      "throughput_tokens_per_s": rep["throughput_tokens_per_s"]})  # fmt: skip
        log(f"  {what}: {res.steps} steps, {time.perf_counter() - start:.1f} s, "
            f"{rep['throughput_tokens_per_s']:.0f} tokens/s, load {before:.1f}")  # fmt: skip
        return res, rep

    # 1. saturation, which fixes the compared rates: the median of three runs, after one run
    # left out (the first after the compile ran up to 25% slower)
    serve(_requests(n, None, prompt, output, 1), "warm-up (left out)")
    sats = [_metrics(serve(_requests(n, None, prompt, output, 1), "saturation")[1])
            for _ in range(3)]  # fmt: skip
    sat_rps = _median(sats)["requests_per_s"]
    rates = {load: load * sat_rps for load in LOADS}
    # 2. rounds: calibration runs (their own seeds) beside the compared runs and saturation, so
    # the fit and the engine's medians see the machine over the same minutes
    calib = [serve(_bucket_sweep(eng.buckets), "calibration over the buckets")[0]]
    engine_runs: dict[object, list[dict]] = {load: [] for load in (*LOADS, "saturation")}
    round_calib: list[list] = []  # each round's own calibration runs: its speed (below)
    for k in range(rounds):
        round_calib.append([
            serve(_requests(n, None, prompt, output, 101 + 2 * k),
                  f"round {k + 1}: calibration at t = 0")[0],
            serve(_requests(n, rates[0.6], prompt, output, 102 + 2 * k),
                  f"round {k + 1}: calibration at 60%")[0],
        ])  # fmt: skip
        calib += round_calib[-1]
        for load, rate in rates.items():
            rep = serve(_requests(n, rate, prompt, output, 0), f"round {k + 1}: {load:.0%}")[1]
            engine_runs[load].append(_metrics(rep))
        rep = serve(_requests(n, None, prompt, output, 1), f"round {k + 1}: saturation")[1]
        engine_runs["saturation"].append(_metrics(rep))
    steps = [(s.batch, s.wall_s) for r in calib for s in r.measured]
    mean_model, fit = FittedStepTime.fit(steps, eng.buckets)
    log(f"  fit on {fit.steps} steps: median relative error {fit.median_relative_error:.1%}, "
        f"total {fit.total_relative_error:+.1%}")  # fmt: skip

    # the machine's speed in round k: its own calibration steps' measured time over the fit's
    # (the speed drifts by tens of percent over minutes; the compared runs sit beside them)
    speed = []
    for runs in round_calib:
        pairs = [(st.batch, st.wall_s) for r in runs for st in r.measured]
        speed.append(sum(w for _, w in pairs) / sum(mean_model(b) for b, _ in pairs))
    log("  each round's speed over the fit's: " + ", ".join(f"{x:.3f}" for x in speed))

    def sim(rate, k):
        """Round k: the fitted mean at the round's speed times a calibration step's
        measured/fitted ratio, drawn (seeded by the round)."""
        scaled = {name: c * speed[k] for name, c in mean_model.coefficients_s.items()}
        model = FittedStepTime(scaled, eng.buckets, fit.spread, k)
        reqs = _requests(n, rate, prompt, output, 1 if rate is None else 0)
        return _metrics(report(simulate(reqs, eng.scheduler(), model)))

    points = []
    for load in (*LOADS, "saturation"):
        e = _median(engine_runs[load])
        s = _median([sim(rates.get(load), k) for k in range(rounds)])
        rate = rates.get(load)
        points.append({"load": load, "rate_requests_per_s": rate,
                       # the rate over the rounds' own median saturation: the load it was
                       "load_of_rounds_saturation": rate and rate / _median(
                           engine_runs["saturation"])["requests_per_s"],
                       "engine": e, "engine_rounds": engine_runs[load], "simulated": s,
                       "comparison": _compare(e, s)})  # fmt: skip
    sat = points.pop()
    sat_err = sat["simulated"]["throughput_tokens_per_s"] / sat["engine"][
        "throughput_tokens_per_s"] - 1  # fmt: skip
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
            "compilations_after_warmup": compiled,
        },  # fmt: skip
        "load": {
            "requests": n,
            "prompt_len": prompt,
            "output_len": output,
            "rounds": rounds,
            "arrivals": "compared: Poisson, seed 0, the same requests every round; saturation: "
            "seed 1, all at t = 0; calibration: seeds 101 + 2k (t = 0) and 102 + 2k (Poisson at "
            "60%) in round k, and the bucket sweep; engine numbers are medians over the rounds, "
            "simulated ones medians over as many seeds of the spread",
        },  # fmt: skip
        "saturation": {
            "engine_requests_per_s_fixing_the_rates": sat_rps,
            "engine_first_runs": sats,
            "engine_requests_per_s": sat["engine"]["requests_per_s"],
            "engine_tokens_per_s": sat["engine"]["throughput_tokens_per_s"],
            "simulated_requests_per_s": sat["simulated"]["requests_per_s"],
            "simulated_tokens_per_s": sat["simulated"]["throughput_tokens_per_s"],
            "relative_error": sat_err,
            "bound": BOUNDS["saturation"],
            "within": abs(sat_err) <= BOUNDS["saturation"],
            "engine": sat["engine"],
            "engine_rounds": sat["engine_rounds"],
            "simulated": sat["simulated"],
            "latencies": sat["comparison"],
        },  # fmt: skip
        "fit": {
            "round_speed_over_fit": speed,
            "steps": fit.steps,
            "coefficients_s": fit.coefficients_s,
            "median_relative_error": fit.median_relative_error,
            "mean_relative_error": fit.mean_relative_error,
            "total_relative_error": fit.total_relative_error,
            "spread_p10_p50_p90": [float(x) for x in np.percentile(fit.spread, [10, 50, 90])],
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
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--prompt-len", default="uniform:64:256")
    parser.add_argument("--output-len", default="uniform:32:64")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=320)
    parser.add_argument("--token-budget", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--out", type=Path, default=Path("experiments/results/serving_engine_vs_sim.json")
    )
    args = parser.parse_args(argv)
    given = {f: getattr(args, k.replace("-", "_")) for k, f in DIMS.items()}
    overrides = {f: v for f, v in given.items() if v is not None}
    result = run(args.model, overrides, args.requests, args.prompt_len, args.output_len,
                 args.max_batch, args.max_len, args.token_budget, args.page_size,
                 args.rounds)  # fmt: skip
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
        print(
            f"  {p['load']:.0%} ({p['rate_requests_per_s']:.1f}/s, "
            f"{p['load_of_rounds_saturation']:.0%} of the rounds'): {row}"
        )
    print(f"all within bounds: {result['all_within_bounds']}; wrote {args.out}")


if __name__ == "__main__":
    main()


def markdown(d: dict) -> str:
    """The README's table of a result: per load, engine / simulated TTFT and ITL P50 and P90."""
    lines = ["| load (of the rounds' saturation) | TTFT P50 | TTFT P90 | ITL P50 | ITL P90 |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for p in d["points"]:
        e, s = p["engine"], p["simulated"]
        cells = [f"{e[k] * 1e3:.2f} / {s[k] * 1e3:.2f} ms ({s[k] / e[k] - 1:+.0%})"
                 for k in ("ttft_s_p50", "ttft_s_p90", "itl_s_p50", "itl_s_p90")]  # fmt: skip
        rate, of = p["rate_requests_per_s"], p["load_of_rounds_saturation"]
        load = f"{p['load']:.0%} ({rate:.1f}/s; {of:.0%})"
        lines.append(f"| {load} | " + " | ".join(cells) + " |")
    sat = d["saturation"]
    lines.append(f"| saturation | {sat['engine_tokens_per_s']:,.0f} / "
                 f"{sat['simulated_tokens_per_s']:,.0f} tokens/s "
                 f"({sat['relative_error']:+.0%}) | | | |")  # fmt: skip
    return "\n".join(lines)
