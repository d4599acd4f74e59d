"""Issue 38: the published corpus against kvjax's bounds, and the efficiency model."""

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from kvjax import kernels
from kvjax.cli.main import main
from kvjax.errors import KvjaxError
from kvjax.predict import model
from kvjax.predict.bounds import closed_form
from kvjax.predict.corpus import COLUMNS, read_corpus, read_csv
from kvjax.predict.validate import validate

CORPUS = Path(__file__).parents[1] / "experiments/published"


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def report():
    return validate(read_corpus())


def test_corpus_is_under_its_bounds(report):
    s = report["summary"]
    assert s["rows"] >= 80 and s["sources"] >= 12
    assert {r["kernel"] for r in report["rows"]} == {
        "attention_prefill",
        "attention_decode",
        "matmul",
        "decode_step",
        "prefill_step",
    }
    assert {r["chip"] for r in report["rows"]} >= {"h100-sxm", "h800", "a100-80gb", "tpu-v5e"}
    flagged = [r for r in report["rows"] if r["above_bound"] and not r["flag_reason"]]
    assert not flagged, [(r["file"], r["line"]) for r in flagged]


def test_flashattention3_row_is_bounded_at_its_time(report):
    """FA3's forward chart, causal, H = 128, 16 heads, batch 2 at 8k: 602 TFLOP/s by its count
    4 B S^2 N H / 2, i.e. 0.913 ms; the bound (compute: the exact causal FLOPs at 989
    TFLOP/s) lies below it; the implementation model reads Q, K, V and O once through the L2."""
    (row,) = [r for r in report["rows"] if r["implementation"] == "FlashAttention-3"
              and r["causal"] and r["head_dim"] == 128 and r["seq_q"] == 8192
              and r["batch"] == 2 and r["chip"] == "h100-sxm"
              and r["source"].startswith("FlashAttention-3")]  # fmt: skip
    assert row["measured_s"] == pytest.approx(4 * 2 * 8192**2 * 16 * 128 / 2 / 602e12, rel=1e-4)
    assert row["bound_s"] <= row["measured_s"] <= 0.91e-3 * 1.01
    assert row["closed_bytes"] == 4 * 2 * 8192 * 16 * 128 * 2  # Q, K, V, O once through the L2


def test_fused_attention_rows_are_bounded_by_exact_flops_and_compulsory_bytes(report):
    """Issue 49: every fused-attention row's bound is max(exact FLOPs / peak, compulsory bytes /
    bandwidth), derived here by hand for FA3's causal 8k row (T(T+1)/2 pairs a head, Q, K, V,
    O once) and a non-causal one, and the bound never exceeds the implementation model's counts
    or its prediction (whose interval starts at the bound); 0 rows above it."""
    for r in report["rows"]:  # every row: attention, GEMMs and whole steps
        assert r["bound_s"] == pytest.approx(
            max(
                r["bound_flops"] / r["peak_flops_per_s"],
                r["bound_bytes"] / r["bandwidth_bytes_per_s"],
            )
        )
        assert r["bound_flops"] <= r["closed_flops"] and r["bound_bytes"] <= r["closed_bytes"]
        assert r["bound_s"] <= r["predicted_lo_s"] <= r["predicted_s"]
    assert not any(r["above_bound"] for r in report["rows"])
    rows = [r for r in report["rows"] if r["kernel"] in ("attention_prefill", "attention_decode")]
    B, S, N, H = 2, 8192, 16, 128
    for causal, pairs in ((True, S * (S + 1) // 2), (False, S * S)):
        (row,) = [r for r in rows if r["implementation"] == "FlashAttention-3"
                  and r["causal"] == causal and r["head_dim"] == H and r["seq_q"] == S
                  and r["batch"] == B and r["chip"] == "h100-sxm" and r["dtype"] == "f16"
                  and r["source"].startswith("FlashAttention-3")]  # fmt: skip
        assert row["bound_flops"] == B * N * pairs * 4 * H
        assert row["bound_bytes"] == 4 * B * S * N * H * 2
        assert row["bound_s"] == pytest.approx(B * N * pairs * 4 * H / 989e12)
    # the 1.5x block-causal FLOPs and 2.67x per-wave bytes are the model's, not the bound's
    assert min(r["bound_flops"] / r["closed_flops"] for r in rows) < 0.7
    assert min(r["bound_bytes"] / r["closed_bytes"] for r in rows) < 0.4


def test_a_decode_step_row_is_bounded_by_weights_and_the_seed_cache(report):
    """A whole decode step's bound: the weights once and the seed's KV cache 2 L h_kv d_h S B
    bytes read once (the S positions attended), plus the B new rows written; the activations
    between kernels are the engine's fusion, not the bound's."""
    from kvjax import get_chip, get_model_config
    from kvjax.analytic.costs import Workload
    from kvjax.analytic.step import step_cost

    rows = [r for r in report["rows"] if r["kernel"] == "decode_step"
            and r["model"] == "llama-2-7b" and r["dtype"] == "bf16"]  # fmt: skip
    assert rows
    for r in rows:
        cfg = get_model_config("llama-2-7b", kv_dtype=r["kv_dtype"] or "bf16",
                               attention_kernel="flash")  # fmt: skip
        L, K, H, B, S = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, r["batch"], r["context"]
        b = cfg.kv_bytes_per_element
        wl = Workload("decode", B, S)
        weights = step_cost(cfg, wl, get_chip(r["chip"])).weight_bytes
        assert r["bound_bytes"] == pytest.approx(
            weights + 2 * L * K * H * S * B * b + 2 * L * K * H * B * b, rel=1e-12
        )
        assert r["bound_bytes"] < r["closed_bytes"]


def test_gemm_row_closed_form_by_hand(report):
    """DeepGEMM's README, M=64 N=2112 K=7168 fp8 on an H800: 2mnk FLOPs; A and B in one byte,
    C in bf16 (the README's own byte count, 1688 GB/s at 206 TFLOPS)."""
    rows = [r for r in report["rows"] if (r["m"], r["n"], r["k"]) == (64, 2112, 7168)
            and r["chip"] == "h800" and r["dtype"] == "fp8" and not r["batch"]]  # fmt: skip
    assert rows
    m, n, k = 64, 2112, 7168
    flops, nbytes = 2 * m * n * k, m * k + k * n + 2 * m * n
    for r in rows:
        assert (r["closed_flops"], r["closed_bytes"]) == (flops, nbytes)
        assert r["bound_s"] == pytest.approx(max(flops / 1979e12, nbytes / 3.352e12))
    readme = [r for r in rows if "206" in r["convention"]]
    assert nbytes / readme[0]["measured_s"] == pytest.approx(1688e9, rel=0.01)


def test_fp4_gemm_row_closed_form_by_hand(report):
    """DeepGEMM PR #348's MXFP4 8192^3 on a B200: 2mnk FLOPs at the fp4 peak (9 PFLOP/s dense),
    the bound's A and B at 4 bits an element (their scales left out: fewer bytes keep it a bound),
    the model's with MXFP4's e8m0 scale a block of 32 (4.25 bits), C in bf16; its printed 5702
    TFLOP/s is 0.63 of that peak."""
    rows = [r for r in report["rows"] if (r["m"], r["n"], r["k"]) == (8192, 8192, 8192)
            and r["chip"] == "b200" and r["dtype"] == "fp4"
            and r["implementation"].startswith("DeepGEMM")]  # fmt: skip
    assert len(rows) == 1
    n = 8192
    flops, nbytes = 2 * n**3, 2 * n * n * 0.5 + 2 * n * n
    r = rows[0]
    assert (r["closed_flops"], r["bound_bytes"]) == (flops, nbytes)
    assert r["closed_bytes"] == 2 * n * n * 0.5 * 4.25 / 4 + 2 * n * n
    assert r["bound_s"] == pytest.approx(flops / 9000e12) and r["bound_side"] == "compute"
    assert flops / r["measured_s"] == pytest.approx(5702e12, rel=1e-3)
    assert r["fraction_of_bound"] == pytest.approx(5702 / 9000, rel=1e-3)


def test_leave_one_source_out_error_and_coverage_are_validate_md(report):
    """The held-out error, coverage and interval width that experiments/published/VALIDATE.md
    states, per class and over every held-out row, are what `validate` gives (the rows recounted
    here by hand); held out by source group, 18 groups (one an organisation)."""
    text = (Path(__file__).parents[1] / "experiments/published/VALIDATE.md").read_text()
    table = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and cells[6].endswith("%") and cells[7].endswith("%"):
            table[cells[0]] = cells
    held = [r for r in report["rows"] if r["held_out_covered"] is not None]
    err = np.median([abs(r["held_out_predicted_s"] / r["measured_s"] - 1) for r in held])
    coverage = np.mean([r["held_out_covered"] for r in held])
    row = table["all held-out rows"]
    groups = report["summary"]["source_groups"]
    assert (int(row[4]), int(row[5]), row[6], row[7]) == (
        len(held), groups, f"{err:.1%}", f"{coverage:.0%}")  # fmt: skip
    assert groups == len({r["source_group"] for r in report["rows"]}) == 18
    for cls in ("attention_prefill", "attention_decode", "matmul", "step"):
        c, row = report["classes"][cls], table[cls]
        counts = (c["rows"], c["above_bound"], c["fitted_rows"], c["sources"])
        assert tuple(int(row[i]) for i in (1, 2, 4, 5)) == counts, cls
        stated = (f"{c['loso_median_abs_error']:.1%}", f"{c['loso_coverage_80']:.0%}",
                  f"{c['interval_80_median_width']:.0%}")  # fmt: skip
        assert (row[6], row[7], row[8]) == stated, cls
        f = c["fraction_of_bound"]  # bound / measured, the bound of issue 49
        assert row[3] == " / ".join(f"{f[k]:.3f}" for k in ("min", "median", "max")), cls
        assert c["sources"] >= 3


def test_every_corpus_row_is_predicted_held_out_and_a_new_csv_by_the_whole_corpus(report, tmp_path):
    """Issue 49: a corpus row's prediction never saw its source group (`predicted_s` is
    `held_out_predicted_s`, and it says which group it left out); the same rows in a user's CSV
    (a new source) are predicted by the fit on the whole corpus, and say so."""
    rows = report["rows"]
    assert all(r["predicted_s"] == r["held_out_predicted_s"] is not None for r in rows)
    for r in rows:
        assert r["prediction_from"] == (
            f"held out: fitted without the source group {r['source_group']!r}"
        )
    # DeepSeek's DeepGEMM README, issues and PRs and FlashMLA's issue are one group (one
    # organisation): no fit that predicts one saw another
    deepseek = {r["source"].split(";")[0] for r in rows if r["source_group"] == "deepseek-ai"}
    assert len(deepseek) == 8 and any("FlashMLA issue #30" in s for s in deepseek)
    mine = tmp_path / "mine.csv"
    mine.write_text((CORPUS / "matmul.csv").read_text())
    theirs = validate(read_csv(mine))["rows"]
    from kvjax.predict.validate import corpus_fits, features

    whole = corpus_fits()["matmul"]
    for r, got in zip(read_csv(mine), theirs, strict=True):
        assert got["prediction_from"] == "the committed corpus's fit (every group)"
        assert got["held_out_predicted_s"] is None
        c = closed_form(r)
        p, lo, hi = (float(x[0]) for x in whole.interval([features(c)]))
        # the interval's lower edge no lower than the bound
        assert (got["predicted_s"], got["predicted_lo_s"], got["predicted_hi_s"]) == (
            p, max(lo, c.bound_s), hi)  # fmt: skip


def test_nested_interval_by_hand():
    """Three sources a, b, c: a's interval comes from b's rows predicted by the fit on c alone
    and c's rows predicted by the fit on b alone (neither fit saw a); its prediction from the
    fit on b and c."""
    rng = np.random.default_rng(2)
    xs = [model.Features(10 ** rng.uniform(9, 12), 10 ** rng.uniform(6, 9), 1e15, 3e12)
          for _ in range(60)]  # fmt: skip
    y = model.Fit(1e-6, 0.6, 0.7).predict(xs) * np.exp(rng.normal(0, 0.1, 60))
    src = np.array(["a", "b", "c"] * 20)
    v = model.leave_one_source_out(xs, y, list(src))

    def on(*names):
        keep = np.isin(src, names)
        return model.fit([x for x, k in zip(xs, keep, strict=True) if k], y[keep])

    def resid(m, name):
        sel = src == name
        return np.log(y[sel] / m.predict([x for x, k in zip(xs, sel, strict=True) if k]))

    calib = np.sort(np.concatenate([resid(on("c"), "b"), resid(on("b"), "c")]))
    n, k = len(calib), int(np.ceil((len(calib) + 1) * 0.9))
    held = v.held_fits["a"]
    assert (held.lo, held.hi) == (calib[n - k], calib[k - 1])
    assert held.rows_held == 20 and held.rows == 40
    sel = src == "a"
    want = on("b", "c").predict([x for x, k in zip(xs, sel, strict=True) if k])
    assert np.allclose(v.held_out[sel], want, rtol=0)
    inside = (resid(on("b", "c"), "a") >= held.lo) & (resid(on("b", "c"), "a") <= held.hi)
    assert np.array_equal(v.covered[sel], inside)


def test_fit_recovers_parameters_and_never_predicts_below_the_bound():
    rng = np.random.default_rng(0)
    xs = [model.Features(f, q, 1e15, 3e12) for f, q in
          zip(10 ** rng.uniform(8, 13, 60), 10 ** rng.uniform(6, 10, 60), strict=True)]  # fmt: skip
    truth = model.Fit(5e-6, 0.7, 0.8)
    y = truth.predict(xs) * np.exp(rng.normal(0, 0.01, len(xs)))
    got = model.fit(xs, y)
    assert got.t0_s == pytest.approx(5e-6, rel=0.15)
    assert got.compute_efficiency == pytest.approx(0.7, rel=0.03)
    assert got.bandwidth_efficiency == pytest.approx(0.8, rel=0.03)
    bound = np.array([max(x.flops / 1e15, x.bytes / 3e12) for x in xs])
    assert np.all(got.predict(xs) >= bound)


def test_a_chip_family_gets_its_own_compute_efficiency_where_the_fit_saw_it():
    """Two families' compute-bound rows at e_c 0.6 and 0.95: each recovered, t0 and e_b shared;
    a family with fewer than FAMILY_ROWS compute-bound rows, or none, takes the class's e_c."""
    rng = np.random.default_rng(2)
    fams = ["capped"] * 20 + ["big"] * 40 + ["rare"] * 2
    flops, nbytes = 10 ** rng.uniform(10, 13, 62), 10 ** rng.uniform(6, 8, 62)
    xs = [model.Features(f, q, 1e15, 3e12, family=fam)
          for f, q, fam in zip(flops, nbytes, fams, strict=True)]  # fmt: skip
    truth = model.Fit(5e-6, 0.6, 0.8, family_compute_efficiency=(("capped", 0.95),))
    y = truth.predict(xs) * np.exp(rng.normal(0, 0.01, len(xs)))
    got = model.fit(xs, y)
    own = dict(got.family_compute_efficiency)
    assert own["capped"] == pytest.approx(0.95, rel=0.03)
    assert own.get("big", got.compute_efficiency) == pytest.approx(0.6, rel=0.03)
    assert "rare" not in own and got.compute_efficiency_of("unseen") == got.compute_efficiency
    assert got.to_dict()["family_compute_efficiency"] == own
    v = model.leave_one_source_out(xs, y, [f"s{i % 3}" for i in range(len(xs))])
    assert all(f.family_compute_efficiency for f in v.held_fits.values())


def test_a_gemm_splits_k_to_fill_its_last_wave_by_hand():
    """vLLM's 128 x 2112 x 7168 on 132 SMs: 17 output tiles fill 13% of a wave; split 7 ways
    (K stretches of 1024 >= 512) 119 of 132; 14 ways fills no more, so 7. An 8192^3 GEMM: 4096
    tiles, 31 waves and 4 tiles over; 16 stretches of 512 leave 64 over 496 full waves. K too
    short to split: the tiles alone. The H100 SXM, H800 and H200 are one compute family."""
    from kvjax.hardware import get_chip
    from kvjax.predict.gemm import compute_family, gemm_tiles

    assert gemm_tiles(128, 2112, 7168, 1, 132) == 17 * 7
    assert gemm_tiles(8192, 8192, 8192, 1, 132) == 4096 * 16
    assert gemm_tiles(128, 2112, 1000, 1, 132) == 17 and gemm_tiles(64, 256, 7168, 2, 4) == 4
    fam = {n: compute_family(get_chip(n)) for n in ("h100-sxm", "h800", "h200", "h20")}
    assert fam["h100-sxm"] == fam["h800"] == fam["h200"] != fam["h20"] == "h20"


def test_the_pipeline_fill_by_hand():
    """A block loop of b key blocks a program through a two-stage pipeline takes b + 1 stage
    times: S = 512 in 128 x 128 tiles, B = 2: 8 programs a head; non-causal 32 blocks (4 each,
    fill 5/4), causal 2 x (1 + 2 + 3 + 4) = 20 (2.5 each, 1.4). The model stretches the compute
    term by it and leaves a memory-bound call alone; decode's split loop keeps 1."""
    from kvjax.analytic import flash
    from kvjax.analytic.costs import Workload
    from kvjax.hardware import get_chip
    from kvjax.model.config import ModelConfig
    from kvjax.predict.plans import attention_fill, pipeline_fill

    cfg = ModelConfig(name="t", num_layers=1, d_model=512, num_heads=4, num_kv_heads=4,
                      head_dim=128, d_ff=2048, vocab_size=256,
                      attention_kernel="flash")  # fmt: skip
    wl = Workload("prefill", 2, 512)
    plan = flash.plan(cfg, wl, block_q=128, block_k=128)
    for causal, want in ((False, 1.25), (True, 1.4)):
        cost = flash.flash_attention_cost(cfg, wl, plan, causal=causal)
        assert pipeline_fill(cost, 2, 512) == pytest.approx(want)
    assert attention_fill(cfg, Workload("decode", 2, 512), get_chip("h100-sxm")) == 1.0
    fit = model.Fit(0.0, 1.0, 1.0)
    x = model.Features(1e12, 1e6, 1e15, 3e12, fill=1.25)
    assert fit.predict([x])[0] == pytest.approx(1.25e-3)
    x = model.Features(1e6, 3e12, 1e15, 3e12, fill=1.25)
    assert fit.predict([x])[0] == pytest.approx(1.0)
    prefill = [r for r in read_corpus() if r.kernel == "attention_prefill"][0]
    c = closed_form(prefill)
    assert c.fill > 1 and c.tile_flops * c.fill > c.floor_flops  # the model, never the bound


def test_the_special_function_rates_per_clock_by_hand():
    """An SM's exp unit does 16 ops a clock (CUDA guide; FlashAttention-4 for Blackwell), its
    tensor cores 4,096 dense BF16 FLOPs a clock on Hopper and 8,192 on Blackwell: the H100's
    sourced 3.9 TFLOP/s (FlashAttention-3) is within 2% of 989e12 / 256, and the B200's and
    GB200's rates are their BF16 peaks / 512. At head dimension 128 a B200 prefill's
    exponentials (one a computed pair and query head) take as long as its 4 x 128 matmul FLOPs
    a pair, as FlashAttention-4 says; on the H100 half as long."""
    from kvjax.hardware import get_chip
    from kvjax.predict.bounds import special_seconds

    h100, b200, gb200 = get_chip("h100-sxm"), get_chip("b200"), get_chip("gb200")
    assert h100.special_function_ops_per_s == pytest.approx(989e12 * 16 / 4096, rel=0.02)
    for chip in (b200, gb200):
        assert chip.special_function_ops_per_s == pytest.approx(chip.peak_flops_per_s["bf16"] / 512)
    pairs = 1e9
    for chip, ratio in ((b200, 1.0), (h100, 0.5)):
        matmul_s = pairs * 4 * 128 / chip.peak_flops_per_s["bf16"]
        assert special_seconds(pairs, chip) / matmul_s == pytest.approx(ratio, rel=0.02)


def test_conformal_interval_covers_as_promised():
    rng = np.random.default_rng(1)
    xs = [model.Features(10 ** rng.uniform(9, 12), 10 ** rng.uniform(6, 9), 1e15, 3e12)
          for _ in range(200)]  # fmt: skip
    y = model.Fit(0.0, 0.6, 0.7).predict(xs) * np.exp(rng.normal(0, 0.2, len(xs)))
    sources = [f"s{i % 8}" for i in range(len(xs))]
    v = model.leave_one_source_out(xs, y, sources)
    assert 0.75 <= v.coverage <= 0.9
    assert v.fit.lo < 0 < v.fit.hi
    assert v.median_abs_error < 0.2


def test_malformed_rows_name_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("source,chip,dtype,kernel,m,n,k,measured_s\n"
                   "a; t1,h100-sxm,bf16,matmul,64,64,64,1e-6\n"
                   "a; t1,h100-sxm,bf16,gemm,64,64,64,1e-6\n")  # fmt: skip
    code, _, err = _run(["validate", str(bad)])
    assert code == 2
    assert f"{bad}:3: column 'kernel': 'gemm'; allowed: attention_prefill" in err
    bad.write_text("source,chip,dtype,kernel,m,n,k,measured_s\na,h100-sxm,bf16,matmul,64,,64,1\n")
    assert (
        "bad.csv:2: column 'n': is empty; a matmul row needs it" in _run(["validate", str(bad)])[2]
    )
    bad.write_text("source,chip,dtype,kernel,m,n,k,measured_s\na,h999,bf16,matmul,64,1,64,1\n")
    assert "column 'chip': unknown chip 'h999'" in _run(["validate", str(bad)])[2]
    with pytest.raises(KvjaxError, match="column 'measured_s': '-1' must be a positive"):
        bad.write_text("source,chip,dtype,kernel,m,n,k,measured_s\na,h800,fp8,matmul,1,1,1,-1\n")
        read_csv(bad)
    bad.write_text("source,chip,dtype,kernel,m,n,k,measured_s,timing\n"
                   "a,h800,fp8,matmul,1,1,1,1e-6,cudagraph\n")  # fmt: skip
    with pytest.raises(KvjaxError, match="bad.csv:2: column 'timing': 'cudagraph'; allowed: "
                       "kernel, graph, events, host"):  # fmt: skip
        read_csv(bad)


def test_held_out_error_by_timing_is_recounted_by_hand_and_is_validate_md(report):
    """`by_timing`: each class's held-out rows split by how their sources timed them, the
    medians recounted from the rows; every corpus row's timing is one of the allowed values or
    unstated; VALIDATE.md's table is these numbers."""
    from kvjax.predict.corpus import TIMING

    assert {r["timing"] for r in report["rows"]} <= {*TIMING, None}
    text = (CORPUS / "VALIDATE.md").read_text()
    for cls in ("attention_prefill", "attention_decode", "matmul", "step"):
        held = [
            r
            for r in report["rows"]
            if r["held_out_covered"] is not None
            and (r["kernel"].endswith("_step") if cls == "step" else r["kernel"] == cls)
        ]
        by = report["classes"][cls]["by_timing"]
        assert sum(b["rows"] for b in by.values()) == len(held) == report["classes"][cls][
            "fitted_rows"]  # fmt: skip
        for key, b in by.items():
            sel = [r for r in held if (r["timing"] or "unstated") == key]
            ratio = [r["held_out_predicted_s"] / r["measured_s"] for r in sel]
            assert b["rows"] == len(sel) > 0
            assert b["median_ratio"] == pytest.approx(np.median(ratio), rel=1e-12)
            assert b["median_abs_error"] == pytest.approx(np.median(np.abs(np.subtract(ratio, 1))))
            assert b["coverage_80"] == pytest.approx(np.mean([r["held_out_covered"] for r in sel]))
            line = (f"| {cls} | {key} | {b['rows']} | {b['groups']} | {b['median_abs_error']:.1%} "
                    f"| {b['median_ratio']:.2f} | {b['coverage_80']:.0%} |")  # fmt: skip
            assert line in text, line
    assert report["classes"]["step"]["by_timing"].keys() == {"graph", "host"}


def test_a_new_csv_with_optional_columns_missing(tmp_path):
    """A CSV kvjax has never seen: its own column order, most optional columns absent."""
    new = tmp_path / "new.csv"
    new.write_text(
        "measured_s,kernel,chip,dtype,source,batch,seq_kv,num_heads,num_kv_heads,head_dim,m,n,k\n"
        "5e-5,attention_decode,h100-sxm,bf16,lab A; table 1,8,8192,32,8,128,,,\n"
        "1e-3,matmul,a100-80gb,bf16,lab B; table 2,,,,,,4096,4096,4096\n"
        "2e-5,matmul,h200,bf16,lab C; table 3,,,,,,16,4096,4096\n"
    )  # fmt: skip
    code, out, _ = _run(["validate", str(new), "--json"])
    assert code == 0
    rows = json.loads(out)["rows"]
    assert [r["line"] for r in rows] == [2, 3, 4]
    for r in rows:
        for key in ("closed_flops", "closed_bytes", "bound_s", "fraction_of_bound", "above_bound",
                    "predicted_s", "predicted_lo_s", "predicted_hi_s", *COLUMNS):  # fmt: skip
            assert key in r
    gemm = rows[1]
    assert gemm["closed_flops"] == 2 * 4096**3
    assert gemm["bound_s"] == pytest.approx(2 * 4096**3 / 312e12)
    decode = rows[0]  # the cache read once for all 4 query heads of each KV head
    assert decode["closed_bytes"] >= 2 * 8 * 8192 * 8 * 128 * 2


def test_calc_and_frontier_predict(capsys):
    code, out, _ = _run(["calc", "--model", "llama-3-8b", "--context", "8192", "--batch", "8",
                         "--attention-kernel", "flash", "--predict", "--json"])  # fmt: skip
    assert code == 0
    pred = json.loads(out)["predicted"]
    rows = {r["name"]: r for r in pred["kernels"]}
    for name in (kernels.Q_PROJ, kernels.DOWN, kernels.ATTENTION):
        r = rows[name]
        assert r["class"] in ("matmul", "attention_decode")
        assert (
            r["bound_s"] <= r["predicted_s"]
            and r["predicted_lo_s"] < r["predicted_s"] < r["predicted_hi_s"]
        )
    assert rows[kernels.NORM_ATTN]["predicted_s"] is None
    assert pred["step"]["predicted_lo_s"] < pred["step"]["predicted_s"]
    code, out, _ = _run(["frontier", "--model", "llama-3-8b", "--predict", "--json"])
    points = json.loads(out)["points"]
    assert all(p["predicted_s"] * 1e3 >= 0.5 * p["ms_per_token"] for p in points)
    assert [p["predicted_s"] for p in points] == sorted(p["predicted_s"] for p in points)


def test_published_roofline_figure(tmp_path):
    import pandas as pd

    from experiments.published_roofline import run_point
    from kvjax.plotting import make_figures

    records = pd.DataFrame(run_point(None)).assign(experiment="published_roofline")
    kern = records[records.row_kind == "kernel"]
    assert (kern.measured_flops_per_s <= kern.bound_flops_per_s * (1 + 1e-9)).all()
    written = {p.name for p in make_figures(records, tmp_path)}
    assert {"published_roofline.png", "published_residuals.png", "published_systems.png"} <= written
    systems = records[records.row_kind == "system"]
    assert len(systems) >= 40 and not systems.above_bound.astype(bool).any()
    # VALIDATE.md's residuals of the fastest fused prefills by head dimension (held out): with
    # the exponentials at the chip's special-function rate, and without (no rate known)
    import dataclasses

    from kvjax.predict import bounds

    text = " ".join((CORPUS / "VALIDATE.md").read_text().split())
    real = bounds.closed_form
    for exps in (True, False):
        recs = records
        if not exps:
            import experiments.published_roofline as pr

            systems = pr.validate_systems
            try:  # the same validate with no chip's special-function rate (no system rows)
                bounds.closed_form = lambda r, f=real: dataclasses.replace(f(r), special_s=0.0)
                pr.validate_systems = lambda rows: ([], {})
                recs = pd.DataFrame(run_point(None))
            finally:
                bounds.closed_form, pr.validate_systems = real, systems
        recs = recs[recs.row_kind == "kernel"]
        best = recs[recs.best_of_shape.astype(bool) & (recs.kernel == "attention_prefill")]
        residual = best.held_out_predicted_s / best.measured_s - 1
        by_head = residual.groupby(best.head_dim).median()
        stated = ", ".join(f"{by_head[h]:+.1%} at {int(h)}" for h in (64, 128, 256))
        assert stated in text, (exps, stated)


def test_every_corpus_row_has_a_closed_form():
    for row in read_corpus():
        c = closed_form(row)
        assert c.flops > 0 and c.bytes > 0 and c.bound_s > 0


def test_cpu_check_summary_is_its_points_refitted():
    """experiments/results/cpu_predict.json: the model fitted on this CPU's own timed kernels,
    one shape group held out at a time. Its committed summary recounted by hand: per group, the
    model fitted (`model.fit`) on the other groups' points predicts the group's; the median of
    |predicted / measured - 1| over every point."""
    result = json.loads(
        (Path(__file__).parents[1] / "experiments/results/cpu_predict.json").read_text()
    )
    c = result["ceilings"]
    peak, bw = c["peak_flops_per_s"]["f32"], c["bandwidth_bytes_per_s"]
    assert set(result["summary"]) == {"matmul", "attention_decode"}
    for cls, want in result["summary"].items():
        points = [p for p in result["points"] if p["cls"] == cls]
        groups = sorted({p["group"] for p in points})
        errors = []
        for g in groups:
            train = [p for p in points if p["group"] != g]
            fitted = model.fit(
                [model.Features(p["closed_flops"], p["closed_bytes"], peak, bw) for p in train],
                [p["median_s"] for p in train],
            )
            test = [p for p in points if p["group"] == g]
            pred = fitted.predict(
                [model.Features(p["closed_flops"], p["closed_bytes"], peak, bw) for p in test]
            )
            errors += [abs(x / p["median_s"] - 1) for x, p in zip(pred, test, strict=True)]
        assert want["loso_median_abs_error"] == pytest.approx(np.median(errors), rel=1e-9)
        assert want["groups"] == len(groups) == 3 and want["points"] == len(points) >= 18
    assert result["device"] and result["jax"]


def test_a_tensor_parallel_step_is_bounded_with_its_all_reduces_at_the_line_rate():
    """TensorRT-LLM 0.5's 70B prefill of 2,048 tokens on 4 H100s: the bound overlaps the step's
    2 L + 1 all-reduces (each layer's attention and MLP outputs, the vocab-parallel embedding)
    of 2,048 x 8,192 bf16 activations, 2 (tp - 1) / tp of them a device at NVLink's 450 GB/s, and
    the sampled row's f32 logits gathered, with the compute and HBM floors (the max; an FP8
    engine's compute at the fp8 peak); the prediction adds the same collectives serially as NCCL
    reaches them (slower than the line)."""
    row = next(r for r in read_corpus() if r.kernel == "prefill_step" and r.context == 2048
               and r.num_chips == 4 and r.model == "llama-2-70b")  # fmt: skip
    c = closed_form(row)
    from kvjax import get_chip

    h100 = get_chip("h100-sxm")  # an FP8 engine's floor: its matmuls at the fp8 peak, 4 chips
    assert row.dtype == "fp8" and c.peak_flops_per_s == 4 * h100.peak("fp8") > 4 * h100.peak("bf16")
    int8 = next(r for r in read_corpus() if r.kernel == "decode_step" and r.dtype == "int8")
    chips = int8.num_chips or 1  # weight-only int8: bf16 activations and matmuls
    assert closed_form(int8).peak_flops_per_s == get_chip(int8.chip).peak("bf16") * chips
    tp, line, tokens = 4, 450e9, 2048
    link = (161 * 2 * (tp - 1) / tp * tokens * 8192 * 2 + (tp - 1) / tp * 32000 * 4) / line
    assert c.link_s == pytest.approx(link, rel=1e-12)
    floors = (c.floor_flops / c.peak_flops_per_s, c.floor_bytes / c.bandwidth_bytes_per_s)
    assert c.bound_s == max(*floors, c.link_s) and c.bound_side == "compute"
    assert c.serial_s > c.link_s
    # a link slower than the floors makes it the bound's side
    import dataclasses

    slow = dataclasses.replace(c, link_s=2 * max(floors))
    assert slow.bound_s == 2 * max(floors) and slow.bound_side == "link"


def test_the_prediction_runs_a_steps_collectives_serially():
    """`Features.serial_s` adds to the prediction outside the max (and a fit on rows carrying it
    recovers the parameters that made them)."""
    x = model.Features(1e12, 1e9, 1e15, 2e12, launches=80)
    f = model.Fit(50e-6, 0.8, 0.9)
    base = 80 * 50e-6 + max(1e12 / 1e15 / 0.8, 1e9 / 2e12 / 0.9)
    assert f.predict([x])[0] == pytest.approx(base, rel=1e-12)
    with_link = model.Features(1e12, 1e9, 1e15, 2e12, launches=80, serial_s=3e-3)
    assert f.predict([with_link])[0] == pytest.approx(base + 3e-3, rel=1e-12)
    rng = np.random.default_rng(1)
    xs = [model.Features(f_, q, 1e15, 2e12, launches=80, serial_s=s) for f_, q, s in
          zip(10 ** rng.uniform(10, 13, 40), 10 ** rng.uniform(8, 10, 40),
              rng.uniform(0, 5e-3, 40), strict=True)]  # fmt: skip
    y = model.Fit(20e-6, 0.7, 0.85).predict(xs)
    got = model.fit(xs, y)
    assert got.t0_s == pytest.approx(20e-6, rel=0.1)
    assert got.compute_efficiency == pytest.approx(0.7, rel=0.06)  # the prior pulls towards 1
    assert got.bandwidth_efficiency == pytest.approx(0.85, rel=0.06)
    import dataclasses  # blind to the collectives, the fit puts them in t0

    blind = model.fit([dataclasses.replace(x, serial_s=0.0) for x in xs], y)
    assert blind.t0_s > 2 * 20e-6


def test_huber_is_squared_within_delta_and_linear_beyond():
    """Huber's loss by hand at delta = 0.1, continuous at the knee: a residual 10x the knee
    weighs 19x the knee's, not 100x; and an outlier moves a fitted t0 less than under squares."""
    r = np.array([0.0, 0.05, -0.1, 0.1, -0.3, 1.0])
    assert model.huber_loss(r, 0.1) == pytest.approx([0, 0.0025, 0.01, 0.01, 0.05, 0.19], abs=1e-15)
    assert model.huber_loss(np.array([0.1 + 1e-9]), 0.1)[0] == pytest.approx(0.01, abs=1e-9)
    xs = [model.Features(1e6, 1e6, 1e15, 1e12) for _ in range(9)]  # t0-dominated rows
    y = np.full(9, 10e-6)
    y[0] = 100e-6  # one row 10x slow
    assert model.fit(xs, y).t0_s == pytest.approx(10e-6, rel=0.1)


def test_fp4_gemms_are_a_family_of_their_own():
    """A block-scaled FP4 GEMM's efficiencies are fitted apart from its chip's bf16 and fp8
    GEMMs (`gemm.gemm_family`): on the B200 its kernels reach a lower fraction of the FP4 peak
    than the others do of theirs; the model reads the block scales (`fp4_bits`), the bound not."""
    from kvjax.hardware import get_chip
    from kvjax.predict.gemm import fp4_bits, gemm_family
    from kvjax.predict.validate import corpus_fits

    b200 = get_chip("b200")  # one compute design with the B300: 2.25 dense BF16 PFLOPS, 148 SMs
    b200_family = gemm_family(b200, "fp8")
    assert (gemm_family(b200, "fp4"), b200_family) == ("b200/b300 fp4", "b200/b300")
    fit = corpus_fits()["matmul"]
    assert fit.compute_efficiency_of("b200/b300 fp4") < fit.compute_efficiency_of(b200_family)
    assert fp4_bits("DeepGEMM (MXF4 SM100_MMA_MXF4_SS)") == 4.25
    assert fp4_bits("cuDNN NVFP4 (FlashInfer mm_fp4)") == fp4_bits(None) == 4.5
