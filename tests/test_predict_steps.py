"""A whole step predicted from its kernels (`kvjax.predict.steps`, `KernelStepTime`): by hand
from the classes' parameters, the fixed time per layer fitted and held out by group, nested."""

import math

import numpy as np
import pytest

from kvjax import kernels
from kvjax.analytic import roofline
from kvjax.analytic.costs import Workload
from kvjax.analytic.step import step_kernels
from kvjax.hardware import get_chip
from kvjax.model.config import get_model_config
from kvjax.predict import model, plans, steps
from kvjax.predict.heldout import conformal_ends


def test_a_step_is_its_kernels_by_their_classes_plus_one_fixed_time():
    """llama-3-8b, 8 decodes at 1,024 on an H100: q_proj is L launches of 2 x 8 x 4096 x 4096
    FLOPs and its bf16 weights, each t0 + max(F / (e_c P), Q / (e_b BW)) of the matmul class; the
    fused attention the decode class's (its exponentials hidden: memory-bound); a norm its bound;
    the step their sum plus the overhead, what `KernelStepTime` gives the batch (split as it
    splits a batch: shared kernels once over the 8 tokens, attention per request)."""
    from kvjax.predict.validate import corpus_classes
    from kvjax.serving.scheduler import Scheduled
    from kvjax.serving.step_time import KernelStepTime

    cfg = get_model_config("llama-3-8b", attention_kernel="flash")
    chip = get_chip("h100-sxm")
    fits = steps.kernel_fits(corpus_classes(), None)
    wl = Workload("decode", 8, 1024)
    ks = step_kernels(cfg, wl, chip)
    P, BW, L = chip.peak("bf16"), chip.bandwidth_bytes_per_s, 32  # noqa: N806
    m = fits["matmul"]
    q = ks[kernels.Q_PROJ]
    assert q.flops == L * 2 * 8 * 4096 * 4096 and q.weight_bytes == L * 4096 * 4096 * 2
    by_hand = L * (m.t0_s + max(q.flops / L / (m.compute_efficiency * P),
                                q.bytes / L / (m.bandwidth_efficiency * BW)))  # fmt: skip
    assert steps.kernel_s(fits, kernels.Q_PROJ, q, "decode", L, chip, P) == pytest.approx(by_hand)
    norm = ks[kernels.NORM_ATTN]
    assert steps.kernel_s(fits, kernels.NORM_ATTN, norm, "decode", L, chip, P) == (
        roofline.bound_time_s(norm.flops, norm.bytes, P, BW))  # fmt: skip
    a, d = ks[kernels.ATTENTION], fits["attention_decode"]
    # kvjax's plan: 8 sequences x 8 KV heads, split in 2 (ceil(132 / 64) = 3, to a power of two)
    # of 4 of the 8 128-key blocks: 128 programs on 132 SMs, the busiest core walks 4 blocks where
    # the mean core walks 512 / 132
    stretch = 4 / (8 * 8 * 8 / 132)
    assert plans.attention_stretch(cfg, wl, chip) == pytest.approx(stretch)
    assert steps.kernel_s(
        fits, kernels.ATTENTION, a, "decode", L, chip, P, stretch=stretch
    ) == pytest.approx(L * (d.t0_s + a.bytes / L / (d.bandwidth_efficiency * BW) * stretch))
    total = steps.kernels_s(fits, cfg, wl, chip)
    assert total == pytest.approx(
        sum(
            steps.kernel_s(
                fits, n, k, "decode", L, chip, P, stretch=stretch if n == kernels.ATTENTION else 0
            )
            for n, k in ks.items()
        )
    )
    # a hybrid's attention runs in its attention layers only: 12 of qwen3-next's 48
    hybrid = get_model_config("qwen3-next-80b-a3b", attention_kernel="flash")
    assert steps.kernel_layers(hybrid)[kernels.ATTENTION] == 12
    assert steps.kernel_layers(get_model_config("deepseek-v3"))[kernels.MOE_GATE_UP] == 58
    model = KernelStepTime(cfg, chip)
    batch = [Scheduled(None, 1, 1024) for _ in range(8)]
    assert model(batch) == pytest.approx(L * model.overhead.t0_s + total, rel=1e-9)  # per layer
    assert model.overhead.t0_s > 0


def test_the_fixed_time_is_fitted_and_held_out_by_group_nested():
    """Three groups of steps whose kernels sum to s and which took s + 2 ms: the fitted t0 is
    2 ms (to the grid's 1.2%); each group's t0 is the other groups' fit; its interval ends are
    the 10th/90th order statistics of the residuals of every other group h under a t0 fitted
    on neither (by hand for group 'a')."""
    assert steps.fit_t0(np.array([1e-3, 5e-3, 2e-2]), np.array([3e-3, 7e-3, 2.2e-2])) == (
        pytest.approx(2e-3, rel=0.012))  # fmt: skip
    rng = np.random.default_rng(0)
    s = rng.uniform(1e-3, 3e-2, 30)
    g = np.repeat(["a", "b", "c"], 10)
    y = (s + np.where(g == "a", 1e-3, np.where(g == "b", 2e-3, 4e-3))) * rng.uniform(0.9, 1.1, 30)
    held, whole, resid = steps.leave_one_group_out(s, y, g)
    assert held["a"].t0_s == steps.fit_t0(s[g != "a"], y[g != "a"])
    assert whole.t0_s == steps.fit_t0(s, y) and whole.groups == 3
    calib = [np.log(y[g == h] / (steps.fit_t0(s[g == k], y[g == k]) + s[g == h]))
             for h, k in (("b", "c"), ("c", "b"))]  # fmt: skip
    assert (held["a"].lo, held["a"].hi) == conformal_ends(np.concatenate(calib), 0.1)
    assert resid[g == "a"] == pytest.approx(np.log(y[g == "a"] / (held["a"].t0_s + s[g == "a"])))
    with pytest.raises(Exception, match="3 groups or more"):
        steps.leave_one_group_out(s[:4], y[:4], ["a", "a", "b", "b"])


def test_the_fixed_time_is_paid_once_per_layer():
    """Steps of 32- and 80-layer models whose kernels sum to s and which took s + L x 50 us: the
    per-layer fit recovers 50 us (to the grid's 1.2%) and predicts every step to 1.2%; one time
    a step cannot (it is too long for the 32 layers' steps and too short for the 80's). The
    `step` class pays its t0 per layer as well: its fit on such steps recovers it."""
    s = np.array([2e-3, 8e-3, 2e-2, 5e-3, 2e-2, 4e-2])
    L = np.array([32, 32, 32, 80, 80, 80])  # noqa: N806
    y = s + L * 50e-6
    t0 = steps.fit_t0(s, y, L)
    assert t0 == pytest.approx(50e-6, rel=0.012)
    assert t0 * L + s == pytest.approx(y, rel=0.012)
    once = steps.fit_t0(s, y) + s
    assert (once[:3] > y[:3] * 1.05).any() and (once[3:] < y[3:] * 0.95).any()
    xs = [model.Features(1e9, b * 2e12, 1e15, 2e12, launches=n) for b, n in zip(s, L, strict=True)]
    fit = model.fit(xs, y)
    assert fit.t0_s == pytest.approx(50e-6, rel=0.05) and fit.bandwidth_efficiency > 0.95
    assert fit.predict(xs) == pytest.approx(y, rel=0.03)


def test_the_corpus_steps_from_their_kernels_held_out():
    """The committed step rows, each predicted by the kernel fits and fixed time that left its
    group out: what VALIDATE.md quotes, and a fixed time per layer between a kernel launch's
    microseconds and a millisecond."""
    out = steps.step_summary()
    assert out["rows"] == 67 and out["groups"] == 5
    assert 2e-6 < out["t0_s"] < 1e-3
    c = steps.corpus_steps()
    ratio = [r.ratio for r in c["rows"]]
    assert out["loso_median_abs_error"] == float(np.median(np.abs(np.array(ratio) - 1)))
    from pathlib import Path

    doc = " ".join((Path(__file__).parents[1] / "experiments/published/VALIDATE.md").read_text()
                   .split())  # fmt: skip
    said = (
        f"{out['loso_median_abs_error']:.1%} median held-out error (the `step` class: 10.6%; "
        f"paid once a step, 15.6%), {out['loso_coverage_80']:.0%} coverage, median width "
        f"{out['interval_80_median_width']:.0%} (90%; once a step, 95%), "
        f"t0 = {1e6 * out['t0_s']:.1f} us a layer"
    )
    assert said in doc
    assert all(math.isfinite(x) and x > 0 for x in ratio)


def test_simulate_with_steps_from_their_kernels(capsys):
    """`kvjax simulate --step-time kernels`: says its step model, and every step lies above the
    bound's (a class's efficiencies are at most 1, its t0 and the fixed time at least 0), so the
    same load takes longer than under `--step-time bound`."""
    import json

    from kvjax.cli.main import main

    flags = ["simulate", "--model", "llama-3-8b", "--chip", "h100-sxm", "--rate", "50",
             "--requests", "12", "--prompt-len", "300", "--output-len", "20", "--json"]  # fmt: skip
    out = {}
    for kind in ("bound", "kernels"):
        assert main([*flags, "--step-time", kind]) == 0
        out[kind] = json.loads(capsys.readouterr().out)
    assert out["kernels"]["step_time"].startswith("predicted from its kernels")
    assert out["kernels"]["requests_out"] == out["bound"]["requests_out"] == 12
    k, b = out["kernels"]["ttft_s"]["mean"], out["bound"]["ttft_s"]["mean"]
    assert k > b > 0


def test_a_predicted_step_runs_its_all_reduces_as_engines_reach_them():
    """The seed's 70B at tp 4 on H100s, a decode of 3 at 101: the bound's link is the line rate
    (450 GB/s, no latency); the prediction's NCCL's 370 GB/s bus bandwidth and the custom
    all-reduce's 5.9 us for each of the 161 all-reduces and the logits' all-gather (by hand);
    the A100's 230 GB/s and no sourced latency; a chip with no source keeps the line rate."""
    from kvjax.analytic.parallel import device_config
    from kvjax.predict.collectives import all_reduce
    from kvjax.serving.scheduler import Request, Scheduled
    from kvjax.serving.step_time import ClosedFormStepTime, PlacedStepTime

    cfg, chip = get_model_config("seed-70b"), get_chip("h100-sxm")
    shard = ClosedFormStepTime(device_config(cfg, 4), chip)
    batch = [Scheduled(Request(i, 0.0, 100, 5), 1, 101) for i in range(3)]
    sent = 161 * 1.5 * 3 * 8192 * 2 + 0.75 * 3 * 128256 * 4
    bound = PlacedStepTime(shard, cfg, chip, 4)
    assert bound(batch) == pytest.approx(shard(batch) + sent / 450e9, rel=1e-12)
    achieved = PlacedStepTime(shard, cfg, chip, 4, achieved=True)
    assert achieved(batch) == pytest.approx(shard(batch) + sent / 370e9 + 162 * 5.9e-6, rel=1e-12)
    assert achieved.decode_steps([100] * 3, 2)[0] == pytest.approx(achieved(batch), rel=1e-12)
    a100 = all_reduce("a100-80gb", 300e9)
    assert (a100.bus_bytes_per_s, a100.latency_s) == (230e9, 0.0)
    # Blackwell's: each number the one its source's quote states, below NVLink 5's line rate
    b200, gb200 = all_reduce("b200", 900e9), all_reduce("gb200", 900e9)
    assert (b200.bus_bytes_per_s, b200.latency_s) == (830e9, 8.7e-6)
    assert "'Ours is 830+'" in b200.source and "'13.5us->8.7us'" in b200.source
    assert (gb200.bus_bytes_per_s, gb200.latency_s) == (679.61e9, 8e-6)
    assert "679.61 GB/s" in gb200.source and "'under 8us" in gb200.source
    mi300x = all_reduce("mi300x", 448e9)
    assert (mi300x.bus_bytes_per_s, mi300x.latency_s) == (448e9, 0.0)
    assert "no source" in mi300x.source


def test_calc_predict_prints_the_step_from_its_kernels(capsys):
    """`kvjax calc --predict`: beside the step class's whole step, the step from its kernels,
    the fixed time plus `kernels_s` on fused attention, its interval's lower edge no lower than
    the sum of the kernels' bounds."""
    import json

    from kvjax.cli.main import main
    from kvjax.predict.validate import corpus_classes

    assert main(["calc", "--model", "llama-3-8b", "--chip", "h100-sxm", "--batch", "32",
                 "--context", "4096", "--predict", "--json"]) == 0  # fmt: skip
    predicted = json.loads(capsys.readouterr().out)["predicted"]
    got = predicted["step_from_kernels"]
    cfg = get_model_config("llama-3-8b", attention_kernel="flash")
    chip = get_chip("h100-sxm")
    wl = Workload("decode", 32, 4096)
    want = cfg.num_layers * steps.corpus_steps()["all"].t0_s + steps.kernels_s(
        steps.kernel_fits(corpus_classes(), None), cfg, wl, chip)  # fmt: skip
    assert got["predicted_s"] == pytest.approx(want, rel=1e-12)
    bound = sum(roofline.bound_time_s(k.flops, k.bytes, chip.peak("bf16"),
                                      chip.bandwidth_bytes_per_s)
                for k in step_kernels(cfg, wl, chip).values())  # fmt: skip
    assert bound <= got["predicted_lo_s"] < got["predicted_s"] < got["predicted_hi_s"]
    from pathlib import Path

    doc = " ".join((Path(__file__).parents[1] / "experiments/published/VALIDATE.md").read_text()
                   .split())  # fmt: skip
    step = predicted["step"]["predicted_s"]
    ms = [1e3 * x for x in (step, got["predicted_s"], got["predicted_lo_s"], got["predicted_hi_s"])]
    assert ("{:.1f} ms by the step class and {:.1f} ms [{:.1f}, {:.1f}] from its kernels"
            .format(*ms)) in doc  # fmt: skip


def test_nvfp4_weights_take_four_and_a_half_bits_of_an_fp8_config():
    """A published NVFP4 row runs an fp8 config whose weights take 4.5 / 8 of its bytes: each
    kernel's weight bytes scaled (its other bytes and FLOPs kept), and the cache pool gains the
    bytes the weights give back."""
    from kvjax.serving.memory import kv_pool
    from kvjax.serving.system_predict import NVFP4_BITS

    cfg, chip = get_model_config("llama-3-8b", weight_dtype="fp8"), get_chip("b200")
    q = step_kernels(cfg, Workload("decode", 8, 1024), chip)[kernels.Q_PROJ]
    s = NVFP4_BITS / 8
    got = steps.scale_weights(q, s)
    assert s == 0.5625 and got.weight_bytes == q.weight_bytes * s and got.flops == q.flops
    assert got.bytes - got.weight_bytes == pytest.approx(q.bytes - q.weight_bytes, rel=1e-12)
    assert steps.scale_weights(q, 1.0) is q
    whole, nvfp4 = (kv_pool(cfg, chip, 16, 2048, 4096, 0.9, 0, 8, scale) for scale in (1.0, s))
    freed = whole.weight_bytes * (1 - s)
    assert nvfp4.weight_bytes == pytest.approx(whole.weight_bytes * s, rel=1e-12)
    assert (nvfp4.pages - whole.pages) * 16 * whole.bytes_per_token == pytest.approx(
        freed, rel=1e-3
    )
