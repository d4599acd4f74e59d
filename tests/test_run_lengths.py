"""Length distributions known only by a run's own printed totals (experiments/published/
lengths.csv): the means are those totals over the run's requests, and the rows that name them
are simulated at them."""

import re

import pytest

from kvjax.serving import system_predict as sp
from kvjax.serving.systems import read_lengths, read_systems


def _numbers(quote: str, label: str) -> list[float]:
    return [float(x) for x in re.findall(rf"{label}:? +([0-9.]+)", quote)]


def test_a_benchmark_printouts_totals_give_its_means():
    """tpu-recipes' vLLM-on-TPU ShareGPT run: 224,330 prompt and 133,123 generated tokens over
    1,000 requests, as benchmark_serving printed them."""
    d = read_lengths()["tpu-recipes-vllm-sharegpt-1000-out256"]
    (requests,) = _numbers(d["quote"], "Successful requests")
    (prompt,) = _numbers(d["quote"], "Total input tokens")
    (generated,) = _numbers(d["quote"], "Total generated tokens")
    assert d["samples"] == requests == 1000
    assert d["input_mean"] == pytest.approx(prompt / requests)
    assert d["output_mean"] == pytest.approx(generated / requests)
    assert d["input_min"] is None  # not printed: a row's bound takes 1-token prompts
    rows = [r for r in read_systems() if r["length_distribution"] == d["name"]]
    assert len(rows) == 4 and all(r["output_len"] == d["output_mean"] for r in rows)
    assert {sp.lengths_of(r) for r in rows} == {(224, 133)}


def test_a_posts_table_gives_its_runs_mean_output():
    """vLLM's FP8 KV-cache post: 150 requests of about 20k prompt tokens (+/-15%); each run's
    mean output is its output tokens/s times its duration over 150, about the stated 2k."""
    d = read_lengths()["vllm-blog-fp8-kvcache-20k-2k"]
    assert (d["input_min"], d["input_mean"], d["input_max"]) == (0.85 * 20000, 20000, 1.15 * 20000)
    rows = {r["kv_dtype"]: r for r in read_systems() if r["length_distribution"] == d["name"]}
    table = {"bf16": "| BF16 |", "fp8": "| FP8 |"}
    for kv, row in rows.items():
        cells = d["quote"].split(table[kv])[1].split("|")
        duration, tokens_per_s = float(cells[2]), float(cells[3])
        assert row["measured"] == tokens_per_s
        assert row["output_len"] == pytest.approx(tokens_per_s * duration / 150, abs=0.05)
        assert row["output_len"] == pytest.approx(2000, rel=0.01) and row["input_len"] is None
        assert sp.lengths_of(row) == (20000, round(row["output_len"]))
    assert d["output_mean"] == rows["bf16"]["output_len"]
