"""Benchmark: the published-measurements efficiency model (`kvjax.predict.model`) checked where
kvjax can measure: fitted on this CPU's own timed kernels, predicting shapes it never saw.

    python3 -m experiments.benchmarks.cpu_predict [--budget-s 0.25] [--out FILE]

The measured view's kernels (`kvjax.measured.kernels.kernel_benches`, f32, inputs rotated past
the last-level cache) against the ceilings measured in the same run:
- matmul class: q_proj, gate_up and down of small transformers (D = 512, 1024, 2048; F = 2.75 D)
  at decode batches 1, 8, 32 and prefills of 64 and 256 tokens; held out one D at a time;
- decode attention class: the whole decode attention (scores, softmax, av) of 16 heads of 128
  over h_kv in {1, 4, 16}, S in {1024, 4096, 16384}, B in {1, 4}; held out one S at a time.
Per class: the median |predicted / measured - 1| of held-out shapes and the share inside the
80% interval, the same two numbers `kvjax validate` reports for the published corpus.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import jax

from kvjax import kernels
from kvjax.analytic import Workload
from kvjax.measured.bench import place
from kvjax.measured.ceilings import load_or_measure_ceilings
from kvjax.measured.kernels import input_sets, kernel_benches
from kvjax.measured.timing import device_name, time_fn
from kvjax.model.config import ModelConfig
from kvjax.predict import model
from kvjax.runs.records import write_json_atomic

MATMULS = (kernels.Q_PROJ, kernels.GATE_UP, kernels.DOWN)
WORKLOADS = (("decode", 1), ("decode", 8), ("decode", 32), ("prefill", 64), ("prefill", 256))


def _cfg(d_model: int, num_kv_heads: int = 0, heads: int = 0) -> ModelConfig:
    heads = heads or d_model // 128
    return ModelConfig(
        name=f"cpu-predict-{d_model}", num_layers=1, d_model=d_model, num_heads=heads,
        num_kv_heads=num_kv_heads or heads, head_dim=128, d_ff=int(2.75 * d_model) // 64 * 64,
        vocab_size=1024, weight_dtype="f32", kv_dtype="f32",
    )  # fmt: skip


def _points(budget_s: float) -> list[dict]:
    ceilings = load_or_measure_ceilings()
    out = []

    def timed(kb, cls, group, **shape):
        stats = time_fn(kb.fn, input_sets(kb, rotation_bytes=2**27), min_runs=3,
                        budget_s=budget_s)  # fmt: skip
        p = place(kb.name, kb.closed, stats, ceilings, "f32")
        p.update(cls=cls, group=group, **shape)
        out.append(p)

    for d in (512, 1024, 2048):
        cfg = _cfg(d)
        for phase, n in WORKLOADS:
            wl = Workload(phase, n, 1) if phase == "decode" else Workload(phase, 1, n)
            benches = kernel_benches(cfg, wl if phase == "prefill" else Workload(phase, n, 64))
            for name in MATMULS:
                timed(benches[name], "matmul", f"D={d}", d_model=d, phase=phase, tokens=n)
    for S in (1024, 4096, 16384):
        for k in (1, 4, 16):
            for B in (1, 4):
                kb = kernel_benches(_cfg(2048, k, 16), Workload("decode", B, S))[kernels.ATTENTION]
                timed(kb, "attention_decode", f"S={S}", context=S, num_kv_heads=k, batch=B)
    return out, ceilings


def analyse(points: list[dict], peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> dict:
    """Per class, leave one shape group out: the held-out error and the 80% coverage."""
    summary = {}
    for cls in sorted({p["cls"] for p in points}):
        ps = [p for p in points if p["cls"] == cls]
        xs = [model.Features(p["closed_flops"], p["closed_bytes"], peak_flops_per_s,
                             bandwidth_bytes_per_s) for p in ps]  # fmt: skip
        v = model.leave_one_source_out(xs, [p["median_s"] for p in ps], [p["group"] for p in ps])
        summary[cls] = {
            "points": len(ps), "groups": len(v.sources),
            "loso_median_abs_error": v.median_abs_error, "loso_coverage_80": v.coverage,
            "interval_80_median_width": v.median_interval_width, "fit": v.fit.to_dict(),
        }  # fmt: skip
    return summary


def run(budget_s: float = 0.25) -> dict:
    points, ceilings = _points(budget_s)
    peak, bw = ceilings.peak("f32"), ceilings.bandwidth_bytes_per_s
    return {
        "benchmark": "cpu_predict",
        "date": datetime.date.today().isoformat(),
        "device": device_name(),
        "jax": jax.__version__,
        "dtype": "f32",
        "ceilings": ceilings.to_dict(),
        "points": points,
        "summary": analyse(points, peak, bw),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=0.25)
    parser.add_argument("--out", type=Path, default=Path("experiments/results/cpu_predict.json"))
    args = parser.parse_args(argv)
    result = run(args.budget_s)
    write_json_atomic(args.out, result)
    c = result["ceilings"]
    print(f"{result['device']} f32: peak {c['peak_flops_per_s']['f32'] / 1e9:.0f} GFLOP/s, "
          f"read {c['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s")  # fmt: skip
    for cls, s in result["summary"].items():
        f = s["fit"]
        print(f"  {cls}: {s['points']} kernels in {s['groups']} held-out groups: median "
              f"|pred/meas - 1| {s['loso_median_abs_error']:.1%}, 80% coverage "
              f"{s['loso_coverage_80']:.0%} (t0 {f['t0_s'] * 1e6:.1f} us, e_c "
              f"{f['compute_efficiency']:.2f}, e_b {f['bandwidth_efficiency']:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
