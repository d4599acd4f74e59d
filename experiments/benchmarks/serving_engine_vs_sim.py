"""Benchmark: the serving simulator, its step-time model fitted to this machine's measured steps,
against the real engine (`kvjax.measured.engine`) on the same small model, arrivals and lengths.

    python3 -m experiments.benchmarks.serving_engine_vs_sim [--model tiny-gqa] [--requests 200]
        [--prompt-len uniform:64:256] [--output-len uniform:32:64] [--rounds 5] [--out FILE]

One engine (one compile) serves every run. The machine is a shared 2-core VM: its speed moves
by tens of percent from one run to the next (the hypervisor takes CPU time: `cpu_steal` per run
in the JSON, up to 25% at times), so every compared run has calibration runs of its own just
before and after it, and the runs are repeated in rounds:
1. the engine's calibration on the step clock (`Engine.calibrate`: every compiled shape);
2. `--rounds` rounds, each: a calibration burst (every request at t = 0, its own seed), the
   saturation run (seed 1, all at t = 0; it sets the round's rates, 30%, 60% and 90% of it),
   another burst; then per rate: a calibration run at that rate (Poisson, its own seed), the
   compared run (Poisson, seed 0: the same requests every round, their times scaled to the
   round's rate), another calibration run at that rate;
3. `kvjax.serving.fitted.FittedStepTime.fit_runs` (non-negative least squares) on the
   calibration runs only, each divided by its own speed: the shape of a step's cost;
4. each compared run simulated on its requests with that shape, at the speed of the machine
   given three ways (`SPEEDS`). The criterion is **out of sample** (`around`): the speed of the
   two calibration runs at the same rate just before and after it (the same mix of steps, other
   requests), never the compared run's own. In sample, for reference only: the compared run's
   own speed (`own`) and its speed per 100 steps (`trace`). Each simulated step also takes a
   calibration step's measured/fitted ratio within its run (out of sample: of the two runs
   around it), drawn (seeded by the round);
5. per rate (and at saturation), each engine metric's median over the rounds against the
   simulated rounds' median; and per round, whether each comparison held.
The bounds (issue 41, judged out of sample since issue 48): TTFT and ITL P50 within 15%, P90
within 25%; saturation throughput within 15%. f32 on CPU (DESIGN.md). One JSON with every
number, the command, the jax version, the backend and device, the date, and every run's time and
CPU steal.
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
from kvjax.serving.fitted import FittedStepTime, SpeedTrace
from kvjax.serving.load import generate
from kvjax.serving.simulate import report, simulate

BOUNDS = {"p50": 0.15, "p90": 0.25, "saturation": 0.15}
LOADS = (0.3, 0.6, 0.9)
TRACE_WINDOW = 100  # steps per window of the machine's speed over a run
WHOLE_RUN = 10**9  # a window longer than any run: one speed a run
SPEEDS = {
    "around": "out of sample (the criterion): the calibration runs just before and after it, "
    "at the same rate with other requests (bursts at t = 0 around a saturation run)",
    "own": "in sample, for reference: one number per compared run, its own measured time over "
    "the fit's",
    "trace": f"in sample, for reference: the machine's speed over the compared run itself, one "
    f"number per {TRACE_WINDOW} steps (the trace also absorbs the shape's error at the run's "
    "mix)",
}
CRITERION = "around"
DIMS = {"layers": "num_layers", "d-model": "d_model", "heads": "num_heads",
        "kv-heads": "num_kv_heads", "head-dim": "head_dim", "d-ff": "d_ff",
        "vocab": "vocab_size"}  # fmt: skip


def _requests(n, rate, prompt, output, seed):
    reqs = generate(n, rate or 1.0, prompt, output, seed)
    if rate is None:  # saturation: everything at t = 0
        for r in reqs:
            r.arrival_s = 0.0
    return reqs


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


def cpu_times() -> np.ndarray | None:
    """This machine's CPU time so far (/proc/stat's first line: user, nice, system, idle, iowait,
    irq, softirq, steal, in ticks), or None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            return np.array([int(x) for x in f.readline().split()[1:9]], dtype=float)
    except (OSError, ValueError):
        return None


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
    runs = []  # every run in order: what it was, when, the machine's state around it
    compiled = 0
    t_start = time.perf_counter()

    def serve(reqs, what, clock="wall"):
        nonlocal compiled
        start, before, cpu = time.perf_counter(), os.getloadavg()[0], cpu_times()
        res = eng.serve(reqs, clock=clock)
        rep = report(res)
        compiled += res.compilations_after_warmup
        d = None if cpu is None else cpu_times() - cpu
        runs.append({"run": what, "start_s": start - t_start,
                     "wall_s": time.perf_counter() - start,
                     "loadavg_1min_before": before,
                     # the hypervisor's share of the machine's CPU time during the run
                     "cpu_steal": None if d is None or not d.sum() else d[7] / d.sum(),
                     "throughput_tokens_per_s": rep["throughput_tokens_per_s"]})  # fmt: skip
        log(
            f"  {what}: {res.steps} steps, {time.perf_counter() - start:.1f} s, "
            f"{rep['throughput_tokens_per_s']:.0f} tokens/s, steal {runs[-1]['cpu_steal']}"
        )
        return res, rep

    serve(_requests(n, None, prompt, output, 1), "warm-up (left out)")
    calib = [serve(eng.calibration(), "calibration on the step clock", clock="steps")[0]]

    def calibrate(rate, seed, what):
        calib.append(serve(_requests(n, rate, prompt, output, seed), f"{what}: calibration")[0])
        return calib[-1]

    # per round: its saturation between two calibration bursts (t = 0, their own seeds), which
    # sets the round's rates; then each compared run between two calibration runs at its rate
    # (their own seeds): the machine's speed just around it, at the same mix of steps
    rounds_: list[dict] = []
    for k in range(rounds):
        what = f"round {k + 1}"
        before = calibrate(None, 100 + 8 * k, f"{what}: t = 0")
        sat, sat_rep = serve(_requests(n, None, prompt, output, 1), f"{what}: saturation")
        after = calibrate(None, 101 + 8 * k, f"{what}: t = 0")
        rates = {load: load * sat_rep["requests_out"] / sat_rep["duration_s"] for load in LOADS}
        compared, around = {}, {}
        for j, (load, rate) in enumerate(rates.items()):
            first = calibrate(rate, 102 + 8 * k + 2 * j, f"{what}: {load:.0%}")
            compared[load] = serve(_requests(n, rate, prompt, output, 0), f"{what}: {load:.0%}")
            around[load] = (first, calibrate(rate, 103 + 8 * k + 2 * j, f"{what}: {load:.0%}"))
        rounds_.append({"rates": rates, "saturation": (sat, sat_rep), "compared": compared,
                        "around": around, "around_saturation": (before, after)})  # fmt: skip
    steps_of = lambda res: [(st.batch, st.wall_s) for st in res.measured]  # noqa: E731
    mean_model, fit, calib_speeds = FittedStepTime.fit_runs(
        [steps_of(r) for r in calib], eng.buckets, names=eng.features
    )
    log(
        f"  fit on {fit.steps} steps: median relative error {fit.median_relative_error:.1%}; "
        "calibration runs' speeds " + ", ".join(f"{x:.2f}" for x in calib_speeds)
    )

    # with a trace, the steps' spread within windows of the calibration runs (the run-level
    # spread holds the drift inside a run that the trace applies already)
    window_spread = mean_model.window_spread([c.measured for c in calib], TRACE_WINDOW)

    def sim(rate, seed, speed, k, spread=None):
        """The fit at `speed` (or over a speed trace), each step times a calibration step's
        measured/fitted ratio (within its run, or its window with a trace; `spread`: those of
        the runs given), drawn (seeded by the round)."""
        reqs = _requests(n, rate, prompt, output, seed)
        if isinstance(speed, SpeedTrace):  # the machine's speed over the run, window by window
            step_time, trace = mean_model.scaled(1.0, window_spread, k), speed
        else:
            step_time, trace = mean_model.scaled(speed, spread or fit.spread, k), None
        return _metrics(report(simulate(reqs, eng.scheduler(), step_time, trace)))

    speed_of = lambda res: mean_model.speed(steps_of(res))  # noqa: E731
    points = {load: {"engine": [], "speeds": [], **{w: [] for w in SPEEDS}}
              for load in (*LOADS, "saturation")}  # fmt: skip
    for k, r in enumerate(rounds_):
        sat, sat_rep = r["saturation"]
        for load, (res, rep), rate, (first, last) in (
            ("saturation", r["saturation"], None, r["around_saturation"]),
            *((load, r["compared"][load], r["rates"][load], r["around"][load]) for load in LOADS),
        ):  # fmt: skip
            seed = 1 if rate is None else 0
            own, around = speed_of(res), (speed_of(first) + speed_of(last)) / 2
            p = points[load]
            p["engine"].append(_metrics(rep))
            # out of sample: the speed and the step-to-step spread of the runs around it
            spread = mean_model.window_spread([first.measured, last.measured], WHOLE_RUN)
            p["around"].append(sim(rate, seed, around, k, spread))
            p["own"].append(sim(rate, seed, own, k))
            p["trace"].append(sim(rate, seed, mean_model.speed_trace(res.measured, TRACE_WINDOW),
                                  k))  # fmt: skip
            p["speeds"].append({"own": own, "around": around, "before": speed_of(first),
                                "after": speed_of(last)})  # fmt: skip

    out_points = []
    for load, p in points.items():
        e = _median(p["engine"])
        entry = {"load": load, "engine": e, "engine_rounds": p["engine"],
                 "rates_requests_per_s": [r["rates"].get(load) for r in rounds_],
                 "speeds": p["speeds"]}  # fmt: skip
        for which in SPEEDS:
            s = _median(p[which])
            entry[f"simulated_{which}_speed"] = s
            entry[f"comparison_{which}_speed"] = _compare(e, s)
            entry[f"saturation_error_{which}_speed"] = (
                s["throughput_tokens_per_s"] / e["throughput_tokens_per_s"] - 1
            )
        # each round on its own, out of sample: its engine run against its simulation
        entry["rounds_out_of_sample"] = [
            _compare(eng_k, sim_k) for eng_k, sim_k in zip(p["engine"], p[CRITERION], strict=True)
        ]
        out_points.append(entry)
    sat = out_points.pop()
    # the bounds, out of sample: each compared run at the speed of the calibration runs around
    # it (saturation: the bursts around it; its own speed would hand its throughput back)
    sat_err = sat["saturation_error_around_speed"]
    within = {which: all(c["within"] for p in out_points
                         for c in p[f"comparison_{which}_speed"].values())
              for which in SPEEDS}  # fmt: skip
    # per round and load, out of sample: how often P50 (TTFT and ITL) and P90 held
    held = {q: [all(c[f"{m}_{q}"]["within"] for m in ("ttft", "itl"))
                for p in out_points for c in p["rounds_out_of_sample"]]
            for q in ("p50", "p90")}  # fmt: skip
    sat_rounds = [
        abs(s_["throughput_tokens_per_s"] / e["throughput_tokens_per_s"] - 1)
        <= BOUNDS["saturation"]
        for e, s_ in zip(sat["engine_rounds"], points["saturation"][CRITERION], strict=True)
    ]
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
            "arrivals": "compared: Poisson, seed 0 (the same requests every round, their times "
            "scaled to the round's rates: 30/60/90% of its own saturation run); saturation: "
            "seed 1, all at t = 0; calibration: the engine's step-clock calibration first, then "
            "in round k bursts at t = 0 of seeds 100 + 8k and 101 + 8k around the saturation "
            "run, and around the compared run at rate j (0, 1, 2) Poisson runs at that rate, "
            "seeds 102 + 8k + 2j before and 103 + 8k + 2j after; engine numbers are medians "
            "over the rounds, simulated ones medians over the rounds' simulations (each at its "
            "round's rates and speed, its own spread seed)",
        },  # fmt: skip
        "saturation": {
            "engine_requests_per_s": sat["engine"]["requests_per_s"],
            "engine_tokens_per_s": sat["engine"]["throughput_tokens_per_s"],
            "simulated_tokens_per_s": sat["simulated_around_speed"]["throughput_tokens_per_s"],
            "simulated_requests_per_s": sat["simulated_around_speed"]["requests_per_s"],
            "relative_error": sat_err,
            "relative_error_own_speed": sat["saturation_error_own_speed"],
            "bound": BOUNDS["saturation"],
            "within": abs(sat_err) <= BOUNDS["saturation"],
            **{
                k: sat[k]
                for k in (
                    "engine",
                    "engine_rounds",
                    "speeds",
                    "simulated_around_speed",
                    "simulated_own_speed",
                )
            },
        },  # fmt: skip
        "fit": {
            "steps": fit.steps,
            "coefficients_s": fit.coefficients_s,
            "calibration_speeds": calib_speeds,
            "median_relative_error": fit.median_relative_error,
            "mean_relative_error": fit.mean_relative_error,
            "total_relative_error": fit.total_relative_error,
            "spread_p10_p50_p90": [float(x) for x in np.percentile(fit.spread, [10, 50, 90])],
            "window_spread_p10_p50_p90": [
                float(x) for x in np.percentile(window_spread, [10, 50, 90])
            ],
        },  # fmt: skip
        "points": out_points,
        "runs": runs,
        "speeds": SPEEDS,
        "criterion": CRITERION,
        "all_within_bounds": within[CRITERION] and abs(sat_err) <= BOUNDS["saturation"],
        "latencies_within_bounds": within,
        # per round and load, out of sample: [held, of]
        "rounds_held_out_of_sample": {
            "p50": [sum(held["p50"]), len(held["p50"])],
            "p90": [sum(held["p90"]), len(held["p90"])],
            "saturation": [sum(sat_rounds), len(sat_rounds)],
        },
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
        for which in SPEEDS:
            row = "; ".join(
                f"{k} {c['engine_s'] * 1e3:.2f} vs {c['simulated_s'] * 1e3:.2f} ms "
                f"({c['relative_error']:+.0%}{'' if c['within'] else ' OUT'})"
                for k, c in p[f"comparison_{which}_speed"].items()
            )
            print(f"  {p['load']:.0%}, speed {which}: {row}")
    held = result["rounds_held_out_of_sample"]
    print("out of sample, per round and load: " + ", ".join(
        f"{k} held in {a} of {b}" for k, (a, b) in held.items()))  # fmt: skip
    print(f"all within bounds (medians over rounds, out of sample): "
          f"{result['all_within_bounds']}; wrote {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()


def markdown(d: dict) -> str:
    """The README's table of a result: per load and speed (out of sample first), engine /
    simulated TTFT and ITL P50 and P90; saturation throughput."""
    lines = ["| load | speed | TTFT P50 | TTFT P90 | ITL P50 | ITL P90 |",
             "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    label = {w: ("out of sample" if w == d["criterion"] else "in sample") for w in d["speeds"]}
    for p in d["points"]:
        e = p["engine"]
        for which in d["speeds"]:
            s = p[f"simulated_{which}_speed"]
            cells = [f"{e[k] * 1e3:.2f} / {s[k] * 1e3:.2f} ms ({s[k] / e[k] - 1:+.0%})"
                     for k in ("ttft_s_p50", "ttft_s_p90", "itl_s_p50", "itl_s_p90")]  # fmt: skip
            lines.append(f"| {p['load']:.0%} | {which} ({label[which]}) | " + " | ".join(cells)
                         + " |")  # fmt: skip
    sat = d["saturation"]
    lines.append(f"| saturation | around (out of sample) | {sat['engine_tokens_per_s']:,.0f} / "
                 f"{sat['simulated_tokens_per_s']:,.0f} tokens/s "
                 f"({sat['relative_error']:+.0%}) | | | |")  # fmt: skip
    return "\n".join(lines)
