"""Experiment configs, the launcher's resume, and reproducible figures."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from kvjax import KvjaxError
from kvjax.plotting import make_figures
from kvjax.runs.launcher import run_experiment
from kvjax.runs.records import load_records

SWEEP = """
experiment: kv_vs_context
model:
  preset: llama-3-8b
options:
  contexts: [1024, 4096]
sweep:
  model.num_kv_heads: [1, 2, 4, 8, 32]
  workload.batch: [1, 4]
"""


def write(tmp_path, text, name="exp.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_interrupted_sweep_resumes_without_recomputing(tmp_path, monkeypatch):
    import experiments.kv_vs_context as exp

    config = write(tmp_path, SWEEP)
    calls = []
    failed = []
    real = exp.run_point

    def failing(point):
        calls.append((point.model.num_kv_heads, point.workload.batch))
        if len(calls) == 4 and not failed:
            failed.append(True)
            raise RuntimeError("injected failure at point 4")
        return real(point)

    monkeypatch.setattr(exp, "run_point", failing)
    with pytest.raises(RuntimeError, match="injected failure"):
        run_experiment(config, runs_root=tmp_path / "runs", progress=False)
    run_dir = next((tmp_path / "runs" / "kv_vs_context").iterdir())
    done = sorted(p.name for p in (run_dir / "points").iterdir())
    assert len(done) == 3  # points 1..3 finished, 4 failed before writing
    assert not list(run_dir.rglob(".*"))  # no temporary (half-written) file left
    for f in (run_dir / "points").iterdir():
        json.loads(f.read_text())  # every record file is whole

    calls.clear()
    run = run_experiment(config, runs_root=tmp_path / "runs", progress=False)
    assert run.path == run_dir  # same config -> same run id -> resumed
    assert len(calls) == 10 - 3  # only the unfinished points ran
    assert len(list((run_dir / "points").iterdir())) == 10
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert all(p["done"] for p in manifest["points"]) and len(manifest["points"]) == 10
    env = json.loads((run_dir / "environment.json").read_text())
    assert {"jax", "flax", "backend", "device", "xla_flags", "cpu"} <= env.keys()
    assert env["cpu"].endswith(" cores)")  # the host CPU a measured figure names
    assert (run_dir / "config.yaml").read_text().startswith("experiment: kv_vs_context")
    df = load_records(tmp_path / "runs")
    assert len(df) == 10 * 4 * 2  # points x variants (MHA, GQA, MQA, MLA) x contexts
    assert set(df.variant) == {"MHA", "GQA", "MQA", "MLA A=512 P=64"}
    assert set(df.num_kv_heads) >= {1, 32}
    assert set(df.host_cpu) == {env["cpu"]}  # each record carries its run's CPU
    one = load_records([run_dir, tmp_path / "runs"])  # a run's own folder; each point counted once
    assert len(one) == len(df) and set(one.run_id) == {run_dir.name}

    calls.clear()
    run_experiment(config, runs_root=tmp_path / "runs", progress=False)
    assert calls == []  # a finished run recomputes nothing


def test_a_run_resumed_under_other_code_says_so(tmp_path, monkeypatch, capsys):
    """Each environment records the code's fingerprint (kvjax's and the experiments' sources and
    the corpus); resuming a run whose points another code computed warns, naming both, and keeps
    the points; under the same code, nothing is said."""
    from kvjax.runs import records

    config = write(tmp_path, SWEEP.replace("[1, 2, 4, 8, 32]", "[1, 8]"))
    run = run_experiment(config, runs_root=tmp_path / "runs", progress=False)
    now = records.code_fingerprint()
    assert json.loads((run.path / "environment.json").read_text())["code"] == now
    assert len(now) == 16 and run.stale_points(["no-such-point"]) is None
    run_experiment(config, runs_root=tmp_path / "runs", progress=False)
    assert "computed by other code" not in capsys.readouterr().err
    monkeypatch.setattr(records, "code_fingerprint", lambda: "0123456789abcdef")
    before = {f.name: f.read_bytes() for f in (run.path / "points").iterdir()}
    run_experiment(config, runs_root=tmp_path / "runs", progress=False)
    err = " ".join(capsys.readouterr().err.split())
    assert (f"4 of its 4 points were computed by other code (code {now}; this is "
            "0123456789abcdef)") in err and "fresh --runs folder" in err  # fmt: skip
    assert {f.name: f.read_bytes() for f in (run.path / "points").iterdir()} == before


def test_overrides_and_explicit_run_id(tmp_path):
    config = write(tmp_path, SWEEP)
    run = run_experiment(
        config,
        ["model.preset=mistral-7b", "options.contexts=[2048]"],
        runs_root=tmp_path / "runs",
        run_id="mine",
        progress=False,
    )
    assert run.path.name == "mine"
    records = run.records()
    assert {r["model"] for r in records} == {"mistral-7b"} and {r["context"] for r in records} == {
        2048
    }
    with pytest.raises(KvjaxError, match="holds a run of a different config"):
        run_experiment(config, runs_root=tmp_path / "runs", run_id="mine", progress=False)


@pytest.mark.parametrize(
    "text,override,message",
    [
        ("experiment: kv_vs_context\nmodel: [1, 2\n", None, "exp.yaml: malformed YAML"),
        (
            "experiment: kv_vs_context\nmodel:\n  num_kv_head: 4\n",
            None,
            "exp.yaml: model.num_kv_head: unknown key (allowed: preset",
        ),
        (
            "experiment: kv_vs_context\nworkload:\n  batch: many\n",
            None,
            "exp.yaml: workload.batch: Value 'many'",
        ),
        (
            "experiment: kv_vs_context\nmodel:\n  num_kv_heads: 6\n",
            None,
            "exp.yaml: num_heads=64 is not divisible by num_kv_heads=6",
        ),
        (
            "experiment: kv_vs_contxt\n",
            None,
            "exp.yaml: experiment: unknown experiment 'kv_vs_contxt'",
        ),
        (
            "experiment: kv_vs_context\n",
            "model.num_kv_heads=abc",
            "model.num_kv_heads: Value 'abc'",
        ),
        (
            "experiment: kv_vs_context\nsweep:\n  model.num_kv_heads: 3\n",
            None,
            "exp.yaml: sweep.model.num_kv_heads: Value 3",
        ),
        (
            "experiment: kv_vs_context\nworkload:\n  tp: 4\n",
            None,
            "exp.yaml: workload.tp=4, workload.dp=1: experiment kv_vs_context does not model "
            "parallelism (it would ignore them); experiments that do: serving_frontier, "
            "tensor_parallel",
        ),
        (
            "experiment: tensor_parallel\nmodel:\n  preset: mixtral-8x7b\nworkload:\n"
            "  ep: 8\n  dp_attention: 8\n",
            None,
            "exp.yaml: workload.ep=8, workload.dp_attention=8: experiment tensor_parallel models "
            "tensor parallelism only (it would ignore them); experiments that model these "
            "placements: serving_frontier",
        ),
        (
            "experiment: serving_frontier\nmodel:\n  preset: deepseek-v3\nworkload:\n"
            "  tp: 8\n  ep: 8\n",
            None,
            "exp.yaml: workload.ep / workload.dp_attention: ep=8 with tp=8, dp_attention=1: "
            "expert parallelism is modelled over data-parallel attention",
        ),
        (
            "experiment: tensor_parallel\nsweep:\n  workload.tp: [2, 3]\n",
            None,
            "exp.yaml: workload.tp: tp=3 does not divide num_heads=64; allowed tp: 1, 2, 4, 8",
        ),
        (
            "experiment: kv_vs_context\nsweep:\n  model.num_kv_heads: [1, 8]\n",
            "model.num_kv_heads=4",
            "override 'model.num_kv_heads=4' would be replaced by sweep.model.num_kv_heads; "
            "override the sweep instead: 'sweep.model.num_kv_heads=[4]'",
        ),
        (
            "experiment: tensor_parallel\nworkload:\n  dp: 2\n  batch: 3\n",
            None,
            "exp.yaml: workload.batch=3 is not divisible by workload.dp=2",
        ),
    ],
)
def test_bad_configs_are_one_line_exit_2(tmp_path, text, override, message):
    config = write(tmp_path, text)
    argv = [sys.executable, "-m", "kvjax", "run", str(config)]
    if override:
        argv.append(override)
    argv += ["--runs", str(tmp_path / "runs")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_figures_from_records_are_reproducible(tmp_path):
    run_experiment(write(tmp_path, SWEEP), runs_root=tmp_path / "runs", progress=False)
    records = load_records(tmp_path / "runs")
    first = {p.name: p.read_bytes() for p in make_figures(records, tmp_path / "a")}
    second = {p.name: p.read_bytes() for p in make_figures(records, tmp_path / "b")}
    assert set(first) == {"kv_vs_context.png", "kv_vs_context.pdf"}
    assert first == second


def test_default_suite_members_all_validate():
    from kvjax.runs.config import load_config
    from kvjax.runs.launcher import available_experiments, suite_members

    members = suite_members("configs/default.yaml")
    assert [m.name for m in members][:2] == ["seed_table.yaml", "kv_vs_context.yaml"]
    extended = suite_members("configs/measured.yaml")
    for m in members + extended:
        assert load_config(m).experiment in available_experiments()
    # together they run every measured config of the tree once (the figures need both)
    measured = {"roofline_cpu.yaml", "hkv_in_situ.yaml", "decode_latency_cpu.yaml",
                "hkv_ablation.yaml", "mla_ablation.yaml", "tensor_parallel.yaml",
                "profile_cpu.yaml"}  # fmt: skip
    names = [m.name for m in members + extended]
    assert measured <= set(names) and len(names) == len(set(names))


def test_suite_errors(tmp_path):
    from kvjax.runs.launcher import run_config

    bad = write(tmp_path, "suite: [missing.yaml]\n", "suite.yaml")
    with pytest.raises(KvjaxError, match="suite: .*missing.yaml does not exist"):
        run_config(bad)
    write(tmp_path, SWEEP, "member.yaml")
    good = write(tmp_path, "suite: [member.yaml]\n", "suite2.yaml")
    with pytest.raises(KvjaxError, match="a suite takes no overrides"):
        run_config(good, ["model.num_kv_heads=1"])
    runs = run_config(good, runs_root=tmp_path / "runs", progress=False)
    assert len(runs) == 1 and len(runs[0].records()) == 80


QUALITY_MODEL = """
model:
  preset: tiny-gqa
  num_layers: 1
  d_model: 32
  num_heads: 4
  head_dim: 8
  d_ff: 48
  vocab_size: 256
"""


@pytest.mark.slow
def test_quality_experiments_run_small_and_draw(tmp_path):
    quality = write(
        tmp_path,
        "experiment: hkv_quality"
        + QUALITY_MODEL
        + """  kv_group_size: 4
options: {task: stdlib, steps: 6, batch_size: 2, seq_len: 16, eval_every: 3, eval_batches: 1,
          warmup_steps: 1, max_bytes: 65536, eval_kv_dtypes: [int8, int4]}
sweep:
  model.num_kv_heads: [4, 1]
  options.seed: [0, 1]
""",
        "q.yaml",
    )
    uptrain = write(
        tmp_path,
        "experiment: gqa_uptrain"
        + QUALITY_MODEL.replace("head_dim: 8", "head_dim: 8\n  num_kv_heads: 4")
        + """
options: {task: stdlib, steps: 10, batch_size: 2, seq_len: 16, eval_every: 5, eval_batches: 1,
          warmup_steps: 1, max_bytes: 65536, uptrain_fraction: 0.4, kv_heads: [2, 1],
          methods: [mean, first], scratch: true}
""",
        "u.yaml",
    )
    q = run_experiment(quality, runs_root=tmp_path / "runs", progress=False).records()
    got = sorted((r["task"], r["num_kv_heads"], r["seed"], r["eval_kv_dtype"]) for r in q)
    # (the recall task runs in tests/test_mla_quality.py; the cache re-evaluation is the same
    # for every task)
    assert got == sorted(
        ("stdlib", k, seed, dtype) for k in (4, 1) for seed in (0, 1)
        for dtype in ("f32", "int8", "int4")
    )  # fmt: skip
    # one layer, H = 8: f32 K and V rows; int8 rows with an f32 scale each; int4 rows of 4 bytes
    # and two groups of 4 with an f16 scale and zero point each
    for r in q:
        per_row = {"f32": 8 * 4, "int8": 8 + 4, "int4": 4 + 2 * 4}[r["eval_kv_dtype"]]
        assert r["kv_bytes_per_token"] == 2 * 1 * r["num_kv_heads"] * per_row
    by_seed = {
        (r["task"], r["num_kv_heads"], r["eval_kv_dtype"], r["seed"]): r["val_loss"] for r in q
    }
    assert by_seed[("stdlib", 4, "f32", 0)] != by_seed[("stdlib", 4, "f32", 1)]
    u = run_experiment(uptrain, runs_root=tmp_path / "runs", progress=False).records()
    assert [(r["method"], r["num_kv_heads"]) for r in u] == [
        ("mha", 4),
        ("mean", 2),
        ("first", 2),
        ("scratch", 2),
        ("mean", 1),
        ("first", 1),
        ("scratch", 1),
    ]
    assert {r["steps"] for r in u if r["method"] != "mha"} == {10 + 4}  # the same tokens
    converted = [r for r in u if r["method"] in ("mean", "first")]
    assert all(r["history"][0]["step"] == 0 for r in converted)  # evaluated right after conversion
    # a second budget for h_kv=2 (the MHA model retrained identically: counted once)
    # ... and MHA -> MLA at h_kv=2's bytes: latent 30 + RoPE 2 = 2 x 2 x 8 elements a token
    longer = uptrain.read_text().replace("uptrain_fraction: 0.4, kv_heads: [2, 1]",
                                         "uptrain_fraction: 0.8, kv_heads: [2], mla_ranks: [30], "
                                         "mla_rope_dim: 2")  # fmt: skip
    run_experiment(write(tmp_path, longer, "b.yaml"), runs_root=tmp_path / "runs", progress=False)
    records = load_records(tmp_path / "runs")
    written = {p.name for p in make_figures(records, tmp_path / "f")}
    assert {"hkv_quality.png", "kv_pareto.png", "gqa_uptrain.png", "mla_uptrain.png"} <= written
    import matplotlib.pyplot as plt

    from kvjax.plotting.uptrain import gqa_uptrain

    fig = plt.figure()
    gqa_uptrain(records, fig)
    left, budget = fig.axes[:2]
    at = {c.get_label(): list(c.lines[0].get_xdata()) for c in budget.containers}
    assert at == {"mean": [4, 8], "first": [4, 8], "scratch": [4, 8]}
    assert {c.get_label(): list(c.lines[0].get_xdata()) for c in left.containers}["mean"] == [1, 2]
    plt.close(fig)
    from experiments.benchmarks.quality_results import export

    assert export([tmp_path / "runs"], tmp_path / "results")["gqa_uptrain"] == 1 + 6 + 3 + 1
    d = pd.read_csv(tmp_path / "results" / "quality_differences.csv").fillna({"condition": ""})
    d = d.set_index(["family", "comparison", "condition"])
    mqa = d.loc[("stdlib", "h_kv=1 - MHA", "")]
    by_hand = [by_seed[("stdlib", 1, "f32", s)] - by_seed[("stdlib", 4, "f32", s)] for s in (0, 1)]
    assert mqa.n == 2 and mqa["mean"] == pytest.approx(sum(by_hand) / 2)
    assert d.loc[("uptrain", "scratch - mha", "h_kv=2; fine-tune 8")].n == 1  # MHA once a seed
    mla = [r for r in load_records(tmp_path / "runs").to_dict("records")
           if r["method"] == "mha2mla"]  # fmt: skip
    assert [(r["variant"], r["kv_bytes_per_token"]) for r in mla] == [("MLA-30", 1 * 32 * 4)]
    mean = next(r for r in load_records(tmp_path / "runs").to_dict("records")
                if r["method"] == "mean" and r["steps"] == 18)  # fmt: skip
    row = d.loc[("uptrain", "mha2mla - mean", "MLA-30 vs h_kv=2 (128 B/token); fine-tune 8")]
    row = row.set_index("metric") if isinstance(row, pd.DataFrame) else row
    assert row.loc["val_loss", "mean"] == pytest.approx(mla[0]["val_loss"] - mean["val_loss"])


def test_tensor_parallel_experiment_checks_itself_and_draws(tmp_path):
    config = write(
        tmp_path,
        """
experiment: tensor_parallel
model: {preset: llama-3-8b, num_layers: 2}
workload: {phase: decode, batch: 2, context: 512}
options: {trace_up_to_tp: 4, trace_dtype: f32}
sweep:
  model.num_kv_heads: [8, 1]
  workload.tp: [1, 4, 16]
""",
        "tp.yaml",
    )
    records = run_experiment(config, runs_root=tmp_path / "runs", progress=False).records()
    assert sorted((r["num_kv_heads"], r["tp"]) for r in records) == [
        (k, t) for k in (1, 8) for t in (1, 4, 16)
    ]
    for r in records:  # the sharded model's shardings hold the closed form's bytes
        assert r["sharded_kv_cache_bytes_per_device"] == r["kv_cache_bytes_per_device"]
        assert r["sharded_weight_bytes_per_device"] == r["weight_bytes_per_device"]
    traced = [r for r in records if "traced_flops_per_device" in r]
    assert sorted((r["num_kv_heads"], r["tp"]) for r in traced) == [(1, 4), (8, 4)]
    for r in traced:  # compiled on 4 simulated devices in a subprocess, f32
        assert r["traced_flops_per_device"] == pytest.approx(
            r["traced_closed_flops_per_device"], rel=0.02
        )
        assert r["traced_collective_bytes"] == pytest.approx(
            r["traced_closed_collective_bytes"], rel=0.10
        )
    kv = {(r["num_kv_heads"], r["tp"]): r["kv_cache_bytes_per_device"] for r in records}
    assert kv[(8, 4)] * 4 == kv[(8, 1)] and kv[(8, 16)] == kv[(8, 1)] // 8  # one head each
    assert kv[(1, 16)] == kv[(1, 1)]  # MQA: every device keeps the one head
    written = {p.name for p in make_figures(load_records(tmp_path / "runs"), tmp_path / "f")}
    assert "tensor_parallel.png" in written


def test_sweep_entries_can_be_overridden(tmp_path):
    from kvjax.runs.config import expand, load_config

    cfg = load_config(write(tmp_path, SWEEP), ["sweep.model.num_kv_heads=[4, 2]"])
    assert list(cfg.sweep["model.num_kv_heads"]) == [4, 2]
    assert len(expand(cfg)) == 2 * 2  # with workload.batch [1, 4]
    with pytest.raises(KvjaxError, match="a sweep takes a list"):
        load_config(write(tmp_path, SWEEP), ["sweep.model.num_kv_heads=4"])
