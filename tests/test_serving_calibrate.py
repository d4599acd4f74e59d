"""The calibration of the fitted step model (issue 48) covers what it fits by construction: on the
step clock its batches are the scheduler's alone, so they determine every coefficient
`identifiable` keeps, for any engine's limits; and a coefficient it merges changes no batch the
engine can run (random loads, a known step model recovered exactly). Pure Python, no timing."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvjax.serving.calibrate import batches, identifiable, plan
from kvjax.serving.fitted import FittedStepTime, bucket_of, buckets_for, feature_names, features
from kvjax.serving.pages import PagePool
from kvjax.serving.scheduler import Request, Scheduler


def limits(max_batch, max_len, token_budget, page_size, pool_tokens):
    pages = max_batch * (max_len // page_size)
    if pool_tokens is not None:
        pages = min(pages, pool_tokens // page_size)
    return max(pages, 1)


def engine_batches(requests, max_batch, token_budget, pages, page_size):
    sched = Scheduler(PagePool(pages, page_size), max_batch, token_budget, prefix_caching=False)
    return batches(requests, sched)


def test_the_plan_of_kvjax_serves_default_engine_holds_every_shape():
    """3 slots of 48, budget 16, pages of 8 (buckets 2, 4, 8, 16): each bucket alone and beside
    a decode, several chunks at once, 1 to 3 decodes; every feature kept, 2 steps a feature at
    least, and the same batches however often the plan is run (nothing in it reads a clock)."""
    buckets = buckets_for(16)
    reqs = plan(buckets, 3, 48, 16, 18, 8)
    steps = engine_batches(reqs, 3, 16, 18, 8)
    assert steps == engine_batches(plan(buckets, 3, 48, 16, 18, 8), 3, 16, 18, 8)
    assert identifiable(steps, buckets) == feature_names(buckets)
    # each entry as the engine pads it: 1 (a decode) or its chunk's bucket
    shapes = {tuple(sorted(t if t == 1 else bucket_of(t, buckets) for t, _ in b)) for b in steps}
    for b in buckets:
        assert (b,) in shapes and (1, b) in shapes, b  # alone, and beside one decode
    assert {(1,), (1, 1), (1, 1, 1)} <= shapes and (2, 2, 2) in shapes
    # the scenarios follow each other: a request arrives when the one before it has ended
    assert all(r.arrival_s == int(r.arrival_s) for r in reqs)
    assert len(steps) >= 2 * len(feature_names(buckets))


@pytest.mark.parametrize(
    "max_batch, max_len, token_budget, page_size, pool_tokens, kept",
    [
        (1, 48, 16, 8, None, ("decode", "chunks_T2", "chunks_T4", "chunks_T8", "chunks_T16")),
        (4, 48, 2, 8, None, ("decode", "decodes", "chunks_T2")),  # no chunk beside a decode
        (4, 48, 16, 16, 16, ("decode", "chunks_T2", "chunks_T4", "chunks_T8", "chunks_T16")),
        (
            4,
            64,
            64,
            16,
            40,
            ("step", "decode", "decodes", *(f"chunks_T{b}" for b in (2, 4, 8, 16, 32))),
        ),
    ],
)
def test_limits_that_forbid_a_shape_merge_what_it_would_tell_apart(
    max_batch, max_len, token_budget, page_size, pool_tokens, kept
):
    """One slot (or a pool of one page): a step holds one entry, so `step` and `decodes` merge
    into the rest. A budget of 2: a decode and a chunk never share a step, so `step` merges. A
    pool of 2 pages of 16 (32 tokens): no prompt reaches the bucket of 64, which is dropped."""
    buckets = buckets_for(min(token_budget, max_len))
    pages = limits(max_batch, max_len, token_budget, page_size, pool_tokens)
    steps = engine_batches(plan(buckets, max_batch, max_len, token_budget, pages, page_size),
                           max_batch, token_budget, pages, page_size)  # fmt: skip
    assert identifiable(steps, buckets) == kept


@settings(max_examples=60)
@given(
    max_batch=st.sampled_from([1, 2, 3, 8]),
    max_len=st.sampled_from([2, 3, 5, 16, 48]),
    token_budget=st.sampled_from([1, 2, 3, 4, 16, 256]),
    page_size=st.sampled_from([1, 4, 16]),
    pool_tokens=st.sampled_from([None, 16, 40]),
    seed=st.integers(0, 2**16),
)
def test_any_engine_calibration_fits_and_predicts_what_it_can_run(
    max_batch, max_len, token_budget, page_size, pool_tokens, seed
):
    """For any limits: the calibration's batches determine the features `identifiable` keeps
    (the fit is never refused), and a known step model (every coefficient random) fitted on
    them predicts every batch of a random load on that engine exactly, merged features or not."""
    pages = max_batch * (max_len // page_size)
    if pool_tokens is not None:
        pages = min(pages, pool_tokens // page_size)
    if pages < 1:
        return  # `pool_pages` refuses it by name
    buckets = buckets_for(min(token_budget, max_len))
    steps = engine_batches(plan(buckets, max_batch, max_len, token_budget, pages, page_size),
                           max_batch, token_budget, pages, page_size)  # fmt: skip
    names = identifiable(steps, buckets)
    full = feature_names(buckets)
    X = np.stack([features(b, buckets) for b in steps])[:, [full.index(n) for n in names]]
    assert np.linalg.matrix_rank(X) == len(names) and len(steps) >= 2 * len(names)
    rng = np.random.default_rng(seed)
    true = FittedStepTime(dict(zip(full, rng.uniform(0.1, 1.0, len(full)), strict=True)),
                          buckets)  # fmt: skip
    model, _ = FittedStepTime.fit([(b, true(b)) for b in steps], buckets, names)
    cap = min(max_len, pages * page_size)
    reqs = []
    for i in range(24):
        p = int(rng.integers(1, cap + 1))
        reqs.append(Request(i, float(rng.integers(0, 12)), p, int(rng.integers(1, cap - p + 2))))
    for b in engine_batches(reqs, max_batch, token_budget, pages, page_size):
        assert model(b) == pytest.approx(true(b), rel=1e-9), b


def test_a_hand_made_file_that_underdetermines_the_fit_is_still_refused():
    """Merging is the calibration's, for limits that forbid a shape; steps that merely lack one
    are refused by name, as before."""
    buckets = buckets_for(16)
    true = FittedStepTime(dict.fromkeys(feature_names(buckets), 1e-3), buckets)
    only_decodes = [[(1, 5)], [(1, 5), (1, 9)]] * 10
    from kvjax.errors import KvjaxError

    with pytest.raises(KvjaxError, match="determine 2 of the 7 coefficients"):
        FittedStepTime.fit([(b, true(b)) for b in only_decodes], buckets)
    with pytest.raises(KvjaxError, match=r"features \['chunks_T32'\] unknown"):
        FittedStepTime.fit([(b, true(b)) for b in only_decodes], buckets, ["chunks_T32"])
