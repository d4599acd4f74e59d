"""Prefill/decode disaggregation (DistServe, Zhong et al. 2024; Splitwise, Patel et al. 2024) in
the simulator: x instances prefill, y others decode (xP + yD), and each prompt's KV crosses the
link between them. Pure Python.

Each instance is kvjax's scheduler with its own pool and its own step-time model. A request
arrives at the prefill instance, which computes its prompt (chunked as the budget allows) and
samples its first token there: that is its time to first token. Its prompt's KV then travels
`transfer_s(request)` seconds (bytes / link bandwidth + latency, `kv_transfer_s`), after which it
waits at the decode instance, is admitted with that KV already in its pages (`Request.transferred`)
and decodes the rest. A decode-side preemption recomputes the prompt there. The instances step
independently: the clock always advances the one whose next step starts first; a request goes
to the instance of its kind holding the fewest requests.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from kvjax.errors import KvjaxError
from kvjax.serving.scheduler import Request, Scheduled, Scheduler
from kvjax.serving.simulate import SimulationResult


def kv_transfer_s(kv_bytes_per_token: float, link_bytes_per_s: float, latency_s: float = 0.0):
    """A request's transfer time: its prompt's KV over the link (one direction), plus latency."""
    if not link_bytes_per_s > 0:
        raise KvjaxError(f"link bandwidth {link_bytes_per_s!r} B/s must be > 0")
    return lambda r: r.prompt_len * kv_bytes_per_token / link_bytes_per_s + latency_s


class _Instance:
    def __init__(self, scheduler: Scheduler, step_time):
        self.sched, self.step_time = scheduler, step_time
        self.free_at, self.busy, self.steps = 0.0, 0.0, 0
        self.pages: list[tuple[float, int]] = []
        self.stalled = False  # a step found nothing to run: idle until a request comes

    @property
    def has_work(self) -> bool:
        return not self.stalled and bool(self.sched.waiting or self.sched.running)

    def run_step(self, now: float) -> tuple[float, list[Scheduled]] | None:
        """The next step from `now` (its end and batch), None when nothing can run."""
        batch = self.sched.schedule()
        if not batch:
            return None
        dt = float(self.step_time(batch))
        if not dt > 0:
            raise KvjaxError(f"the step-time model gave {dt!r} s for a step of {len(batch)}")
        self.busy += dt
        self.steps += 1
        self.free_at = now + dt
        return self.free_at, batch


def simulate_disaggregated(
    requests: list[Request],
    prefill: Scheduler | list[Scheduler],
    decode: Scheduler | list[Scheduler],
    prefill_time: Callable[[list[Scheduled]], float],
    decode_time: Callable[[list[Scheduled]], float],
    transfer_s: Callable[[Request], float],
) -> SimulationResult:
    """Every request through a prefill instance and a decode instance (none lost, none served
    twice): x prefill instances and y decode instances (xP + yD), an arrival sent to the prefill
    instance holding the fewest requests, a handoff to the decode instance holding the fewest
    (the first on ties). The result's pages are the decode instances', its steps and busy time
    all instances'. Events at one time: arrivals, then handoffs, then the instance whose step
    starts first (prefill instances first on ties)."""
    prefills = list(prefill) if isinstance(prefill, list) else [prefill]
    decodes = list(decode) if isinstance(decode, list) else [decode]
    if not prefills or not decodes:
        raise KvjaxError("a disaggregated deployment needs at least one prefill and one decode")
    pending = sorted(requests, key=lambda r: (r.arrival_s, r.id))
    if len({r.id for r in pending}) != len(pending):
        raise KvjaxError("request ids must be unique")
    first = {
        r.id: Request(r.id, r.arrival_s, r.prompt_len, 1, r.prefix_id, r.prefix_len)
        for r in pending
    }  # the prefill instance's copy: the prompt and one token
    for r in pending:
        prefills[0].check(first[r.id])
        decodes[0].check(r)
    by_id = {r.id: r for r in pending}
    ps = [_Instance(s, prefill_time) for s in prefills]
    ds = [_Instance(s, decode_time) for s in decodes]
    handoffs: list[tuple[float, int]] = []  # (when its KV has arrived, request id)
    pages = [0] * len(ds)
    i, done, n = 0, 0, len(pending)
    while done < n:
        arrival = pending[i].arrival_s if i < n else float("inf")
        handoff = handoffs[0][0] if handoffs else float("inf")
        ready = [(x.free_at, j) for j, x in enumerate(ps + ds) if x.has_work]
        now, k = min(ready) if ready else (float("inf"), -1)
        if arrival <= min(handoff, now):
            _route(ps, first[pending[i].id], arrival)
            i += 1
        elif handoff <= now:
            _route(ds, by_id[heapq.heappop(handoffs)[1]], handoff)
        elif k < 0:
            raise KvjaxError(f"{n - done} requests can be admitted by no instance")
        elif k < len(ps):
            x = ps[k]
            ran = x.run_step(now)
            if ran is None:
                x.stalled = True
                continue
            done += _prefilled(x, *ran, by_id, handoffs, transfer_s)
        else:
            x = ds[k - len(ps)]
            ran = x.run_step(now)
            if ran is None:
                x.stalled = True
                continue
            end, batch = ran
            done += len(x.sched.finish_step(batch, end))
            pages[k - len(ps)] = x.sched.pool.used_pages
            x.pages.append((end, sum(pages)))
    return _result(pending, ps, ds)


def _route(instances: list[_Instance], r: Request, now: float) -> None:
    """`r` to the instance holding the fewest requests (the first on ties), at `now`."""
    x = min(instances, key=lambda x: len(x.sched.waiting) + len(x.sched.running))
    if not x.has_work:  # idle: its next step starts when the request comes
        x.free_at = max(x.free_at, now)
    x.stalled = False
    x.sched.add(r)


def _result(pending: list[Request], ps: list[_Instance], ds: list[_Instance]):
    both = ps + ds
    end_s = max(r.finish_s for r in pending)
    in_system = sum(r.finish_s - r.arrival_s for r in pending)  # the integral, request by request
    pages = sorted(p for d in ds for p in d.pages)
    return SimulationResult(
        pending,
        sum(x.steps for x in both),
        sum(x.sched.preemptions for x in both),
        end_s,
        sum(x.busy for x in both),
        in_system,
        pages,
        sum(x.sched.pool.hits for x in ps),
        sum(x.sched.pool.lookups for x in ps),
    )


def _prefilled(p: _Instance, end: float, batch, by_id: dict, handoffs: list, transfer_s) -> int:
    """A prefill step's requests: each its first token; one done there (a single output
    token), the others handed to the decode instance once their KV has crossed the link. The
    requests done."""
    done = 0
    for f in p.sched.finish_step(batch, end):
        r = by_id[f.id]
        r.token_times.append(end)
        r.generated, r.cached_tokens = 1, f.cached_tokens
        r.preemptions += f.preemptions
        if r.done:  # one output token: served by the prefill instance alone
            r.finish_s = end
            done += 1
        else:
            r.transferred = r.prompt_len
            heapq.heappush(handoffs, (end + transfer_s(r), r.id))
    return done
