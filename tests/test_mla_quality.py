"""MLA in the quality suite (issue 51): its records exported beside GQA's with paired comparisons
at equal KV bytes, merged into committed exports, drawn, mapped onto any model's variants as a
quality cost, and used as a budget by `kvjax frontier --max-quality-cost`."""

import json
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kvjax.errors import KvjaxError  # noqa: E402
from kvjax.model.config import get_model_config  # noqa: E402
from kvjax.plotting.mla_quality import mla_quality  # noqa: E402
from kvjax.quality import costs  # noqa: E402
from kvjax.runs.exports import load_exports  # noqa: E402
from kvjax.runs.records import RunDir, load_records  # noqa: E402
from kvjax.stats import detectable_difference  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# (variant, num_kv_heads, kv_lora_rank, KV bytes a token): 4 heads of 8, one layer, f32
VARIANTS = [("MHA", 4, 0, 256), ("GQA-2", 2, 0, 128), ("MQA", 1, 0, 64), ("MLA-8", 4, 8, 64)]


def _records(rng, task="stdlib", steps=10) -> list[dict]:
    out = []
    for seed in range(3):
        for name, k, rank, nbytes in VARIANTS:
            acc = float(rng.uniform(0.1, 1.0))
            out.append({"model": "quality-small", "task": task, "variant": name,
                        "num_kv_heads": k, "kv_lora_rank": rank, "num_heads": 4, "seed": seed,
                        "steps": steps, "num_pairs": 8 if task == "recall" else None,
                        "eval_kv_dtype": "f32", "kv_bytes_per_token": nbytes,
                        "val_loss": 2 + 0.1 * seed + 0.01 * k + rng.normal(0, 0.01),
                        "val_accuracy": acc, "chance_accuracy": 0.1, "tokens": 640,
                        "learned": acc >= 0.9 if task == "recall" else None,
                        "history": [{"step": steps, "val_loss": 2.0}]})  # fmt: skip
    return out


def _run(root, run_id, records) -> None:
    run = RunDir(root, "hkv_quality", run_id)
    run.points_dir.mkdir(parents=True)
    (run.path / "config.yaml").write_text(yaml.safe_dump({"experiment": "hkv_quality"}))
    run.write_point("all", records)


def test_mla_is_compared_with_mha_and_with_gqa_of_the_same_bytes(tmp_path):
    from experiments.benchmarks.quality_results import export

    rng = np.random.default_rng(0)
    records = _records(rng) + _records(rng, "recall", 20)
    _run(tmp_path / "runs", "a", records)
    export([tmp_path / "runs"], tmp_path / "out")
    d = pd.read_csv(tmp_path / "out" / "quality_differences.csv").fillna({"condition": ""})
    d = d.set_index(["family", "comparison", "condition", "metric"])
    df = pd.DataFrame(records)
    loss = df[df.task == "stdlib"].set_index(["variant", "seed"]).val_loss
    twin = d.loc[("stdlib", "MLA-8 - h_kv=1", "equal KV bytes (64 B/token)", "val_loss")]
    by_hand = (loss.loc["MLA-8"] - loss.loc["MQA"]).to_numpy()
    assert twin["mean"] == pytest.approx(by_hand.mean()) and twin.n == 3
    assert twin.detectable == pytest.approx(detectable_difference(by_hand.std(ddof=1), 3))
    assert ("stdlib", "MLA-8 - MHA", "", "val_loss") in d.index
    assert ("stdlib", "h_kv=2 - MHA", "", "val_loss") in d.index
    recall = d.loc[("recall", "MLA-8 - MHA", "num_pairs=8, 20 steps", "val_accuracy")]
    acc = df[df.task == "recall"].set_index(["variant", "seed"]).val_accuracy
    assert recall["mean"] == pytest.approx((acc.loc["MLA-8"] - acc.loc["MHA"]).mean())
    learned = df[df.task == "recall"].groupby("variant").learned.sum()
    assert recall.learned == f"MLA-8 {learned['MLA-8']}/3, MHA {learned['MHA']}/3"
    # a second export of other runs keeps these records and replaces the same keys
    again = [dict(r, val_loss=r["val_loss"] + 1) for r in records if r["seed"] == 0]
    _run(tmp_path / "runs2", "b", again)
    export([tmp_path / "runs2"], tmp_path / "out")
    merged = load_exports(tmp_path / "out")
    assert len(merged) == len(records)
    first = merged[(merged.seed == 0) & (merged.task == "stdlib") & (merged.variant == "MLA-8")]
    assert first.val_loss.item() == pytest.approx(loss.loc[("MLA-8", 0)] + 1)
    # drawn: (a) stdlib paired differences by family, (b) recall accuracy
    fig = plt.figure(figsize=(7, 3))
    assert mla_quality(load_records(tmp_path / "runs"), fig) is None
    stdlib = fig.axes[0]
    mla = [c for c in stdlib.containers if c.get_label() == "MLA"][0]
    assert list(mla.lines[0].get_xdata()) == [64]
    assert mla.lines[0].get_ydata()[0] == pytest.approx(by_hand.mean() + (
        loss.loc["MQA"] - loss.loc["MHA"]).mean())  # fmt: skip
    plt.close(fig)
    gqa_only = load_records(tmp_path / "runs")
    assert mla_quality(gqa_only[gqa_only.kv_lora_rank == 0], plt.figure()) is False
    plt.close("all")


def test_detectable_difference_has_the_power_it_claims():
    n, std = 5, 0.02
    delta = detectable_difference(std, n)
    from scipy import stats

    x = np.random.default_rng(1).normal(delta, std, (40_000, n))
    t = x.mean(1) / (x.std(1, ddof=1) / np.sqrt(n))
    assert (np.abs(t) > stats.t.ppf(0.975, n - 1)).mean() == pytest.approx(0.8, abs=0.01)
    # many pairs: the normal approximation, (z_0.975 + z_0.8) std / sqrt(n)
    assert detectable_difference(1.0, 10_000) * 100 == pytest.approx(1.95996 + 0.84162, rel=1e-3)


def _committed(tmp_path) -> Path:
    rows = [("stdlib", "h_kv=2 - MHA", "", 0.02), ("stdlib", "h_kv=1 - MHA", "", 0.04),
            ("stdlib", "MLA-24 - MHA", "", 0.01), ("stdlib", "MLA-120 - MHA", "", 0.005),
            ("stdlib", "fp8 cache - f32", "h_kv=2", 0.001)]  # fmt: skip
    pd.DataFrame([{"family": f, "comparison": c, "condition": cond, "metric": "val_loss",
                   "mean": m, "low": m - 0.01, "high": m + 0.01} for f, c, cond, m in rows]
                 ).to_csv(tmp_path / "quality_differences.csv", index=False)  # fmt: skip
    pd.DataFrame([{"task": "stdlib", "eval_kv_dtype": "f32", "variant": v, "kv_bytes_per_token": b}
                  for v, b in (("MHA", 4096), ("MLA-24", 512), ("MLA-120", 2048))]
                 ).to_csv(tmp_path / "hkv_quality.csv", index=False)  # fmt: skip
    return tmp_path / "quality_differences.csv"


def test_quality_cost_maps_any_models_variants(tmp_path):
    path = _committed(tmp_path)
    llama = get_model_config("llama-3-8b")  # 32 heads of 128, 8 KV heads: 4 a group -> h_kv=2
    gqa = costs.quality_cost(llama.replace(kv_dtype="fp8"), path)
    assert gqa.delta == pytest.approx(0.021) and gqa.high == pytest.approx(0.041)
    assert costs.quality_cost(llama.replace(num_kv_heads=32), path).delta == 0
    from kvjax.analytic.variants import mla_variant

    mla = mla_variant(llama)  # A = 512, P = 64: 576 of MHA's 2 x 32 x 128 = 8192, 0.070
    assert costs.mla_share(mla) == pytest.approx(576 / 8192)
    cost = costs.quality_cost(mla, path)  # nearest on a log scale: 1/8 (MLA-24), not 1/2
    assert cost.delta == pytest.approx(0.01) and cost.label.startswith("MLA-24 - MHA")
    missing = costs.quality_cost(mla.replace(kv_dtype="fp8"), path)
    assert missing.delta is None and "MLA latent cache" in missing.missing
    six = get_model_config("llama-3-8b", num_heads=24, num_kv_heads=4)  # 6 a group
    assert "6 query heads per KV head" in costs.quality_cost(six, path).missing


def test_frontier_refuses_a_quality_budget_it_cannot_evaluate():
    argv = [sys.executable, "-m", "kvjax", "frontier", "--model", "deepseek-v3", "--chip",
            "h200", "--kv-dtype", "fp8", "--max-quality-cost", "0.05"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert proc.returncode == 2
    assert "variant 'MLA' has no committed quality cost" in proc.stderr  # no fp8 MLA cache run


def test_frontier_keeps_the_variants_within_the_quality_budget():
    budget = 0.03
    argv = ["frontier", "--model", "llama-3-8b", "--variants", "--max-quality-cost", str(budget),
            "--context", "4096", "--json"]  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "kvjax", *argv], capture_output=True, text=True,
                         cwd=ROOT, timeout=1800)  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    for curve in report["variants"]:
        assert curve["within_quality_budget"] == (curve["quality_cost"]["delta"] <= budget)
    best = report["fastest_within_quality_budget"]
    kept = [p for c in report["variants"] if c["within_quality_budget"] for p in c["points"]]
    assert best["tokens_per_s"] == max(p["tokens_per_s"] for p in kept)
    with pytest.raises(KvjaxError):
        costs.committed(ROOT / "nowhere.csv")


MLA_RUN = """experiment: hkv_quality
model: {preset: tiny-gqa, num_layers: 1, d_model: 32, num_heads: 4, num_kv_heads: 4, head_dim: 12,
        qk_rope_head_dim: 4, v_head_dim: 8, kv_lora_rank: 12, d_ff: 48, vocab_size: 64}
options: {task: recall, num_pairs: 2, num_queries: 2, steps: 2, batch_size: 2, eval_every: 2,
          eval_batches: 1, warmup_steps: 1}
"""


def test_an_mla_model_trains_in_the_quality_experiment(tmp_path):
    from kvjax.runs.launcher import run_experiment

    path = tmp_path / "mla.yaml"
    path.write_text(MLA_RUN)
    (r,) = run_experiment(path, runs_root=tmp_path / "runs", progress=False).records()
    # one layer's latent (12) and RoPE key (4) in f32: MQA's 2 x 8 at this model's head width
    assert (r["variant"], r["kv_lora_rank"], r["kv_bytes_per_token"]) == ("MLA-12", 12, 64)
    assert r["learned"] in (True, False) and r["num_pairs"] == 2
    path.write_text(MLA_RUN.replace("warmup_steps: 1}", "warmup_steps: 1, eval_kv_dtypes: [int8]}"))
    with pytest.raises(KvjaxError, match="MLA"):  # before training
        run_experiment(path, runs_root=tmp_path / "runs2", progress=False)


def test_steps_to_learn_is_the_first_evaluation_past_the_threshold():
    from experiments.benchmarks.quality_results import steps_to_learn

    curve = [{"step": 400, "val_accuracy": 0.18}, {"step": 800, "val_accuracy": 0.93},
             {"step": 1200, "val_accuracy": 0.85}, {"step": 1600, "val_accuracy": 1.0}]  # fmt: skip
    assert steps_to_learn(curve) == 800
    assert np.isnan(steps_to_learn(curve[:1])) and np.isnan(steps_to_learn(None))
