"""Copies behind a router: the joint clock against the copies run alone, and least-loaded routing
by hand."""

import numpy as np
import pytest

from kvjax import KvjaxError
from kvjax.serving.pages import PagePool
from kvjax.serving.router import joint, round_robin, simulate_replicas
from kvjax.serving.scheduler import Request, Scheduler


def step_time(batch) -> float:
    """1 ms a step plus 10 us a token computed: prefills are long, decodes short."""
    return 1e-3 + 1e-5 * sum(s.tokens for s in batch)


def schedulers(n, pages=64, max_batch=4):
    return [Scheduler(PagePool(pages, 16), max_batch, 256) for _ in range(n)]


def requests(n=40, seed=0):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.004, n))
    return [
        Request(i, float(a), int(rng.integers(20, 200)), int(rng.integers(2, 30)))
        for i, a in enumerate(arrivals)
    ]


def test_joint_round_robin_equals_the_copies_run_alone():
    """The one-clock loop routing round-robin serves every request at the times the split runs
    (each copy simulated alone by kvjax.serving.simulate, then merged) do: token by token."""
    small = dict(pages=16)  # 256 tokens a copy: some requests preempted
    alone = simulate_replicas(requests(), schedulers(3, **small), step_time, "round-robin")
    together = joint(requests(), schedulers(3, **small), step_time, round_robin)
    for a, b in zip(alone.requests, together.requests, strict=True):
        assert a.id == b.id and a.token_times == pytest.approx(b.token_times, abs=1e-12)
    assert together.preemptions == alone.preemptions > 0
    assert (together.steps, together.end_s) == (alone.steps, pytest.approx(alone.end_s))
    assert together.busy_s == pytest.approx(alone.busy_s, rel=1e-12)
    assert together.requests_in_system_s == pytest.approx(alone.requests_in_system_s, rel=1e-9)


def test_least_loaded_sends_arrivals_to_the_copy_with_fewest_outstanding():
    """Two copies; request 0 is long (99 tokens out), 1-3 short (1 token) and arrive while it
    runs, each finishing before the next arrives. Round-robin puts 0 and 2 on copy 0 (2 queues
    behind 0's decodes with max batch 1); least-loaded sends 1, 2 and 3 to the free copy."""

    def reqs():
        return [Request(0, 0.0, 16, 99)] + [Request(i, 0.01 * i, 16, 1) for i in (1, 2, 3)]

    one = dict(pages=64, max_batch=1)
    rr = simulate_replicas(reqs(), schedulers(2, **one), step_time, "round-robin")
    ll = simulate_replicas(reqs(), schedulers(2, **one), step_time, "least-loaded")
    first = 1e-3 + 16e-5  # a 16-token prefill step: its first (and only) token
    by = {r.id: r for r in ll.requests}
    for i in (1, 2, 3):  # each alone on copy 1 at its arrival
        assert by[i].token_times == pytest.approx([0.01 * i + first])
    ttft_rr = {r.id: r.token_times[0] - r.arrival_s for r in rr.requests}
    assert ttft_rr[2] > 0.05  # queued behind request 0's 99 decode steps on copy 0
    # least-loaded ends with request 0 (its prefill, then 98 decodes alone); round-robin later
    assert ll.end_s == pytest.approx(first + 98 * (1e-3 + 1e-5)) and rr.end_s > ll.end_s


def test_unknown_route_is_refused_by_name():
    with pytest.raises(KvjaxError, match="route='random' is not supported; allowed: round-robin"):
        simulate_replicas(requests(4), schedulers(2), step_time, "random")


def _in_system(result) -> int:
    """The most requests sent and not finished at once (a finish before a send at one time)."""
    events = sorted(
        [(r.arrival_s, 1) for r in result.requests] + [(r.finish_s, -1) for r in result.requests]
    )
    now = most = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


@pytest.mark.parametrize("concurrency", [1, 3, 40])
def test_a_closed_loop_keeps_its_clients_busy_and_no_more(concurrency):
    """C clients: the first C requests sent at 0, each later one (by id) the moment an earlier
    one finishes, so at most C are in the system and, while requests remain, exactly C; one
    client serves them one after another; C at least the requests is everyone sent at once."""
    from kvjax.serving.router import closed_loop

    result = closed_loop(requests(), schedulers(2), step_time, concurrency)
    rs = sorted(result.requests, key=lambda r: r.id)
    finishes = sorted(r.finish_s for r in rs)
    assert all(r.arrival_s == 0.0 for r in rs[:concurrency])
    # request C + j is sent at the j-th finish
    assert [r.arrival_s for r in rs[concurrency:]] == finishes[: len(rs) - concurrency]
    assert _in_system(result) == min(concurrency, len(rs))
    if concurrency == 1:
        assert all(a.finish_s <= b.arrival_s for a, b in zip(rs, rs[1:], strict=False))
    with pytest.raises(KvjaxError, match="concurrency=0 must be an integer >= 1"):
        closed_loop(requests(), schedulers(2), step_time, 0)


def test_more_clients_serve_more_tokens_a_second():
    from kvjax.serving.router import closed_loop
    from kvjax.serving.simulate import report

    rates = [
        report(closed_loop(requests(), schedulers(1, max_batch=8), step_time, c))[
            "throughput_tokens_per_s"
        ]
        for c in (1, 2, 4, 8)
    ]
    assert rates == sorted(rates) and rates[-1] > 2 * rates[0]


def test_simulate_takes_a_concurrency_instead_of_a_rate(capsys):
    """`kvjax simulate --concurrency C`: the closed loop, said in the JSON (no rate); --rate and
    --concurrency together, or a closed loop disaggregated, are refused by name."""
    import json

    from kvjax.cli.main import main

    args = [
        "simulate",
        "--model",
        "tiny-gqa",
        "--chip",
        "h100-sxm",
        "--requests",
        "12",
        "--prompt-len",
        "64",
        "--output-len",
        "8",
        "--json",
    ]
    assert main([*args, "--concurrency", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["concurrency"] == 3 and out["requests_out"] == 12
    assert out["rate_requests_per_s"] is None and out["mean_requests_in_system"] <= 3
    with pytest.raises(SystemExit):
        main([*args, "--concurrency", "3", "--rate", "2"])
    assert "not allowed with argument" in capsys.readouterr().err
    assert main([*args, "--concurrency", "3", "--disaggregate"]) == 2
    assert "--disaggregate runs arrivals at --rate" in capsys.readouterr().err
