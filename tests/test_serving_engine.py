"""The serving engine (issue 41) on tiny-gqa: every request served once, nothing compiled after the
warm-up, greedy tokens equal to the model's own prefill + decode (a chunked prompt and a
preempted, recomputed request included); the fitted step-time model recovers known coefficients;
the calibration on the step clock runs the scheduler's batches and fits, at any speed; `kvjax
serve --json`, `--save-steps` and their refusals. Nothing here asserts a time: how close the
fitted simulator comes to the engine is experiments/benchmarks/serving_engine_vs_sim.py's."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kvjax import get_model_config
from kvjax.errors import KvjaxError
from kvjax.measured.engine import Engine, prompt_tokens
from kvjax.nn import Transformer
from kvjax.nn.generate import generate
from kvjax.serving.fitted import FittedStepTime, bucket_of, buckets_for, feature_names
from kvjax.serving.pages import PagePool
from kvjax.serving.scheduler import Request, Scheduler
from kvjax.serving.simulate import report

CFG = get_model_config("tiny-gqa")


@pytest.fixture(scope="module")
def engine():
    # 3 slots of 48 positions, chunks of at most 16 (buckets 2, 4, 8, 16)
    return Engine(CFG, max_batch=3, max_len=48, token_budget=16, page_size=8, seed=0)


def test_the_engine_serves_every_request_once_and_compiles_nothing_after_warmup(engine):
    assert engine.buckets == (2, 4, 8, 16)
    # attend, append, one extend per bucket, the write-back: each traced once
    assert engine.warm_compilations == 2 + len(engine.buckets) + 1
    reqs = [Request(i, 0.002 * i, p, o) for i, (p, o) in enumerate([(5, 3), (20, 6), (9, 1),
                                                                    (3, 4), (17, 2)])]  # fmt: skip
    res = engine.serve(reqs)
    rep = report(res)
    assert rep["requests_in"] == rep["requests_out"] == 5
    assert res.compilations_after_warmup == 0
    assert all(len(res.outputs[r.id]) == r.output_len == r.generated for r in reqs)
    assert len(res.measured) == res.steps and all(m.wall_s > 0 for m in res.measured)
    # every prompt token and every output but the last computed exactly once (no preemption)
    computed = sum(t for m in res.measured for t, _ in m.batch)
    assert computed == sum(r.prompt_len + r.output_len - 1 for r in reqs)
    assert all(t <= 16 for m in res.measured for t, _ in m.batch)  # the token budget
    assert all(r.token_times == sorted(r.token_times) and r.token_times[0] >= r.arrival_s
               for r in reqs)  # fmt: skip


def test_greedy_tokens_equal_the_models_own_through_chunks_and_preemption(engine):
    """A pool of 8 pages of 8 (64 tokens) under 3 requests of 20 + 20 (39 tokens of KV each, 5
    pages): each 20-token prompt is chunked (budget 16) and the one admitted last is preempted
    and recomputes its prompt and outputs. Its tokens still equal prefill + greedy decode."""
    reqs = [Request(i, 0.0, 20, 20) for i in range(3)]
    sched = Scheduler(PagePool(8, 8), max_batch=3, token_budget=16, prefix_caching=False)
    res = engine.serve(reqs, sched)
    assert res.preemptions >= 1 and any(r.preemptions for r in reqs)
    assert res.compilations_after_warmup == 0
    assert any(m.batch and max(t for t, _ in m.batch) == 16 for m in res.measured)  # chunked
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    prompts = jnp.asarray([prompt_tokens(r, CFG.vocab_size, 0) for r in reqs], jnp.int32)
    want = np.asarray(generate(model, prompts, 20))
    for r in reqs:
        assert res.outputs[r.id] == want[r.id].tolist(), r.id


def test_refusals_before_anything_runs(engine):
    with pytest.raises(KvjaxError, match=r"request 7: 40 \+ 10 tokens need 49 positions; a slot "
                       r"holds max_len=48"):  # fmt: skip
        engine.serve([Request(7, 0.0, 40, 10)])
    with pytest.raises(KvjaxError, match="at most max_batch=3"):
        engine.serve([Request(0, 0.0, 4, 4)], Scheduler(PagePool(8, 8), 4, 16, False))


def test_the_fit_recovers_known_coefficients():
    buckets = buckets_for(16)
    assert buckets == (2, 4, 8, 16) and bucket_of(5, buckets) == 8
    names = feature_names(buckets)
    true = dict(zip(names, [3e-4, 1.1e-3, 7e-5, 2e-3, 2.6e-3, 3.1e-3, 4.7e-3], strict=True))
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(60):
        decodes = [(1, int(c)) for c in rng.integers(2, 40, rng.integers(0, 4))]
        chunks = [(int(t), int(t) + 3) for t in rng.integers(2, 17, rng.integers(0, 3))]
        batches.append(decodes + chunks or [(1, 5)])
    known = FittedStepTime(true, buckets)
    model, fit = FittedStepTime.fit([(b, known(b)) for b in batches], buckets)
    for name in names:
        assert model.coefficients_s[name] == pytest.approx(true[name], abs=1e-9), name
    assert fit.median_relative_error < 1e-9 and abs(fit.total_relative_error) < 1e-9
    assert model([(1, 9), (1, 30), (5, 12)]) == pytest.approx(3e-4 + 1.1e-3 + 2 * 7e-5 + 3.1e-3)
    assert fit.spread == pytest.approx([1.0] * len(batches), abs=1e-9)
    # with a spread: the fitted mean times one of the ratios, drawn at random (seeded)
    twice = FittedStepTime(true, buckets, spread=[0.5, 2.0], seed=3)
    draws = [twice([(1, 9)]) / known([(1, 9)]) for _ in range(40)]
    assert set(np.round(draws, 9)) == {0.5, 2.0}
    again = FittedStepTime(true, buckets, spread=[0.5, 2.0], seed=3)
    assert [again([(1, 9)]) / known([(1, 9)]) for _ in range(40)] == pytest.approx(draws)
    with pytest.raises(KvjaxError, match="needs at least 14 measured steps; got 3"):
        FittedStepTime.fit([(b, known(b)) for b in batches[:3]], buckets)
    no_16 = [b for b in batches if all(t <= 8 for t, _ in b)]
    with pytest.raises(KvjaxError, match="none has chunks_T16"):
        FittedStepTime.fit([(b, known(b)) for b in no_16], buckets)
    # runs on a machine whose speed moved between them (1x, 1.5x, 0.8x): fitted over the runs,
    # each divided by its speed, the shape comes back exact, and the speeds in its ratios
    runs = [[(b, v * known(b)) for b in batches[i::3]] for i, v in enumerate((1.0, 1.5, 0.8))]
    _, mixed = FittedStepTime.fit([s for run in runs for s in run], buckets)
    assert max(abs(np.array(mixed.spread) - 1)) > 0.1  # one fit over them all: off by 10%+
    shape, fit, speeds = FittedStepTime.fit_runs(runs, buckets)
    assert np.array(speeds) / speeds[0] == pytest.approx([1.0, 1.5, 0.8], rel=1e-6)
    assert fit.spread == pytest.approx([1.0] * len(batches), abs=1e-6)
    for name in names:
        assert shape.coefficients_s[name] * speeds[0] == pytest.approx(true[name], rel=1e-6)
    with pytest.raises(KvjaxError, match=r"speeds still moved by .* after max_rounds=1 rounds"):
        FittedStepTime.fit_runs(runs, buckets, max_rounds=1)
    with pytest.raises(KvjaxError, match="max_rounds=0 must be an integer >= 1"):
        FittedStepTime.fit_runs(runs, buckets, max_rounds=0)
    slower = shape.scaled(speeds[1])
    assert slower([(1, 9)]) == pytest.approx(1.5 * known([(1, 9)]), rel=1e-6)
    with pytest.raises(KvjaxError, match="speed=0 must be > 0"):
        shape.scaled(0)


def test_cli_serve_json_and_refusals(capsys, tmp_path):
    from kvjax.cli import main

    argv = ["serve", "--model", "tiny-gqa", "--rate", "200", "--requests", "4",
            "--prompt-len", "uniform:6:12", "--output-len", "3", "--max-batch", "2",
            "--token-budget", "8"]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests_in"] == out["requests_out"] == 4
    for key in ("ttft_s", "itl_s", "e2e_s"):
        assert set(out[key]) == {"mean", "p50", "p90", "p99"}
    for key in ("throughput_tokens_per_s", "goodput_requests_per_s", "preemptions",
                "kv_pool_tokens", "backend", "device", "jax_version"):  # fmt: skip
        assert key in out, key
    assert out["compilations_after_warmup"] == 0 and out["prefix_caching"] is False
    assert out["max_len"] == 16 and out["kv_pool_tokens"] == 2 * 16  # 12 + 3 - 1 in 1 page
    # the steps saved (the calibration on the step clock, then the run) and the simulator on
    # that engine, fitted to the calibration alone
    steps = tmp_path / "steps.json"
    assert main([*argv, "--json", "--save-steps", str(steps)]) == 0
    served = json.loads(capsys.readouterr().out)
    saved = json.loads(steps.read_text())
    assert len(saved["runs"]) == 2 and len(saved["runs"][1]) == served["steps"]
    assert saved["buckets"] == [2, 4, 8] and saved["kv_pool_tokens"] == 32
    assert saved["calibration_runs"] == 1 and saved["features"] == list(feature_names((2, 4, 8)))
    from kvjax.serving.calibrate import batches, plan

    sched = Scheduler(PagePool(2, 16), 2, 8, prefix_caching=False)
    assert [[tuple(e) for e in step[0]] for step in saved["runs"][0]] == batches(
        plan((2, 4, 8), 2, 16, 8, 2, 16), sched)  # fmt: skip
    sim = ["simulate", *argv[1:], "--step-time", "fitted", "--steps", str(steps)]
    assert main([*sim, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["requests_in"] == got["requests_out"] == 4 and got["kv_pool_tokens"] == 32
    assert got["step_time"].startswith("fitted") and got["fit"]["steps"] == len(saved["runs"][0])
    assert got["fit"]["calibration_runs"] == 1 and len(got["fit"]["served_speed"]) == 1
    for bad, message in (
        ([], "--step-time fitted and --steps JSON go together"),
        (["--model", "tiny-mqa"], "measured on 'tiny-gqa', not 'tiny-mqa'"),
    ):
        assert main([*sim[:-2], *bad] if not bad else [*sim, *bad]) == 2
        assert message in capsys.readouterr().err
    # a request the engine's slot (max_len 16) cannot hold is refused as `serve` refuses it
    assert main([*sim, "--prompt-len", "14", "--output-len", "8"]) == 2
    assert "a slot holds max_len=16" in capsys.readouterr().err
    good = json.loads(steps.read_text())
    for change, message in (({"page_size": 0}, "page_size=0 must be a positive integer"),
                            ({"buckets": []}, "buckets=[] must be increasing"),
                            ({"runs": None}, "runs must be a list of runs"),
                            ({"runs": [[{"a": 1}]]}, "run 0 step 0 is not"),
                            ({"max_len": 4}, "largest bucket 8 is not min"),
                            ({"features": ["chunks_T64"]}, "features=['chunks_T64'] must be"),
                            ({"calibration_runs": 3}, "calibration_runs=3 must be an integer"),
                            # a hand-made file whose steps leave a coefficient undetermined
                            ({"runs": [good["runs"][0][:1] * 40, good["runs"][1]]},
                             "determine 1 of the 6 coefficients")):  # fmt: skip
        steps.write_text(json.dumps({**good, **change}))
        assert main(sim) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and str(steps) in err and message in err
    steps.write_text('{"format": "kvjax serve steps, v1", "model": "tiny-gqa"}')
    assert main(sim) == 2
    assert "missing device, max_batch" in capsys.readouterr().err
    # a request that can never fit: one line, exit 2, before the model is built
    assert main([*argv, "--max-len", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "a slot holds max_len=10: it can never be served" in err
    assert main([*argv, "--prompt-len", "uniform:9:2"]) == 2
    assert "prompt_len='uniform:9:2': give a length" in capsys.readouterr().err


def test_the_calibration_is_the_schedulers_on_any_machine_and_fits(engine):
    """The engine's calibration runs on the step clock: its batches are the scheduler's alone
    (`kvjax.serving.calibrate.batches`, no model, no clock), the same run after run whatever
    the machine's speed, and they determine every coefficient of the step model, so a fit to
    them is never refused. Nothing here depends on how long a step took: the fitted shape is
    checked against the engine's speed in experiments/benchmarks/serving_engine_vs_sim.py."""
    from kvjax.serving.calibrate import batches

    want = batches(engine.calibration(), engine.scheduler())
    runs = [engine.calibrate() for _ in range(2)]
    for run in runs:
        assert [list(m.batch) for m in run.measured] == want
        assert run.compilations_after_warmup == 0
        assert all(len(run.outputs[r.id]) == r.output_len for r in run.requests)
    assert engine.features == feature_names(engine.buckets)
    model, fit, speeds = FittedStepTime.fit_runs(
        [[(m.batch, m.wall_s) for m in run.measured] for run in runs], engine.buckets,
        names=engine.features,
    )  # fmt: skip
    assert fit.steps == 2 * len(want) and len(speeds) == 2 and set(model.coefficients_s) == set(
        feature_names(engine.buckets))  # fmt: skip


def test_a_step_clock_arrival_waits_for_its_step(engine):
    """On the step clock, a request arriving at step 3 joins after 3 steps have run (whatever
    they took), and an idle engine jumps to the next arrival instead of sleeping."""
    reqs = [Request(0, 0.0, 4, 4), Request(1, 3.0, 4, 2), Request(2, 50.0, 2, 1)]
    res = engine.serve(reqs, clock="steps")
    assert [sorted(t for t, _ in m.batch) for m in res.measured] == [
        [4], [1], [1], [1, 4], [1], [2]]  # fmt: skip
    with pytest.raises(KvjaxError, match="clock='sim'; allowed: wall, steps"):
        engine.serve(reqs, clock="sim")
