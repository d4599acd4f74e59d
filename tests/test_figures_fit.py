"""A figure that places a model on one chip that cannot hold it says so in the panel (issue 39)."""

import pandas as pd
import pytest
from matplotlib.figure import Figure

from kvjax import analytic, get_chip, get_model_config


def test_decode_latency_names_what_one_chip_cannot_hold(tmp_path):
    from kvjax.plotting.decode import decode_latency
    from kvjax.runs.launcher import run_config

    config = tmp_path / "c.yaml"
    config.write_text(
        "experiment: decode_latency\nmodel:\n  preset: llama-3-8b\nworkload:\n  context: 8192\n"
        "chip:\n  preset: h100-sxm\noptions:\n  batches: [1, 64]\n"
        "sweep:\n  model.preset: [llama-3-8b, mixtral-8x7b]\n"
    )
    runs = run_config(config, runs_root=tmp_path / "runs", progress=False)
    records = pd.DataFrame([r for run in runs for r in run.records()])
    rec = records.set_index(["model", "batch"])
    cfg = get_model_config("mixtral-8x7b")
    held = analytic.weight_bytes(cfg) + analytic.kv_cache_bytes(cfg, 8192, 1)
    assert rec.memory_needed_bytes["mixtral-8x7b", 1] == pytest.approx(held)
    assert held > get_chip("h100-sxm").memory_bytes and not rec.fits["mixtral-8x7b", 1]
    assert rec.fits["llama-3-8b", 1] and not rec.fits["llama-3-8b", 64]  # 16 + 64 x 1.07 GB
    fig = Figure()
    decode_latency(records.assign(experiment="decode_latency"), fig)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("do not fit one h100-sxm (80 GB)" in t and "mixtral-8x7b: 94 GB" in t
               and "llama-3-8b" not in t.split("B=1:")[-1] for t in texts)  # fmt: skip
