"""Prefill/decode disaggregation (DistServe, Zhong et al. 2024; Splitwise, Patel et al. 2024) in
the simulator: one instance prefills, another decodes, and each prompt's KV crosses the link
between them. Pure Python.

Each instance is kvjax's scheduler with its own pool and its own step-time model. A request
arrives at the prefill instance, which computes its prompt (chunked as the budget allows) and
samples its first token there: that is its time to first token. Its prompt's KV then travels
`transfer_s(request)` seconds (bytes / link bandwidth + latency, `kv_transfer_s`), after which it
waits at the decode instance, is admitted with that KV already in its pages (`Request.transferred`)
and decodes the rest. A decode-side preemption recomputes the prompt there. The two instances
step independently: the clock always advances the one whose next step starts first.
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
    prefill: Scheduler,
    decode: Scheduler,
    prefill_time: Callable[[list[Scheduled]], float],
    decode_time: Callable[[list[Scheduled]], float],
    transfer_s: Callable[[Request], float],
) -> SimulationResult:
    """Every request through both instances (none lost, none served twice); the result's pages
    are the decode instance's, its steps and busy time both instances'."""
    pending = sorted(requests, key=lambda r: (r.arrival_s, r.id))
    if len({r.id for r in pending}) != len(pending):
        raise KvjaxError("request ids must be unique")
    first = {
        r.id: Request(r.id, r.arrival_s, r.prompt_len, 1, r.prefix_id, r.prefix_len)
        for r in pending
    }  # the prefill instance's copy: the prompt and one token
    for r in pending:
        prefill.check(first[r.id])
        decode.check(r)
    by_id = {r.id: r for r in pending}
    p, d = _Instance(prefill, prefill_time), _Instance(decode, decode_time)
    handoffs: list[tuple[float, int]] = []  # (when its KV has arrived, request id)
    i, done, n = 0, 0, len(pending)
    while done < n:
        # the instance whose next step can start first moves
        p_next = (
            p.free_at
            if (p.sched.waiting or p.sched.running)
            else (max(p.free_at, pending[i].arrival_s) if i < n else float("inf"))
        )
        d_next = (
            d.free_at
            if (d.sched.waiting or d.sched.running)
            else (max(d.free_at, handoffs[0][0]) if handoffs else float("inf"))
        )
        if p_next <= d_next:
            while i < n and pending[i].arrival_s <= p_next:
                p.sched.add(first[pending[i].id])
                i += 1
            ran = p.run_step(p_next)
            if ran is None:  # idle until the next arrival
                p.free_at = pending[i].arrival_s if i < n else float("inf")
                continue
            done += _prefilled(p, *ran, by_id, handoffs, transfer_s)
        else:
            while handoffs and handoffs[0][0] <= d_next:
                d.sched.add(by_id[heapq.heappop(handoffs)[1]])
            ran = d.run_step(d_next)
            if ran is None:
                d.free_at = handoffs[0][0] if handoffs else float("inf")
                continue
            end, batch = ran
            done += len(d.sched.finish_step(batch, end))
            d.pages.append((end, d.sched.pool.used_pages))
    end_s = max(r.finish_s for r in pending)
    in_system = sum(r.finish_s - r.arrival_s for r in pending)  # the integral, request by request
    return SimulationResult(
        pending,
        p.steps + d.steps,
        p.sched.preemptions + d.sched.preemptions,
        end_s,
        p.busy + d.busy,
        in_system,
        d.pages,
        prefill.pool.hits,
        prefill.pool.lookups,
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
