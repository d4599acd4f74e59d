"""Copies of a deployment behind a router (`kvjax simulate --replicas N --route R`), each copy its
own scheduler and page pool, one report over them.

- round-robin: the i-th arrival (in arrival order) to copy i mod N, whatever the copies hold;
  each copy is then simulated alone (`kvjax.serving.simulate.simulate`) and the runs merged;
- least-loaded: each arrival to the copy with the fewest requests routed to it and not yet
  finished at that moment (ties to the lowest index): the least-outstanding-requests policy of
  the engines' routers (SGLang's router, vLLM's production stack). The choice depends on every
  copy's state at each arrival, so the copies run on one clock: the next event is the earliest
  step end or arrival; at a time t the steps ending then finish first, then the arrivals up to t
  are routed and queued, then every idle copy with work starts its next step, as `simulate`
  runs one copy. `joint` runs round-robin this way too (a test checks it against the split runs).
"""

from __future__ import annotations

from collections.abc import Callable

from kvjax.errors import KvjaxError
from kvjax.serving.scheduler import Request, Scheduled, Scheduler
from kvjax.serving.simulate import SimulationResult, in_arrival_order, merge_replicas, simulate

ROUTES = ("round-robin", "least-loaded")


def simulate_replicas(
    requests: list[Request],
    schedulers: list[Scheduler],
    step_time: Callable[[list[Scheduled]], float],
    route: str = "round-robin",
) -> SimulationResult:
    """Every request served by one of the copies (`schedulers`, one a copy), routed by `route`."""
    if route not in ROUTES:
        raise KvjaxError(f"route={route!r} is not supported; allowed: {', '.join(ROUTES)}")
    order = sorted(requests, key=lambda r: (r.arrival_s, r.id))
    n = len(schedulers)
    if route == "round-robin":
        copies = [order[i::n] for i in range(n)]
        return merge_replicas(
            [simulate(c, s, step_time) for c, s in zip(copies, schedulers, strict=True) if c]
        )
    return joint(order, schedulers, step_time, least_loaded)


def least_loaded(i: int, load: list[int]) -> int:
    return min(range(len(load)), key=lambda r: (load[r], r))


def round_robin(i: int, load: list[int]) -> int:
    return i % len(load)


def closed_loop(
    requests: list[Request],
    schedulers: list[Scheduler],
    step_time: Callable[[list[Scheduled]], float],
    concurrency: int,
    route: str = "round-robin",
) -> SimulationResult:
    """A closed loop of `concurrency` clients, as `vllm bench serve --max-concurrency`,
    genai-perf's and trtllm-bench's concurrency modes run one: the first `concurrency` requests
    (by id) sent at once, each later one the moment an earlier one finishes; every request
    counted from the first sent to the last done (the runs count no warm-up apart). The copies
    run on one clock (`joint`), the arrivals routed by `route`."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise KvjaxError(f"concurrency={concurrency!r} must be an integer >= 1")
    if route not in ROUTES:
        raise KvjaxError(f"route={route!r} is not supported; allowed: {', '.join(ROUTES)}")
    for k, r in enumerate(sorted(requests, key=lambda r: r.id)):
        r.arrival_s = 0.0 if k < concurrency else float("inf")  # sent when a slot frees
    pick = least_loaded if route == "least-loaded" else round_robin
    return joint(requests, schedulers, step_time, pick, release=True)


def joint(
    requests: list[Request],
    schedulers: list[Scheduler],
    step_time: Callable[[list[Scheduled]], float],
    pick: Callable[[int, list[int]], int],
    release: bool = False,
) -> SimulationResult:
    """The copies on one clock, the i-th arrival to copy `pick(i, load)` (load: the requests each
    copy holds, routed and not finished). `release`: a closed loop, each finish sending the next
    request not yet sent (its arrival, inf until then, set to the finish)."""
    pending = in_arrival_order(requests, schedulers)
    sent = sum(r.arrival_s < float("inf") for r in pending)
    n, inf = len(schedulers), float("inf")
    batch: list[list[Scheduled] | None] = [None] * n
    start, end, load = [0.0] * n, [inf] * n, [0] * n
    steps, busy, pages = [0] * n, [0.0] * n, []
    i = done = 0
    while done < len(pending):
        t = min(min(end), pending[i].arrival_s if i < len(pending) else inf)
        if t == inf:
            raise KvjaxError("requests wait on an idle copy and none can run")  # a guard
        for r in range(n):  # the steps ending at t
            if end[r] == t:
                finished = len(schedulers[r].finish_step(batch[r], t))
                done, load[r] = done + finished, load[r] - finished
                for _ in range(finished if release else 0):
                    if sent < len(pending):  # the next client's request, sent now
                        pending[sent].arrival_s, sent = t, sent + 1
                steps[r], busy[r] = steps[r] + 1, busy[r] + t - start[r]
                pages.append((t, schedulers[r].pool.used_pages))
                batch[r], end[r] = None, inf
        while i < len(pending) and pending[i].arrival_s <= t:
            r = pick(i, load)
            schedulers[r].add(pending[i])
            load[r] += 1
            i += 1
        for r in range(n):  # every idle copy with work starts its next step at t
            if batch[r] is None and load[r]:
                b = schedulers[r].schedule()
                if b:
                    dt = float(step_time(b))
                    if not dt > 0:
                        raise KvjaxError(
                            f"the step-time model gave {dt!r} s for a step of {len(b)}"
                        )
                    batch[r], start[r], end[r] = b, t, t + dt
    return SimulationResult(
        pending,
        sum(steps),
        sum(s.preemptions for s in schedulers),
        max(r.token_times[-1] for r in pending),
        sum(busy) / n,
        sum(r.token_times[-1] - r.arrival_s for r in pending),
        sorted(pages),
        sum(s.pool.hits for s in schedulers),
        sum(s.pool.lookups for s in schedulers),
    )
