"""The quality figures drawn from the committed exports (experiments/results/), without the run
folders: the exports read back into the records the figures take, drawn alike."""

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kvjax.plotting import make_figures  # noqa: E402
from kvjax.plotting.mla_quality import mla_quality  # noqa: E402
from kvjax.plotting.quality import gqa_sweep, hkv_quality, kv_pareto  # noqa: E402
from kvjax.plotting.uptrain import gqa_uptrain, mla_uptrain  # noqa: E402
from kvjax.runs.exports import QUALITY_MODELS, load_exports  # noqa: E402
from kvjax.runs.records import RunDir, load_records  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
DRAW = {"hkv_quality": hkv_quality, "kv_pareto": kv_pareto, "mla_quality": mla_quality,
        "gqa_uptrain": gqa_uptrain, "mla_uptrain": mla_uptrain}  # fmt: skip


def axes_data(draw, records) -> list:
    """Every axes' title, lines, points, bars and texts as drawn (the figure as data)."""
    fig = plt.figure(figsize=(7, 3), dpi=100)
    draw(records, fig)
    out = []
    for ax in fig.axes:
        colls = [(np.round(c.get_offsets(), 12).tolist(),
                  [np.round(s, 12).tolist() for s in getattr(c, "get_segments", list)()])
                 for c in ax.collections]  # fmt: skip
        legend = ax.get_legend()
        out.append((ax.get_title(), ax.get_xlabel(), ax.get_ylabel(),
                    [np.round(line.get_xydata(), 12).tolist() for line in ax.lines], colls,
                    [t.get_text() for t in ax.texts],
                    [t.get_text() for t in legend.get_texts()] if legend else []))  # fmt: skip
    plt.close(fig)
    return out


def _history(rng, steps) -> list[dict]:
    return [{"step": s, "val_loss": float(3 - s / 10 + rng.normal(0, 0.01))} for s in steps]


def _run(root, experiment, run_id, records) -> None:
    run = RunDir(root, experiment, run_id)
    run.points_dir.mkdir(parents=True)
    (run.path / "config.yaml").write_text(yaml.safe_dump({"experiment": experiment}))
    run.write_point("all", records)


def synthetic_runs(root) -> None:
    """hkv_quality (stdlib with an int8 re-evaluation, recall at two pair counts, h_kv 4 and 1)
    and gqa_uptrain (two budgets, the second run retraining the same MHA model), 3 seeds."""
    rng = np.random.default_rng(0)
    shape = {"model": "quality-small", "num_layers": 2, "d_model": 32, "num_heads": 4}
    q = []
    for seed in range(3):
        for k in (4, 1):
            base = {**shape, "task": "stdlib", "num_kv_heads": k, "seed": seed, "steps": 10,
                    "tokens": 640, "chance_accuracy": 1 / 256}  # fmt: skip
            loss = 2 + 0.1 / k + rng.normal(0, 0.02)
            q.append({**base, "eval_kv_dtype": "f32", "kv_bytes_per_token": 64 * k,
                      "val_loss": loss, "val_accuracy": 0.5,
                      "history": _history(rng, [5, 10])})  # fmt: skip
            q.append({**base, "eval_kv_dtype": "int8", "kv_bytes_per_token": 20 * k,
                      "val_loss": loss + 0.01, "val_accuracy": 0.49})  # fmt: skip
            for pairs in (4, 8):
                q.append({**base, "model": "recall-small", "task": "recall", "num_pairs": pairs,
                          "chance_accuracy": 0.1, "eval_kv_dtype": "f32",
                          "kv_bytes_per_token": 64 * k, "val_loss": 1.0,
                          "val_accuracy": float(rng.uniform(0.1, 1.0)),
                          "history": _history(rng, [5, 10])})  # fmt: skip
    _run(root, "hkv_quality", "q", q)
    for run_id, budget, heads, methods in (("a", 4, (2, 1), ("mean", "first", "random")),
                                           ("b", 8, (2,), ("mean", "first"))):  # fmt: skip
        u = []
        for seed in range(3):
            u.append({**shape, "task": "stdlib", "num_kv_heads": 4, "method": "mha", "seed": seed,
                      "steps": 10, "kv_bytes_per_token": 256, "val_loss": 1.9 + seed / 100,
                      "history": _history(np.random.default_rng(seed), [5, 10])})  # fmt: skip
            for k in heads:
                for m in (*methods, "scratch"):
                    u.append({**shape, "task": "stdlib", "num_kv_heads": k, "method": m,
                              "seed": seed, "steps": 10 + budget, "kv_bytes_per_token": 64 * k,
                              "val_loss": float(2 + rng.normal(0, 0.05)),
                              "history": _history(rng, range(0, budget + 1, 2))})  # fmt: skip
                    if m != "scratch":
                        u[-1]["val_loss_before"] = float(2.5 + rng.normal(0, 0.05))
            if run_id == "b":  # MHA -> MLA at h_kv=2's bytes
                u.append({**shape, "task": "stdlib", "num_kv_heads": 4, "method": "mha2mla",
                          "variant": "MLA-30", "kv_lora_rank": 30, "qk_rope_head_dim": 2,
                          "seed": seed, "steps": 10 + budget, "kv_bytes_per_token": 128,
                          "val_loss_before": float(2.2 + rng.normal(0, 0.05)),
                          "val_loss": float(2 + rng.normal(0, 0.05)),
                          "history": _history(rng, range(0, budget + 1, 2))})  # fmt: skip
        _run(root, "gqa_uptrain", run_id, u)


def test_exported_records_draw_the_figures_the_runs_draw(tmp_path):
    from experiments.benchmarks.quality_results import export

    synthetic_runs(tmp_path / "runs")
    export([tmp_path / "runs"], tmp_path / "results")
    runs = load_records(tmp_path / "runs")
    exported = load_exports(tmp_path / "results")
    assert len(exported) == len(runs) - 3  # the second budget's MHA records: exported once
    assert exported.history.map(lambda h: isinstance(h, list)).sum() == len(exported) - 6
    for name, draw in DRAW.items():
        assert axes_data(draw, exported) == axes_data(draw, runs), name


def test_a_curve_file_of_other_records_is_refused(tmp_path):
    from kvjax.errors import KvjaxError

    for f in ("gqa_uptrain.csv", "gqa_uptrain_history.json"):
        (tmp_path / f).write_text((RESULTS / f).read_text())
    df = pd.read_csv(tmp_path / "gqa_uptrain.csv")
    df.loc[1, "seed"] = 7
    df.to_csv(tmp_path / "gqa_uptrain.csv", index=False)
    with pytest.raises(KvjaxError, match="row 1 does not match"):
        load_exports(tmp_path)


def test_the_committed_exports_draw_the_quality_figures(tmp_path):
    records = load_exports(RESULTS)
    written = {p.name: p.read_bytes() for p in make_figures(records, tmp_path / "a")}
    assert set(written) == {f"{n}.{e}" for n in DRAW for e in ("png", "pdf")}
    again = {p.name: p.read_bytes() for p in make_figures(records, tmp_path / "b")}
    assert written == again  # byte-identical: fixed metadata, no dates
    # (b) of hkv_quality: the recall means are the summary's, at the pair counts run
    fig = plt.figure()
    hkv_quality(records, fig)
    recall = fig.axes[1]
    summary = pd.read_csv(RESULTS / "hkv_quality_summary.csv")
    summary = gqa_sweep(summary[summary.task == "recall"])  # the sweep the panel draws
    for c in recall.containers:
        k = int(c.get_label().removeprefix("h_kv="))
        want = summary[summary.num_kv_heads == k].sort_values("num_pairs")
        assert list(c.lines[0].get_xdata()) == list(want.num_pairs)
        assert c.lines[0].get_ydata() == pytest.approx(want.val_accuracy.to_numpy())
    assert [t.get_text() for t in recall.get_xticklabels()] == ["8", "16", "28"]
    assert "recall ran h_kv 8/2/1 only (no h_kv=4)" in fig.axes[-1].texts[0].get_text()
    assert "quality-small (4 layers, d 128)" in fig.axes[0].get_title()
    plt.close(fig)
    # (a) of gqa_uptrain: each method's means at 40 fine-tune steps are the summary's
    fig = plt.figure()
    gqa_uptrain(records, fig)
    summary = pd.read_csv(RESULTS / "gqa_uptrain_summary.csv")
    at_40 = summary[(summary.steps == 440)]
    for c in fig.axes[0].containers:
        want = at_40[at_40.method == c.get_label()].sort_values("num_kv_heads")
        assert c.lines[0].get_ydata() == pytest.approx(want.val_loss.to_numpy())
    budget = {c.get_label() for c in fig.axes[1].containers}
    assert budget == {"mean", "first", "scratch"}  # random ran at one budget only
    assert fig.axes[2].get_ylabel()
    plt.close(fig)
    # (a) of mla_uptrain: MHA2MLA's means, narrowest latent first, are the summary's
    fig = plt.figure()
    mla_uptrain(records, fig)
    want = summary[summary.method == "mha2mla"].sort_values("kv_lora_rank")
    (mla,) = [c for c in fig.axes[0].containers if c.get_label() == "MLA (MHA2MLA)"]
    assert mla.lines[0].get_ydata() == pytest.approx(want.val_loss.to_numpy())
    assert len(want) == 3 and set(want.val_loss_n) == {5}
    plt.close(fig)


def test_model_shapes_match_the_configs():
    for name in ("hkv_quality", "hkv_recall", "gqa_uptrain", "gqa_uptrain_budget", "mla_uptrain"):
        model = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())["model"]
        want = QUALITY_MODELS[model["name"]]
        assert {k: model[k] for k in want} == want, name


def test_figures_command_reads_the_results_folder(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "f"
    argv = [sys.executable, "-m", "kvjax", "figures", "--results", str(RESULTS), "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert proc.returncode == 0, proc.stderr
    csvs = [pd.read_csv(RESULTS / f"{e}.csv") for e in ("hkv_quality", "gqa_uptrain")]
    runs = sum(c.run_id.nunique() for c in csvs)
    assert f"read {sum(map(len, csvs))} records of {runs} runs" in proc.stdout
    # the quality figures only: the explorer (from the presets) comes with --runs
    assert {p.name for p in out.iterdir()} == {f"{n}.{e}" for n in DRAW for e in ("png", "pdf")}
