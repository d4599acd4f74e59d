"""`kvjax validate --predict`: a user's serving rows predicted by the simulator, each held out
from its implementation's own corpus rows and calibrated on the other implementations'
committed systems; the committed predictions are what it writes."""

import csv
import json

import pandas as pd
import pytest

from kvjax.cli.main import main
from kvjax.serving.systems import COLUMNS, OPTIONAL, PREDICTIONS_CSV, read_systems


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*COLUMNS, *OPTIONAL])
        w.writeheader()
        for r in rows:
            w.writerow({**dict.fromkeys([*COLUMNS, *OPTIONAL], ""), **r})


def test_three_rows_written_by_hand_are_predicted_with_their_intervals(tmp_path, capsys):
    """Three TensorRT-LLM rows (20 requests each): each gets a prediction inside its interval's
    ends, from fits without TensorRT-LLM's rows, under its bound; --out writes them in the
    committed predictions' columns; a fourth row naming no implementation is said not run."""
    one = dict(source="mine:8b:128/128", source_group="me", chip="h100-sxm", num_chips="1",
               model="llama-3.1-8b", weight_dtype="fp8", kv_dtype="fp8", compute_dtype="fp8",
               tp="1", scenario="offline", input_len="128", output_len="128",
               length_distribution="fixed", requests="20", metric="output_tokens_per_s",
               scope="system", measured="20000", implementation="TensorRT-LLM")  # fmt: skip
    rows = [one, {**one, "source": "mine:8b:2048/128", "input_len": "2048", "measured": "3000"},
            {**one, "source": "mine:70b:h200x2", "chip": "h200", "num_chips": "2", "tp": "2",
             "model": "llama-3.1-70b", "input_len": "1000", "output_len": "100"},
            {**one, "source": "mine:unnamed", "implementation": ""}]  # fmt: skip
    path, out = tmp_path / "rows.csv", tmp_path / "predicted.csv"
    _write(path, rows)
    assert main(["validate", str(path), "--predict", "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    got = {r["source"]: r for r in report["system_rows"]}
    for source in ("mine:8b:128/128", "mine:8b:2048/128", "mine:70b:h200x2"):
        r = got[source]
        assert r["predicted_lo"] < r["predicted_value"] < r["predicted_hi"], source
        assert 0 < r["predicted_value"] < r["bound_value"]
        said = "held out: kernel classes and the engine-step overhead fitted without TensorRT-LLM's"
        assert r["prediction_from"].startswith(said)
        assert r["interval_from"]
    assert got["mine:unnamed"]["predicted_value"] is None
    assert "mine:unnamed (output_tokens_per_s): not predicted: no engine settings known" in (
        captured.err
    )
    assert "predicted" in captured.err and " s\n" in captured.err  # each row's seconds
    written = pd.read_csv(out)
    assert len(written) == 3
    assert list(written.columns) == list(pd.read_csv(PREDICTIONS_CSV, nrows=0).columns)
    assert main(["validate", str(path), "--out", str(out)]) == 2
    assert "--out and --resume apply to --predict only" in capsys.readouterr().err


def test_the_committed_predictions_are_what_predict_writes():
    """A committed row run again by `predict_rows` gives its committed value, interval ends and
    what fed it, to the digit (the simulation is seeded; the row's committed requests)."""
    from kvjax.serving.system_predict import predict_rows

    committed = pd.read_csv(PREDICTIONS_CSV).set_index(["source", "metric"])
    quick = committed.sort_values("seconds").index[0]
    (row,) = [r for r in read_systems() if (r["source"], r["metric"]) == quick]
    (again,) = predict_rows([row])
    c = committed.loc[quick]
    for k in ("predicted_value", "predicted_lo", "predicted_hi"):
        assert again[k] == pytest.approx(c[k], rel=1e-9), k
    assert (again["prediction_from"], again["implementation"]) == (
        c["prediction_from"], c["implementation"])  # fmt: skip
