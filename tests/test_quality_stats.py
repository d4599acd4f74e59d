"""The confidence-interval code against textbook values, and seeds that change what they should."""

import numpy as np
import pandas as pd
import pytest

from kvjax import KvjaxError
from kvjax.stats import mean_interval, paired_difference, summarize, t_critical


def test_t_critical_values_match_the_table():
    # Student-t table, two-sided 95%: dof 1, 2, 9, 30
    for dof, want in ((1, 12.706), (2, 4.303), (9, 2.262), (30, 2.042)):
        assert t_critical(0.95, dof) == pytest.approx(want, abs=5e-4)
    assert t_critical(0.99, 4) == pytest.approx(4.604, abs=5e-4)


def test_interval_of_students_sleep_data():
    """Cushny & Peebles' sleep data as Student (1908) analysed it: the extra hours of sleep with
    drug 2 over drug 1 in 10 patients; mean 1.58, 95% interval 0.700 .. 2.460 (R's
    t.test(extra ~ group, data = sleep, paired = TRUE) gives 0.7001142 2.4598858)."""
    diff = [1.2, 2.4, 1.3, 1.3, 0.0, 1.0, 1.8, 0.8, 4.6, 1.4]
    ci = mean_interval(diff)
    assert ci.mean == pytest.approx(1.58)
    assert (ci.low, ci.high) == (pytest.approx(0.7001142, abs=1e-6),
                                 pytest.approx(2.4598858, abs=1e-6))  # fmt: skip
    assert ci.n == 10 and ci.std == pytest.approx(1.229995, abs=1e-6)
    # the same as two groups paired by patient (in any order), and not as unpaired groups
    drug1 = pd.Series([0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0])
    drug2 = pd.Series([1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4])
    paired = paired_difference(drug2, drug1.sample(frac=1.0, random_state=0))
    assert (paired.low, paired.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    with pytest.raises(KvjaxError, match=r"the same seeds on both sides: \[0, 1\] against \[0\]"):
        paired_difference(pd.Series([1.0, 2.0]), pd.Series([1.0]))


def test_one_value_has_no_interval_and_groups_are_summarized():
    assert np.isnan(mean_interval([3.0]).half_width)
    with pytest.raises(KvjaxError, match="at least one value"):
        mean_interval([])
    df = pd.DataFrame({"k": [1, 1, 1, 2, 2, 2], "loss": [1.0, 2.0, 3.0, 5.0, 5.0, 5.0]})
    s = summarize(df, ["k"], ["loss"]).set_index("k")
    assert s.loc[1, "loss"] == 2.0 and s.loc[1, "loss_ci"] == pytest.approx(
        4.303 / np.sqrt(3), abs=1e-3
    )
    assert s.loc[2, "loss_ci"] == 0.0 and s.loc[2, "loss_n"] == 3


def test_a_seed_changes_the_init_and_the_data_order():
    """The quality experiments' seed (`options.seed`) is TrainConfig.seed: the model's init and
    every batch; the same seed gives the same run, another a different one."""
    import dataclasses

    from flax import nnx

    from kvjax import get_model_config
    from kvjax.nn import Transformer
    from kvjax.quality.data import StdlibBytes
    from kvjax.quality.train import TrainConfig, train

    cfg = get_model_config("tiny-gqa").replace(vocab_size=256)
    tc = TrainConfig(steps=4, batch_size=4, seq_len=32, eval_every=4, eval_batches=1,
                     warmup_steps=1)  # fmt: skip
    data = StdlibBytes("train", max_bytes=2**18)

    def run(seed):
        model = Transformer(cfg, rngs=nnx.Rngs(seed))
        return train(model, data, dataclasses.replace(tc, seed=seed), progress=False)[-1]

    a, b, c = run(0), run(0), run(1)
    assert a["val_loss"] == b["val_loss"] and a["val_loss"] != c["val_loss"]
    assert not np.array_equal(data.batch(0, 2, 4, 32).tokens, data.batch(1, 2, 4, 32).tokens)
    w0 = Transformer(cfg, rngs=nnx.Rngs(0)).layers[0].attn.q_proj[...]
    w1 = Transformer(cfg, rngs=nnx.Rngs(1)).layers[0].attn.q_proj[...]
    assert not np.array_equal(w0, w1)
