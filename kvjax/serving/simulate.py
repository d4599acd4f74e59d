"""The simulator's clock: a discrete-event loop that runs the scheduler's steps, each as long as a
step-time model says, and the per-request report (TTFT, ITL, end-to-end, their percentiles,
throughput, goodput under an SLO, pages in use, preemptions, prefix hits). Pure Python + numpy.

A step-time model is any callable `model(batch) -> seconds`, batch a list of
`kvjax.serving.scheduler.Scheduled` (each request's new tokens and the context they reach):
`kvjax.serving.step_time.ClosedFormStepTime` (the bound on a chip) or one fitted to measured steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvjax.errors import KvjaxError
from kvjax.serving.scheduler import Request, Scheduled, Scheduler

PERCENTILES = (50, 90, 99)


@dataclass
class SimulationResult:
    requests: list[Request]
    steps: int
    preemptions: int
    end_s: float
    busy_s: float  # time a step was running
    requests_in_system_s: float  # integral of the number of requests in the system over time
    pages_in_use: list[tuple[float, int]]  # (time, pages) after each step
    prefix_hit_pages: int
    prefix_lookup_pages: int


def in_arrival_order(requests: list[Request], schedulers: list[Scheduler]) -> list[Request]:
    """The requests by arrival (ties by id), each checked against every engine copy before
    anything runs (a request that can never fit is refused by name); ids must be unique."""
    pending = sorted(requests, key=lambda r: (r.arrival_s, r.id))
    if len({r.id for r in pending}) != len(pending):
        raise KvjaxError("request ids must be unique")
    for r in pending:
        for s in schedulers:
            s.check(r)
    return pending


def simulate(
    requests: list[Request],
    scheduler: Scheduler,
    step_time: Callable[[list[Scheduled]], float],
    speed: Callable[[float], float] | None = None,
) -> SimulationResult:
    """Every request from its arrival to its last token (none lost, none served twice). `speed`,
    a function of the time a step starts, multiplies the step's time: a machine whose speed moves
    (`kvjax.serving.fitted.SpeedTrace`, measured on an engine's run)."""
    pending = in_arrival_order(requests, [scheduler])
    now, i, steps, busy, in_system, done = 0.0, 0, 0, 0.0, 0.0, 0
    pages: list[tuple[float, int]] = []
    runs = getattr(step_time, "decode_steps", None)  # the fast path's step times
    while done < len(pending):
        while i < len(pending) and pending[i].arrival_s <= now:
            scheduler.add(pending[i])
            i += 1
        fast = decode_run(scheduler) if runs is not None else None
        if fast is not None:  # steps of decodes alone, each as the loop below runs it
            k, events = fast
            run, times, e = list(scheduler.running), [], 0
            admissible = not scheduler.waiting and len(run) < scheduler.max_batch
            for base in runs([r.computed for r in run], k):
                while e < len(events) and events[e][0] == len(times) + 1:  # schedule's _grow
                    run[events[e][1]].pages += scheduler.pool.allocate(1)
                    e += 1
                dt, in_system = _clock(base, len(run), now, in_system, pending, i, done, speed)
                now += dt
                busy += dt
                steps += 1
                times.append(now)
                pages.append((now, scheduler.pool.used_pages))
                if i < len(pending) and pending[i].arrival_s <= now and admissible:
                    break  # admitted at the next step: the loop's
                while i < len(pending) and pending[i].arrival_s <= now:
                    scheduler.add(pending[i])
                    i += 1
            for r in run:  # finish_step's, for every step at once (none finishes)
                r.computed += len(times)
                r.generated += len(times)
                r.token_times += times
            continue
        batch = scheduler.schedule()
        if not batch:
            if i == len(pending):
                raise KvjaxError(  # the add() check makes this unreachable; a guard, not a path
                    f"{len(scheduler.waiting)} requests wait and none can run"
                )
            nxt = pending[i].arrival_s
            in_system += (nxt - now) * (i - done)
            now = nxt
            continue
        dt, in_system = _clock(
            step_time(batch), len(batch), now, in_system, pending, i, done, speed
        )
        now += dt
        busy += dt
        steps += 1
        done += len(scheduler.finish_step(batch, now))
        pages.append((now, scheduler.pool.used_pages))
    return SimulationResult(
        pending,
        steps,
        scheduler.preemptions,
        now,
        busy,
        in_system,
        pages,
        scheduler.pool.hits,
        scheduler.pool.lookups,
    )


def _clock(base, n, now, in_system, pending, i, done, speed) -> tuple[float, float]:
    """A step of `base` seconds starting at `now` (times the machine's speed then): its length,
    and the request-seconds integral with the step added (arrivals during it join at its end)."""
    dt = float(base) * (1.0 if speed is None else float(speed(now)))
    if not dt > 0:
        raise KvjaxError(f"the step-time model gave {dt!r} s for a step of {n}")
    in_system += dt * (i - done)
    j = i  # arrivals during the step (sorted: stop at the first after it)
    while j < len(pending) and pending[j].arrival_s < now + dt:
        in_system += now + dt - pending[j].arrival_s
        j += 1
    return dt, in_system


def merge_replicas(results: list[SimulationResult]) -> SimulationResult:
    """Replicas behind a router, each its own run: one result over all their requests (the
    busy time their mean, the request-seconds and counts their sums, the pages per replica)."""
    if len(results) == 1:
        return results[0]
    return SimulationResult(
        sorted((r for res in results for r in res.requests), key=lambda r: (r.arrival_s, r.id)),
        sum(r.steps for r in results),
        sum(r.preemptions for r in results),
        max(r.end_s for r in results),
        sum(r.busy_s for r in results) / len(results),
        sum(r.requests_in_system_s for r in results),
        sorted(p for r in results for p in r.pages_in_use),
        sum(r.prefix_hit_pages for r in results),
        sum(r.prefix_lookup_pages for r in results),
    )


def _admission_fails(sch: Scheduler, budget: int) -> bool:
    """`schedule` admits nothing in the coming steps of decodes alone, and its try changes
    nothing: the batch is full, the budget spent, or the first waiting request (no prefix hit)
    needs more pages than are free (decodes alone only take pages)."""
    if len(sch.running) >= sch.max_batch or budget <= 0:
        return True
    r = sch.waiting[0]
    if not sch.chunked_prefill and r.known > budget:
        return True
    if sch.prefix_caching:
        full = (r.prompt_len - 1) // sch.pool.page_size
        if sch.pool.cached_prefix([r.page_hash(j, sch.pool.page_size) for j in range(full)]):
            return False  # a try would take and release its hits (the free list's order)
    computed = max(0, r.transferred)
    tokens = (
        r.prompt_len + r.output_len - 1 - computed
        if sch.reserve
        else min(r.known - computed, budget)
    )
    return sch.pool.pages_for(computed + tokens) > sch.pool.free_pages


def decode_run(sch: Scheduler) -> tuple[int, list[tuple[int, int]]] | None:
    """The simulator's fast path: how many steps in a row every running request decodes one
    token and nothing else can happen (no admission, no preemption, none finishing), and the
    pages those steps take, (step, request) in the order `schedule` takes them. None where
    fewer than two such steps follow (the loop runs the step itself)."""
    run = sch.running
    n = len(run)
    if n == 0 or n > sch.token_budget or sch.spec_tokens:  # speculative: the loop's steps
        return None
    if any(r.computed != r.known - 1 or r.computed < r.prompt_len for r in run):
        return None
    if sch.waiting and not _admission_fails(sch, sch.token_budget - n):
        return None
    k = min(r.output_len - r.generated for r in run) - 1  # the step finishing one: the loop's
    P, events = sch.pool.page_size, []
    for j, r in enumerate(run):
        first = len(r.pages) * P - r.computed + 1  # the first step whose token has no page
        events += [(step, j) for step in range(max(first, 1), k + 1, P)]
    events.sort()
    if len(events) > sch.pool.free_pages:
        k = events[sch.pool.free_pages][0] - 1  # the step that would preempt: the loop's
    return (k, [e for e in events if e[0] <= k]) if k >= 2 else None


def _stats(values) -> dict[str, float | None]:
    if len(values) == 0:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    v = np.asarray(values, dtype=float)
    return {"mean": float(v.mean()), **{f"p{q}": float(np.percentile(v, q)) for q in PERCENTILES}}


def report(
    result: SimulationResult, slo_ttft_s: float | None = None, slo_itl_s: float | None = None
) -> dict:
    """The run's numbers: per-request times at percentiles, rates, SLO goodput, memory."""
    rs = result.requests
    ttft = [r.token_times[0] - r.arrival_s for r in rs]
    itl_each = [np.diff(r.token_times) for r in rs]
    itl = np.concatenate(itl_each) if itl_each else np.array([])
    e2e = [r.finish_s - r.arrival_s for r in rs]
    # a request's time per output token after its first (MLPerf's TPOT), where it has two
    tpot = [
        (r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1)
        for r in rs
        if len(r.token_times) > 1
    ]
    start = min(r.arrival_s for r in rs)
    span = result.end_s - start
    out_tokens = sum(r.generated for r in rs)
    good = [
        (slo_ttft_s is None or t <= slo_ttft_s)
        and (slo_itl_s is None or len(i) == 0 or np.percentile(i, 99) <= slo_itl_s)
        for t, i in zip(ttft, itl_each, strict=True)
    ]
    return {
        "requests_in": len(rs),
        "requests_out": sum(r.finish_s is not None for r in rs),
        "ttft_s": _stats(ttft),
        "itl_s": _stats(itl),
        "tpot_s": _stats(tpot),
        "e2e_s": _stats(e2e),
        "throughput_tokens_per_s": out_tokens / span,
        "goodput_requests_per_s": float(sum(good)) / span,
        "slo": {"ttft_s": slo_ttft_s, "itl_p99_s": slo_itl_s, "met": int(sum(good))},
        "preemptions": result.preemptions,
        "steps": result.steps,
        "busy_fraction": result.busy_s / span,
        "mean_requests_in_system": result.requests_in_system_s / span,
        "peak_pages_in_use": max((p for _, p in result.pages_in_use), default=0),
        "prefix_hit_rate": (
            result.prefix_hit_pages / result.prefix_lookup_pages
            if result.prefix_lookup_pages
            else None
        ),
        "output_tokens": out_tokens,
        "duration_s": span,
    }
