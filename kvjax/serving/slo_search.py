"""MLPerf's Server and Interactive scenarios as the simulator runs them: Poisson arrivals at the
largest rate whose P99 TTFT and TPOT hold, found by bisection; the percentiles as MLPerf's
LoadGen reports them (TPOT: a request's time from its first token to its last over its other
tokens)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from kvjax.serving.simulate import report

SLO_SCENARIOS = ("server", "interactive")
SLO_REQUESTS = 1000  # a server run's requests: its P99 is the 10th slowest
SLO_STEPS = 8  # bisections of the rate's 16x bracket on a log scale: within 1.1%


def slo_percentiles(result, pct: float) -> tuple[float, float]:
    """(TTFT, TPOT) at percentile `pct` over a run's requests, as MLPerf's LoadGen reports them:
    TPOT a request's time from its first token to its last over its other tokens."""
    rs = result.requests
    ttft = [r.token_times[0] - r.arrival_s for r in rs]
    tpot = [
        (r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1)
        for r in rs
        if len(r.token_times) > 1
    ]
    return float(np.percentile(ttft, pct)), float(np.percentile(tpot, pct)) if tpot else 0.0


def slo_prediction(
    row: dict[str, Any],
    serve: Callable[[float, float], Any],
    ends: tuple[float, float],
    output_len: int,
    replicas: int,
) -> dict[str, Any]:
    """A server row's output tokens/s: the largest Poisson rate (a replica's share, bisected on a
    log scale) whose TTFT and TPOT hold at the row's percentile, found again with every step
    `ends` times as long for the interval. `serve(rate, factor)`: a replica's run at that rate,
    each step `factor` times as long. Above the rate one replica's offline run sustains no SLO
    holds, so that rate brackets the search from above. The value is the rate's output tokens, as
    a long run (MLPerf's: ten minutes and more) delivers them, at most the offline run's: a run
    of SLO_REQUESTS' own throughput counts its ramp and drain (14-17% under the rate's tokens on
    llama2-70b on 8 H200)."""
    pct = 100 * float(row["slo_percentile"] or 0.99)  # the column is a fraction (0.99)
    ttft, tpot = float(row["slo_ttft_s"]), float(row["slo_tpot_s"])

    def largest(factor: float, lo: float, hi: float, steps: int) -> tuple[float, float]:
        ok = None
        for _ in range(steps):
            mid = math.sqrt(lo * hi)
            result = serve(mid, factor)
            t, p = slo_percentiles(result, pct)
            if t <= ttft and p <= tpot:
                # a long run's tokens at this rate (a short run's own throughput counts its
                # ramp and drain), at most what a replica serves offline
                lo, ok = mid, min(mid, top / factor) * output_len
            else:
                hi = mid
        return lo, (ok or 0.0) * replicas

    top = report(serve(1e9, 1.0))["throughput_tokens_per_s"] / output_len
    rate, value = largest(1.0, top / 16, top, SLO_STEPS)
    # at an end every step is f times as long: its rate near rate / f (within 1.25x, 2.8%)
    found = []
    for f in ends:
        end = largest(f, rate / f / 1.25, rate / f * 1.25, 4)[1]
        if not end:  # no rate in that bracket holds: the whole range below it
            end = largest(f, top / f / 16, rate / f / 1.25, SLO_STEPS)[1]
        found.append(end)
    found.sort()
    return {
        "predicted_value": value,
        "predicted_lo": found[0],
        "predicted_hi": found[1],
        "rate_per_s": rate,
        "preemptions": None,
    }
