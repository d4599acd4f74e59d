"""One scheduler for both clocks (the simulator's and, later, the engine's), in the style of vLLM
v1. Pure Python: it decides each step's batch and keeps the page pool; a clock runs the step.

Each step has a token budget. Running requests go first, in the order they were admitted: a
decode takes one token, a prompt still being prefilled takes what remains of it up to the
budget (chunked prefill). Each needs pages for its new tokens; when the pool has none, the
request admitted last is preempted (its pages freed; it goes back to the front of the queue and
recomputes its prompt and the tokens it had generated, as vLLM's preemption by recompute) until
the pages fit or the request itself is the one preempted. Then, unless this step preempted,
waiting requests are admitted in arrival order (FCFS: the first that does not fit stops
admission) while the budget, the batch limit and the pool allow, each starting from the pages its
prompt finds in the prefix cache. A step that preempted admits nothing (vLLM v1's `schedule`:
`if not preempted_reqs`): the pages it freed are for the running requests' next tokens; admitting
the request just preempted (or the one behind it) into them would preempt it again a step later.

Prefix-cache lookups and hits are counted once per admission that succeeds (vLLM v1 records them
after `allocate_slots`), not per attempt: a request that waits and retries is counted once. A
re-admission after a preemption is counted apart (`pool.preempted_lookups`/`preempted_hits`, as
vLLM's `PrefixCacheStats` keeps `preempted_*`), so the hit rate is that of the first admissions.

A request's tokens: its prompt, then what it generated. `computed` of them have their KV in the
pool; a step computes the next ones, and when all it knows are computed it samples one more (the
first at the end of its prompt: the time to first token).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from kvjax.errors import KvjaxError
from kvjax.serving.pages import PagePool


@dataclass(eq=False)  # one object a request: compared by identity (membership tests are hot)
class Request:
    id: int
    arrival_s: float
    prompt_len: int
    output_len: int
    prefix_id: int | None = None  # a shared prefix (system prompt) of prefix_len tokens
    prefix_len: int = 0
    # kept by the scheduler and the clock
    generated: int = 0
    computed: int = 0
    pages: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # when each output token came out
    preemptions: int = 0
    cached_tokens: int = 0  # prompt tokens found in the prefix cache (over all admissions)
    # tokens whose KV arrived over a link (a disaggregated decode instance's request: its
    # prompt's KV from the prefill instance); dropped by a preemption, which recomputes them
    transferred: int = 0
    finish_s: float | None = None

    def __post_init__(self):
        for name in ("prompt_len", "output_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KvjaxError(f"request {self.id}: {name}={value!r} must be an integer >= 1")
        if not 0 <= self.prefix_len <= self.prompt_len:
            raise KvjaxError(
                f"request {self.id}: prefix_len={self.prefix_len} must lie in 0..prompt_len="
                f"{self.prompt_len}"
            )

    @property
    def known(self) -> int:
        """Tokens whose KV a step may compute: the prompt and every token sampled so far (the
        last sampled is computed by the next step, which samples the one after it)."""
        return self.prompt_len + self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.output_len

    def page_hash(self, i: int, page_size: int) -> object:
        """The content hash of the request's i-th prompt page (see `kvjax.serving.pages`): the
        shared prefix's while the page lies inside it, the request's own from the first page
        holding a token of its own."""
        if self.prefix_id is not None and (i + 1) * page_size <= self.prefix_len:
            return ("prefix", self.prefix_id, i)
        return (self.id, i)


@dataclass(frozen=True)
class Scheduled:
    request: Request
    tokens: int  # computed this step
    context: int  # positions attended by the last of them (computed + tokens)


class Scheduler:
    def __init__(
        self,
        pool: PagePool,
        max_batch: int,
        token_budget: int,
        prefix_caching: bool = True,
        chunked_prefill: bool = True,
        reserve: bool = False,
        spec_tokens: int = 0,
        acceptance: float = 0.0,
        seed: int = 0,
    ):
        for name, value in (("max_batch", max_batch), ("token_budget", token_budget)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KvjaxError(f"{name}={value!r} must be a positive integer")
        if isinstance(spec_tokens, bool) or not isinstance(spec_tokens, int) or spec_tokens < 0:
            raise KvjaxError(f"spec_tokens={spec_tokens!r} must be an integer >= 0")
        if not 0.0 <= acceptance <= 1.0:
            raise KvjaxError(f"acceptance={acceptance!r} must lie in [0, 1]")
        # speculative decoding (DeepSeek's multi-token prediction as a draft): each decode
        # verifies its last token and up to spec_tokens drafted ones in one step, and keeps the
        # drafts up to the first rejected (each accepted with probability `acceptance`, drawn
        # from a generator seeded by `seed`) plus one token of its own
        self.spec_tokens, self.acceptance = spec_tokens, acceptance
        self._draws = random.Random(seed)
        self.pool, self.max_batch, self.token_budget = pool, max_batch, token_budget
        self.prefix_caching = prefix_caching
        # False: a prompt is admitted only when all of it fits this step's budget (one prefill)
        self.chunked_prefill = chunked_prefill
        # True: a request is admitted only with pages for all it will hold (its prompt and every
        # output but the last), so none is ever preempted (TensorRT-LLM's default capacity
        # policy, GUARANTEED_NO_EVICT); False: pages as it grows, preemption by recompute (vLLM)
        self.reserve = reserve
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0

    def add(self, request: Request) -> None:
        self.check(request)
        self.waiting.append(request)

    def check(self, request: Request) -> None:
        """A request the pool could never hold is refused by name."""
        # its KV at the end: the prompt and all outputs but the last (never computed)
        need = self.pool.pages_for(request.prompt_len + request.output_len - 1)
        longest = request.prompt_len + request.output_len - 1  # a recompute after preemption
        if not self.chunked_prefill and longest > self.token_budget:
            raise KvjaxError(
                f"request {request.id}: {request.prompt_len} + {request.output_len} tokens may be "
                f"prefilled whole ({longest} after a preemption) but token_budget="
                f"{self.token_budget} without chunked prefill: raise the budget to {longest}"
            )
        if need > self.pool.num_pages:
            raise KvjaxError(
                f"request {request.id}: {request.prompt_len} + {request.output_len} tokens need "
                f"{need} pages of {self.pool.page_size}; the pool has {self.pool.num_pages}: it "
                "can never be served"
            )

    def _grow(self, r: Request, tokens: int) -> bool:
        """Pages for r's next `tokens`; False when the pool has too few."""
        need = self.pool.pages_for(r.computed + tokens) - len(r.pages)
        if need <= 0:
            return True
        got = self.pool.allocate(need)
        if got is None:
            return False
        r.pages += got
        return True

    def _preempt(self, r: Request) -> None:
        self.pool.release(r.pages)
        r.pages, r.computed, r.transferred = [], 0, 0
        r.preemptions += 1
        self.preemptions += 1
        self.running.remove(r)
        self.waiting.appendleft(r)

    def schedule(self) -> list[Scheduled]:
        """The next step's batch (empty when nothing can run)."""
        budget, out = self.token_budget, []
        preempted, gone = self.preemptions, set()  # ids preempted in this call
        for r in list(self.running):
            if id(r) in gone:  # preempted below for an earlier request
                continue
            tokens = min(r.known - r.computed + self._drafts(r), budget)
            if tokens <= 0:
                continue
            while not self._grow(r, tokens):
                victim = self.running[-1]
                self._preempt(victim)
                gone.add(id(victim))
                if victim is r:
                    break
            if id(r) not in gone:
                out.append(Scheduled(r, tokens, r.computed + tokens))
                budget -= tokens
        if self.preemptions != preempted:  # vLLM v1: no admission in a step that preempted
            return out
        while self.waiting and budget > 0 and len(self.running) < self.max_batch:
            r = self.waiting[0]
            if not self.chunked_prefill and r.known > budget:
                break
            if not self._admit(r, budget):
                break
            self.waiting.popleft()
            self.running.append(r)
            tokens = min(r.known - r.computed, budget)
            out.append(Scheduled(r, tokens, r.computed + tokens))
            budget -= tokens
        return out

    def _drafts(self, r: Request) -> int:
        """Drafted tokens a running request verifies this step: spec_tokens for a decode, no
        more than it has left to generate after this step's own token; none for a prompt."""
        if not self.spec_tokens or r.computed != r.known - 1 or r.generated < 1:
            return 0
        return min(self.spec_tokens, r.output_len - r.generated - 1)

    def _admit(self, r: Request, budget: int) -> bool:
        """Pages for a waiting request: its prompt's cached leading pages (never the whole
        prompt: its last token is computed to sample from), then fresh ones for this step."""
        hit: list[int] = []
        if self.prefix_caching:
            full = (r.prompt_len - 1) // self.pool.page_size
            hashes = [r.page_hash(i, self.pool.page_size) for i in range(full)]
            hit = self.pool.cached_prefix(hashes)
        self.pool.take(hit)
        r.pages, r.computed = list(hit), max(len(hit) * self.pool.page_size, r.transferred)
        tokens = min(r.known - r.computed, budget)
        whole = r.prompt_len + r.output_len - 1 - r.computed  # the reserve policy's pages
        if not self._grow(r, whole if self.reserve else tokens):
            self.pool.release(r.pages)
            r.pages, r.computed = [], 0
            return False
        r.cached_tokens += len(hit) * self.pool.page_size
        if self.prefix_caching:  # counted once the admission holds (not per attempt)
            self.pool.count_lookup(full, len(hit), resumed=r.preemptions > 0)
        return True

    def finish_step(self, batch: list[Scheduled], now_s: float) -> list[Request]:
        """After the clock ran `batch`: advance each request, sample where all it knows is
        computed, register full prompt pages in the prefix cache, free finished requests."""
        finished = []
        for s in batch:
            r = s.request
            before = r.computed
            drafts = before + s.tokens - r.known  # > 0: a speculative decode's drafts
            if drafts > 0:  # the drafts kept: up to the first rejected
                kept = 0
                while kept < drafts and self._draws.random() < self.acceptance:
                    kept += 1
                r.generated += kept
                r.token_times += [now_s] * kept
                s = Scheduled(r, s.tokens - drafts + kept, s.context)
            r.computed += s.tokens
            if self.prefix_caching:  # prompt pages this step filled
                P = self.pool.page_size
                for i in range(before // P, min(r.computed, r.prompt_len) // P):
                    self.pool.register(r.pages[i], r.page_hash(i, P))
            if r.computed == r.known:
                r.generated += 1
                r.token_times.append(now_s)
                if r.done:
                    r.finish_s = now_s
                    self.pool.release(r.pages)
                    r.pages = []
                    self.running.remove(r)
                    finished.append(r)
        return finished
