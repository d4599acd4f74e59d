"""Interleaved measured sweeps: every point timed in every round, the bandwidth measured before
each round, and the flags for a point below its bound or against the trend of its bytes."""

from kvjax import get_model_config
from kvjax.analytic import Workload
from kvjax.measured.interleave import flag_sweep, time_interleaved


def test_points_are_timed_in_turns_with_the_bandwidth_per_round():
    cfg = get_model_config("tiny-gqa")
    points = [(cfg.replace(num_kv_heads=k), Workload("decode", 1, 32)) for k in (1, 3)]
    result = time_interleaved(points, rounds=3, budget_s=0.06, ceiling_bytes=2**22)
    assert len(result.bandwidth_rounds_bytes_per_s) == 3
    assert all(b > 0 for b in result.bandwidth_rounds_bytes_per_s)
    assert len(result.points) == 2
    for t in result.points:
        assert t.runs >= 9 and t.median_s > 0 and t.iqr_s >= 0  # at least 3 steps a round


def _rec(bytes_, measured, predicted):
    return {"closed_step_bytes": bytes_, "measured_s": measured, "predicted_s": predicted}


def test_flags_below_the_bound_and_against_the_bytes():
    ok = [_rec(100, 2.0, 1.0), _rec(200, 3.0, 2.0), _rec(300, 4.0, 3.0)]
    flag_sweep(ok, "closed_step_bytes")
    assert [r["flagged"] for r in ok] == [None, None, None]
    # more bytes but faster (by more than the 5% noise), and one point below its bound
    bad = [_rec(100, 2.8, 1.0), _rec(200, 2.7, 2.0), _rec(300, 2.0, 3.0)]
    flag_sweep(bad, "closed_step_bytes")
    assert bad[0]["flagged"] is None  # 2.7 vs 2.8 is within noise
    assert "time moves against bytes" in bad[1]["flagged"]
    assert "below its bound" in bad[2]["flagged"] and "against bytes" in bad[2]["flagged"]
