"""The kernel classes held out by implementation and by chip (kvjax.predict.views): a group's
held-out error recounted from a fit that never saw it."""

import numpy as np
import pytest

from kvjax.predict import bounds, model
from kvjax.predict.validate import best_of_each_shape, corpus_rows, features
from kvjax.predict.views import held_out_views, implementation_family


def test_an_implementation_is_its_code_not_its_version_or_details():
    assert implementation_family("FlashAttention-3 (FP8)") == "FlashAttention-3"
    assert implementation_family("vLLM 0.13.0") == implementation_family("vLLM") == "vLLM"
    assert implementation_family("DeepGEMM fp8 block-wise") == "DeepGEMM"
    assert implementation_family("torch._scaled_mm") == implementation_family("torch.mm") == "torch"
    assert implementation_family("cuDNN, sdpa") == "cuDNN"
    assert implementation_family(None) == implementation_family("") == "unstated"


def test_decode_held_out_by_implementation_never_saw_the_implementation():
    rows = [r for r in corpus_rows() if r.kernel == "attention_decode"]
    got = held_out_views(rows, views=("implementation",))["attention_decode"]["implementation"]
    best = best_of_each_shape(rows)
    fitted = [r for r, b in zip(rows, best, strict=True) if b]
    assert got["rows"] == len(fitted) == 51
    assert got["groups"] == len({implementation_family(r.implementation) for r in fitted})
    # FlashMLA's rows by hand: the class fitted on every other implementation's rows
    mine = [implementation_family(r.implementation) == "FlashMLA" for r in fitted]
    xs = [features(bounds.closed_form(r)) for r in fitted]
    y = np.array([r.measured_s for r in fitted])
    others = model.fit([x for x, m in zip(xs, mine, strict=True) if not m], y[~np.array(mine)])
    ratio = others.predict([x for x, m in zip(xs, mine, strict=True) if m]) / y[np.array(mine)]
    assert got["group_medians"]["FlashMLA"] == pytest.approx(np.median(np.abs(ratio - 1)))
    assert got["median_of_group_medians"] == pytest.approx(
        np.median(list(got["group_medians"].values()))
    )


def test_two_groups_give_no_nested_coverage_and_a_bad_view_is_named():
    rows = [r for r in corpus_rows() if r.kernel == "decode_step"]
    chips = held_out_views(rows, views=("chip",))["step"]["chip"]
    assert chips["groups"] == 2 and chips["coverage_80"] is None
    with pytest.raises(ValueError, match="view='vendor'; allowed: source_group, implementation"):
        held_out_views(rows, views=("vendor",))


def test_validate_md_states_the_three_views():
    """VALIDATE.md's table is what `held_out_views` gives on the committed corpus."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "experiments/published/VALIDATE.md").read_text()
    for cls, views in held_out_views(corpus_rows()).items():
        for view, e in views.items():
            cover = "-" if e["coverage_80"] is None else f"{e['coverage_80']:.0%}"
            line = (
                f"| {cls} | {view} | {e['groups']} | {e['rows']} | {e['median_abs_error']:.1%} "
                f"| {e['median_of_group_medians']:.1%} | {cover} |"
            )
            assert line in text, line
