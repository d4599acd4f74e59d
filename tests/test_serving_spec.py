"""Speculative decoding in the scheduler (DeepSeek's MTP as the draft): by hand at acceptance 1
and 0, and the tokens a verify step yields against the closed form's expectation."""

import json

import pytest

from kvjax import KvjaxError
from kvjax.analytic.serving import expected_tokens
from kvjax.serving.pages import PagePool
from kvjax.serving.scheduler import Request, Scheduler
from kvjax.serving.simulate import simulate


def step_time(batch) -> float:
    return 1e-3 + 1e-5 * sum(s.tokens for s in batch)


def run(output_len, spec_tokens, acceptance, seed=0):
    sched = Scheduler(PagePool(1024, 16), 8, 256, spec_tokens=spec_tokens,
                      acceptance=acceptance, seed=seed)  # fmt: skip
    return simulate([Request(0, 0.0, 16, output_len)], sched, step_time)


def test_every_draft_accepted_and_none():
    prefill, verify = 1e-3 + 16e-5, 1e-3 + 4e-5  # 16 prompt tokens; 1 + 3 drafts
    # acceptance 1: after the prefill's token, two steps of 4 (the last: 3 drafts, all needed)
    r = run(9, 3, 1.0).requests[0]
    assert r.token_times == pytest.approx([prefill] + [prefill + verify] * 4
                                          + [prefill + 2 * verify] * 4)  # fmt: skip
    # acceptance 0: one token a step, each step verifying 3 drafts for nothing (the last two
    # steps draft only what is left: 2 and 1 tokens, then 0 drafts for the last token)
    r = run(5, 3, 0.0).requests[0]
    steps = [1e-3 + 1e-5 * t for t in (4, 3, 2, 1)]
    times = [prefill + sum(steps[:i]) for i in range(1, 5)]
    assert r.token_times == pytest.approx([prefill, *times])


def test_tokens_per_verify_step_meet_the_closed_form():
    """4,000 decoded tokens at K=4, acceptance 0.6: the steps they took against 4,000 / E[tokens a
    step] = (1 - 0.6^5) / 0.4 = 2.306 (the generator seeded: a fixed draw; 3% covers its spread
    and the last steps' shorter drafts)."""
    result = run(4001, 4, 0.6)
    decode_steps = result.steps - 1  # the first: the prefill
    assert decode_steps == pytest.approx(4000 / expected_tokens(4, 0.6), rel=0.03)
    assert len(result.requests[0].token_times) == 4001


def test_bad_settings_are_refused_by_name():
    with pytest.raises(KvjaxError, match="spec_tokens=-1 must be an integer >= 0"):
        Scheduler(PagePool(8, 16), 1, 8, spec_tokens=-1)
    with pytest.raises(KvjaxError, match=r"acceptance=1.5 must lie in \[0, 1\]"):
        Scheduler(PagePool(8, 16), 1, 8, spec_tokens=2, acceptance=1.5)


def test_cli_simulate_speculative(capsys):
    from kvjax.cli.main import main

    base = ["simulate", "--model", "llama-3-8b", "--chip", "h100-sxm", "--rate", "4",
            "--requests", "16", "--prompt-len", "200", "--output-len", "200", "--json"]  # fmt: skip
    assert main([*base, "--spec-tokens", "2"]) == 2
    assert "needs --spec-tokens K and --acceptance A together" in capsys.readouterr().err
    assert main([*base, "--spec-tokens", "2", "--acceptance", "0.8", "--disaggregate"]) == 2
    assert "--spec-tokens runs on one colocated engine" in capsys.readouterr().err
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*base, "--spec-tokens", "2", "--acceptance", "0.8"]) == 0
    spec = json.loads(capsys.readouterr().out)
    # decodes read the weights once for up to 3 tokens: the time between tokens falls
    assert spec["output_tokens"] == plain["output_tokens"]
    assert spec["itl_s"]["mean"] < 0.7 * plain["itl_s"]["mean"]
