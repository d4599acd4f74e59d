"""A calibration for the fitted step model (`kvjax.serving.fitted`) that covers what it fits by
construction, whatever the machine's speed. Pure Python.

Its requests arrive on a *step clock*: `arrival_s` counts steps, not seconds (the engine's
`serve(..., clock="steps")`, and `simulate` with steps of 1 s), so which batches it runs is decided
by the scheduler alone and is the same on a fast machine and a busy one. It holds, for an engine's
limits (slots, positions, token budget, pool):
1. every chunk bucket alone (a prompt as long as the bucket, or as the longest one the pool and a
   slot hold inside it), then its decodes one at a time;
2. k = 1..4 requests of short prompts at once, their outputs staggered: a step of several
   chunks, then decodes falling from k to 1;
3. every bucket beside one decode: a short request decoding when the bucket's prompt arrives.
Each scenario starts when the one before it has finished (`plan` chains them on the step clock).

Which coefficients its steps determine is `identifiable`: all of `feature_names(buckets)` on an
engine that runs two requests at once and a chunk beside a decode. Where the limits forbid that
(one slot, a pool of one page, a budget of 2), no batch the engine can ever run tells some
coefficients apart, and they are merged, in this order: `step` into the others (every step holds
one entry or one kind), then `decodes` into `decode` (a decode step holds one), then a bucket no
request that fits can reach is dropped. A batch the engine can run then costs the same under any
split of the merged ones (tests/test_serving_calibrate.py checks it on random loads).
"""

from __future__ import annotations

from kvjax.serving.fitted import BASE, feature_names, features
from kvjax.serving.pages import PagePool
from kvjax.serving.scheduler import Request, Scheduler

REPEATS = 3  # each scenario's steps, measured this many times (a step's time is noisy)
MERGE_ORDER = ("step", "decodes")


def _scenarios(buckets, max_batch: int, cap: int, token_budget: int) -> list[list[tuple]]:
    """(step offset, prompt, output) per request, one list per scenario. `cap`: the most
    positions one request may hold (a slot's, the pool's, whichever is less)."""

    def out(prompt: int, want: int) -> int:  # outputs a slot of `cap` positions holds
        return max(1, min(want, cap - prompt + 1))

    small = 2 if token_budget >= 2 and cap >= 3 else 1  # a short prompt with room to decode
    scenarios = []
    lower = 1
    for b in buckets:  # 1: each bucket alone, then its decodes
        p = min(b, cap)
        if p > lower:  # a prompt of lower + 1 .. b tokens is padded to b
            scenarios.append([(0, p, out(p, 3))])
        lower = b
    k = min(max_batch, 4)  # 2: k short requests at once, their decodes falling from k to 1
    for first in (2, 1):  # outputs first, first + 1, ... (from 1: where a slot holds 2 tokens)
        scenarios.append([(0, small, out(small, first + i)) for i in range(k)])
    lower = 1
    for b in buckets:  # 3: each bucket beside a decode
        p = min(b, cap, token_budget - 1)
        if p > lower:
            scenarios.append([(0, small, out(small, 3)), (1, p, 1)])
        lower = b
    return [s for s in scenarios for _ in range(REPEATS)]


def plan(
    buckets, max_batch: int, max_len: int, token_budget: int, pool_pages: int, page_size: int
) -> list[Request]:
    """The calibration's requests, `arrival_s` in steps (each scenario after the one before it
    has finished), for an engine of these limits."""
    cap = min(max_len, pool_pages * page_size)
    reqs: list[Request] = []
    start = 0
    for scenario in _scenarios(buckets, max_batch, cap, token_budget):
        batch = [
            Request(len(reqs) + i, float(start + at), p, o) for i, (at, p, o) in enumerate(scenario)
        ]
        sched = Scheduler(
            PagePool(pool_pages, page_size), max_batch, token_budget, prefix_caching=False
        )
        start += len(batches(batch, sched, offset=start))
        reqs += batch
    return reqs


def batches(requests: list[Request], sched: Scheduler, offset: int = 0) -> list[list[tuple]]:
    """The (tokens, context) batches the scheduler runs for requests on the step clock (one step
    a unit of time, from `offset`); the requests are copied, not served."""
    from kvjax.serving.simulate import simulate

    copies = [Request(r.id, r.arrival_s - offset, r.prompt_len, r.output_len) for r in requests]
    out: list[list[tuple]] = []

    def step(batch) -> float:
        out.append([(s.tokens, s.context) for s in batch])
        return 1.0

    simulate(copies, sched, step)
    return out


def identifiable(steps, buckets) -> tuple[str, ...]:
    """The features of `feature_names(buckets)` that these (tokens, context) batches determine:
    all of them where they can; else merged in `MERGE_ORDER`, then the buckets none reached
    dropped (see the module docstring)."""
    import numpy as np

    names = list(feature_names(buckets))
    X = np.stack([features(b, buckets) for b in steps])
    keep = [i for i, n in enumerate(names) if n in BASE or X[:, i].any()]
    for merged in MERGE_ORDER:
        if np.linalg.matrix_rank(X[:, keep]) == len(keep):
            break
        keep.remove(names.index(merged))
    return tuple(names[i] for i in keep)
