"""MLPerf's P99 latencies predicted at the submission's rate (kvjax.serving.latency_predict):
which rows it runs, the committed predictions against the corpus they came from, a short run
above the row's own bound, and the summary by hand."""

import math

import pandas as pd
import pytest

from kvjax.serving.latency_predict import (
    LATENCY_CSV,
    latency_summary,
    predict_latency,
    why_not_latency,
)
from kvjax.serving.systems import read_systems, row_bound

ROW = "mlperf-inference-v5.1:HPE:HPE_Cray_XD670_H200_SXM_141GBx8_TRT:llama3.1-8b:Interactive"


def rows_of(source: str) -> dict[str, dict]:
    return {r["metric"]: r for r in read_systems() if r["source"] == source}


def test_only_p99_rows_at_a_stated_rate_are_run():
    mine = rows_of(ROW)
    assert why_not_latency(mine["ttft_p99_s"]) is None
    assert "only Server and Interactive" in why_not_latency(mine["output_tokens_per_s"])
    assert "without the rate" in why_not_latency({**mine["tpot_p99_s"], "rate_per_s": None})


def test_a_short_run_at_the_rate_lies_above_the_rows_bounds():
    """30 requests at the submission's rate: each P99 at least the row's bound (one request's
    prefill, one decode step, on the chips' peaks), inside its own interval."""
    mine = rows_of(ROW)
    got = predict_latency({**mine["ttft_p99_s"], "requests": 30})
    for metric in ("ttft_p99_s", "tpot_p99_s"):
        v, lo, hi = got[metric]
        assert row_bound(mine[metric])["bound_value"] <= v and lo <= v <= hi


def test_the_committed_predictions_are_of_the_corpus_rows():
    committed = pd.read_csv(LATENCY_CSV).to_dict("records")
    corpus = {(r["source"], r["metric"]): r for r in read_systems()}
    assert len(committed) >= 50
    for p in committed:
        row = corpus[(p["source"], p["metric"])]
        assert p["measured"] == row["measured"] and p["rate_per_s"] == row["rate_per_s"]
        assert p["ratio"] == pytest.approx(p["predicted_value"] / p["measured"])
        assert p["predicted_lo"] <= p["predicted_value"] <= p["predicted_hi"]


def test_the_summary_by_hand(tmp_path):
    rows = [  # ratios 0.5, 1.2, 1.1: errors 0.5, 0.2, 0.1; the second outside its interval
        ("a", "ttft_p99_s", "h200", 1.0, 0.8, 1.2, 2.0),
        ("b", "ttft_p99_s", "h200", 1.2, 1.1, 1.3, 1.0),
        ("c", "ttft_p99_s", "b200", 1.1, 0.9, 1.3, 1.0),
    ]
    cols = ["source", "metric", "chip", "predicted_value", "predicted_lo", "predicted_hi"]
    path = tmp_path / "lat.csv"
    pd.DataFrame(rows, columns=[*cols, "measured"]).to_csv(path, index=False)
    s = latency_summary(path)["ttft_p99_s"]
    assert s["rows"] == 3 and s["median_abs_error"] == pytest.approx(0.2)
    assert s["median_ratio"] == pytest.approx(1.1)
    assert s["coverage_80"] == pytest.approx(1 / 3)
    assert s["by_chip_family"]["Blackwell"]["median_abs_error"] == pytest.approx(0.1)
    assert "tpot_p99_s" not in latency_summary(path)
    assert math.isfinite(s["by_chip_family"]["Hopper"]["median_ratio"])


def test_the_readmes_latency_line_is_the_committed_summary():
    from pathlib import Path

    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    s = latency_summary()
    t, p = s["ttft_p99_s"], s["tpot_p99_s"]
    assert f"{t['rows']} submissions): median |predicted/measured - 1|" in readme
    assert (
        f"{t['median_abs_error']:.1%} for TTFT and {p['median_abs_error']:.1%} for TPOT" in readme
    )
    assert f"({t['median_ratio']:.2f}x and {p['median_ratio']:.2f}x)" in readme


def test_validate_mds_latency_table_is_the_committed_summary():
    from pathlib import Path

    text = (Path(__file__).parents[1] / "experiments/published/VALIDATE.md").read_text()
    for metric, e in latency_summary().items():
        for chips, g in [("all", e), *e["by_chip_family"].items()]:
            cells = (
                f"{g['median_abs_error']:.1%} | {g['median_ratio']:.2f} | {g['coverage_80']:.0%}"
            )
            assert f"| {metric} | {chips} | {g['rows']} | {cells} |" in text, (metric, chips)
