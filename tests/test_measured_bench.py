"""The measured view's harness: ceilings, placement, refusal, the bench command. No speeds."""

import glob
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import optimised_env

from kvjax import KvjaxError, get_model_config, kernels
from kvjax.analytic import Workload
from kvjax.cli import main
from kvjax.hardware import chip_from_numbers
from kvjax.measured.bench import bench_point, place
from kvjax.measured.ceilings import ceilings_cache_path, load_or_measure_ceilings
from kvjax.measured.kernels import kernel_benches, time_kernel
from kvjax.measured.step import time_decode_step


@pytest.fixture
def empty_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="session")
def measured_ceilings(tmp_path_factory):
    """This machine's ceilings, measured once a session (quick) for the tests that only read
    them (`test_ceilings_are_positive_and_cached` measures its own)."""
    path = tmp_path_factory.mktemp("ceilings") / "ceilings.json"
    load_or_measure_ceilings(quick=True, path=path)
    return path


@pytest.fixture
def cache_home(empty_cache_home, measured_ceilings):
    """A fresh cache folder holding the session's ceilings."""
    target = ceilings_cache_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(measured_ceilings, target)
    return empty_cache_home


def test_ceilings_are_positive_and_cached(empty_cache_home):
    cache_home = empty_cache_home
    first = load_or_measure_ceilings(quick=True)
    assert ceilings_cache_path().exists() and str(cache_home) in str(ceilings_cache_path())
    assert first.peak("f32") > 0 and first.peak("bf16") > 0  # how high depends on the machine
    assert first.bandwidth_bytes_per_s > 0 and first.date
    by_kernel = first.extra["bandwidth_bytes_per_s_by_kernel"]
    assert set(by_kernel) == {"read", "gemv", "copy", "triad"}
    assert first.bandwidth_bytes_per_s == max(by_kernel["read"], by_kernel["gemv"])  # best read
    rw = first.extra["read_write_bandwidth_bytes_per_s"]
    assert rw == max(by_kernel["copy"], by_kernel["triad"])
    for name, trials in first.extra["bandwidth_trials_bytes_per_s"].items():
        assert len(trials) == 3 and max(trials) == by_kernel[name]
    assert first.peak("f32") == max(
        max(r) for r in first.extra["flops_trials_per_s"]["f32"].values()
    )
    again = load_or_measure_ceilings()  # read back, not measured
    assert again == first


def test_known_kernels_land_on_the_right_side_of_the_ridge(cache_home):
    ceilings = chip_from_numbers(100e9, 10e9, dtype="f32")  # ridge 10 FLOP/byte
    cfg = get_model_config("llama-3-8b", num_layers=1, weight_dtype="f32", kv_dtype="f32")
    decode = kernel_benches(cfg, Workload("decode", 1, 64))[kernels.K_PROJ]
    prefill = kernel_benches(cfg.replace(d_ff=256), Workload("prefill", 1, 256))[kernels.K_PROJ]
    fake = type("S", (), {"median_s": 1.0, "min_s": 1.0, "iqr_s": 0.0, "runs": 1, "device": "x"})
    assert place("k", decode.closed, fake, ceilings, "f32")["bound"] == "memory"  # I ~ 0.5
    assert place("k", prefill.closed, fake, ceilings, "f32")["bound"] == "compute"  # I ~ 100


def test_bench_point_times_every_kernel_and_the_step():
    ceilings = chip_from_numbers(100e9, 10e9, dtype="f32")
    cfg = get_model_config("tiny-gqa")
    points = bench_point(cfg, Workload("decode", 2, 64), ceilings, budget_s=0.05)
    names = [p["kernel"] for p in points]
    assert (
        names[-1] == kernels.STEP_KERNEL and kernels.ATTENTION in names and kernels.SCORES in names
    )
    by = {p["kernel"]: p for p in points}
    assert by[kernels.Q_PROJ]["traced_bytes"] == pytest.approx(by[kernels.Q_PROJ]["closed_bytes"])
    assert (
        by[kernels.ATTENTION]["traced_bytes"] >= by[kernels.ATTENTION]["closed_bytes"]
    )  # unfused softmax
    for p in points:
        assert p["median_s"] > 0 and p["runs"] >= 5 and p["num_kv_heads"] == 3
        assert p["fraction_of_bound"] == pytest.approx(p["bound_s"] / p["median_s"])
        assert p["achieved_bytes_per_s"] == pytest.approx(p["closed_bytes"] / p["median_s"])
    with pytest.raises(KvjaxError, match="unknown kernel"):
        bench_point(cfg, Workload("decode", 2, 64), ceilings, names=["attn/qproj"])


@pytest.mark.parametrize("preset,phase", [("tiny-gqa", "decode"), ("tiny-mla", "decode"),
                                          ("tiny-gqa", "prefill")])  # fmt: skip
def test_bench_times_the_fused_attention_and_says_what_runs_it(preset, phase):
    """A flash model's bench times the fused kernel the model runs (no scores/softmax/av of the
    unfused form), against the closed form's fused kernel + combine; on a CPU the Pallas decode
    is marked interpreted (no traced bytes: the interpreter's loop is not a cost) and the
    prefill names XLA's unfused composite (its traced bytes far above the fused count)."""
    from kvjax import analytic

    ceilings = chip_from_numbers(100e9, 10e9, dtype="f32")
    cfg = get_model_config(preset, num_layers=2, attention_kernel="flash",
                           **({"mla_decode": "absorbed"} if "mla" in preset else {}))  # fmt: skip
    wl = Workload(phase, 2, 64)
    points = bench_point(cfg, wl, ceilings, budget_s=0.05, include_step=phase == "decode")
    by = {p["kernel"]: p for p in points}
    assert not set(by) & set(kernels.ATTENTION_PARTS)
    att = by[kernels.ATTENTION]
    layer = analytic.layer_kernels(cfg, wl)
    want = sum(layer[n].bytes for n in (kernels.ATTENTION, kernels.ATTN_COMBINE) if n in layer)
    assert att["closed_bytes"] == want
    if phase == "decode":
        assert att["executed_as"] == "pallas interpret" and att["interpreted"]
        assert att["traced_bytes"] is None
        assert by[kernels.STEP_KERNEL]["interpreted"]
    else:
        assert att["executed_as"] == "xla composite (not fused)" and not att["interpreted"]
        assert att["traced_bytes"] > 5 * att["closed_bytes"]  # the 64 x 64 scores through memory
    assert not by[kernels.Q_PROJ]["interpreted"] and by[kernels.Q_PROJ]["executed_as"] is None


def test_inputs_rotate_past_the_cache():
    cfg = get_model_config("tiny-mqa")
    kb = kernel_benches(cfg, Workload("decode", 1, 16))[kernels.Q_PROJ]
    first, second = kb.make_args(0), kb.make_args(1)
    assert float(abs(first[1] - second[1]).min()) > 0  # every element differs between sets
    assert float(abs(first[1]).min()) > 0  # random, never zeros
    assert 0.8 < float(first[1].std()) < 1.2  # standard normal
    assert time_kernel(kb, budget_s=0.02).runs >= 5


def test_a_step_that_cannot_fit_is_refused_before_allocating():
    cfg = get_model_config("seed-70b", weight_dtype="f32")  # 282 GB of weights
    with pytest.raises(KvjaxError, match=r"needs .* GiB but the device has .* GiB free"):
        time_decode_step(cfg, Workload("decode", 1, 1024))


def test_bench_command_json(cache_home, capsys):
    argv = [
        "bench",
        "--json",
        "--model",
        "tiny-gqa",
        "--context",
        "64",
        "--kv-heads",
        "1,3",
        "--kernels",
        "attention,attn/q_proj,step",
        "--budget-s",
        "0.05",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"].startswith("cpu") and out["ceilings"]["bandwidth_bytes_per_s"] > 0
    assert {(p["num_kv_heads"], p["kernel"]) for p in out["points"]} == {
        (k, n) for k in (1, 3) for n in (kernels.ATTENTION, kernels.Q_PROJ, kernels.STEP_KERNEL)
    }
    for p in out["points"]:
        assert {
            "num_kv_heads",
            "kernel",
            "median_s",
            "bound_s",
            "closed_bytes",
            "achieved_bytes_per_s",
            "fraction_of_bound",
        } <= p.keys()


def test_bench_rejects_bad_sweep():
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--model", "tiny-gqa", "--kv-heads", "1,x"])
    assert exc.value.code == 2


@pytest.mark.slow
def test_gpu_check_quick_runs_on_cpu(tmp_path, cache_home):
    # as the GPU machine runs it: a child process from the tree, with the optimised flags
    out = tmp_path / "out"
    root = Path(__file__).resolve().parents[1]
    env = optimised_env() | {"PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "experiments.benchmarks.gpu_check", str(out), "--quick"]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("environment", "ceilings", "attention_sweep", "mla_attention_sweep",
                 "flash_sweep", "done"):  # fmt: skip
        assert (out / f"{name}.json").exists()
    fused = json.loads((out / "flash_sweep.json").read_text())["points"]
    runs = {(p["phase"], p["executed_as"]) for p in fused}
    assert runs == {
        ("decode", "xla"),
        ("decode", "pallas interpret"),
        ("prefill", "xla"),
        ("prefill", "xla composite (not fused)"),
        ("prefill", "pallas interpret"),
    }
    assert all(p["interpreted"] == (p["executed_as"] == "pallas interpret") for p in fused)
    # the fused decode reads the cache once: its intensity above the unfused form's, at h/h_kv
    by = {(p["phase"], p["num_kv_heads"], p["executed_as"]): p for p in fused}
    assert by["decode", 8, "pallas interpret"]["intensity"] > by["decode", 8, "xla"]["intensity"]
    sweep = json.loads((out / "attention_sweep.json").read_text())
    assert [p["num_kv_heads"] for p in sweep["points"]] == [1, 8, 32]
    # its runs folder is drawn by `kvjax figures` beside another
    from kvjax.plotting import make_figures
    from kvjax.runs.records import load_records

    records = load_records([out / "runs"])
    assert set(records.experiment) == {"profile"}
    assert sorted(set(records.num_kv_heads)) == [1, 3] and sorted(set(records.batch)) == [1, 4]
    assert glob.glob(str(out / "traces" / "B1-kv3" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    written = make_figures(records, tmp_path / "figs")
    assert {p.name for p in written} == {"kernel_bound.png", "kernel_bound.pdf"}


def test_gpu_check_fails_fast_in_one_line(capsys, monkeypatch):
    """The GPU machine installs nothing: a missing module or a flax too old for its jax is one
    line and exit 2, before any device time is spent."""
    from experiments.benchmarks import gpu_check

    assert gpu_check.preflight() == []
    missing = gpu_check.preflight(lambda name: None if name == "optax" else object())
    assert len(missing) == 1 and missing[0].startswith("missing: optax")
    monkeypatch.setattr(gpu_check, "preflight", lambda: ["missing: optax"])
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(["/nonexistent/out"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == "gpu_check: missing: optax"
    assert gpu_check._version("0.12.7") >= gpu_check.FLAX_FOR_JAX_011 > gpu_check._version("0.12.6")
