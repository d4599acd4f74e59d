"""The serving engine: kvjax's scheduler (`kvjax.serving.scheduler`, the simulator's own) driven by
the wall clock, running kvjax's Flax model on this machine. Each step: the scheduler builds the
batch; every one-token entry (a decode, or a prompt chunk of one) runs in one decode over all
`max_batch` slots; every longer prompt chunk runs as the model's `extend` on its own slot.

The KV cache is slotted, not paged: one `KVCache` of `max_batch` slots x `max_len` positions. A
request takes a free slot when admitted and gives it back when it finishes or is preempted. The
scheduler's `PagePool` still decides admission and preemption (its pages are the slots' capacity,
or fewer with `kv_pool_tokens`). Prefix caching is off: slots do not share rows.

Shapes are fixed, so nothing compiles after the warm-up:
- decode = attend over all slots (cache read only, positions from the host; inactive slots'
  positions are not advanced, a free slot's is 0), then a separate donated append of the rows
  (DESIGN.md: on XLA:CPU attending and writing in one jit copied the cache);
- a chunk of T tokens is padded to a bucket (powers of two up to the token budget, and the budget):
  its slot is sliced out of the cache, extended (the padding rows written past the valid ones,
  which no valid query sees: the mask is causal), and written back by a donated jit; the slot's
  position becomes pos + T. Rows past `max_len` are dropped by the scatter.
`compilations` counts the Python traces of the jitted functions: every shape is traced once in
the warm-up, before the first arrival.

Sampling is greedy. Time is `time.perf_counter()` from the engine's start (arrivals are relative
to it; when idle, the engine sleeps until the next arrival). A step is measured from before the
scheduler builds its batch to after the scheduler's bookkeeping (`finish_step`) of its end: the
scheduler's Python time, the dispatches and `block_until_ready` of the sampled tokens, whose
arrival time (the end of the device work) is each token's time.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass, field

import numpy as np

from kvjax.analytic import Workload
from kvjax.analytic.costs import EXTEND
from kvjax.analytic.sizes import activation_bytes, cache_bytes, weight_bytes
from kvjax.errors import KvjaxError
from kvjax.measured.kernels import check_fits
from kvjax.model.checks import check_extend
from kvjax.model.config import ModelConfig
from kvjax.serving.fitted import bucket_of, buckets_for
from kvjax.serving.pages import PagePool
from kvjax.serving.scheduler import Request, Scheduled, Scheduler
from kvjax.serving.simulate import SimulationResult


@dataclass(frozen=True)
class MeasuredStep:
    batch: tuple[tuple[int, int], ...]  # (tokens, context) per scheduled request
    wall_s: float  # schedule() to finish_step()'s end, device work included
    start_s: float = 0.0  # when it began, seconds from the engine's start


@dataclass
class EngineResult(SimulationResult):
    measured: list[MeasuredStep] = field(default_factory=list)
    compilations_after_warmup: int = 0
    warmup_s: float = 0.0
    outputs: dict[int, list[int]] = field(default_factory=dict)  # request id -> its tokens


def prompt_tokens(r: Request, vocab_size: int, seed: int) -> list[int]:
    """A request's prompt ids, random from (seed, id); a shared prefix from (seed, prefix id)."""
    own = np.random.default_rng([seed, 1, r.id]).integers(0, vocab_size, r.prompt_len)
    if r.prefix_id is None or not r.prefix_len:
        return own.tolist()
    shared = np.random.default_rng([seed, 2, r.prefix_id]).integers(0, vocab_size, r.prefix_len)
    return [*shared.tolist(), *own[r.prefix_len :].tolist()]


def pool_pages(max_batch: int, max_len: int, page_size: int, kv_pool_tokens: int | None) -> int:
    """The scheduler's pages: the slots' capacity, or the smaller pool asked for."""
    pages = max_batch * (max_len // page_size)
    if kv_pool_tokens is not None:
        pages = min(pages, kv_pool_tokens // page_size)
    if pages < 1:
        raise KvjaxError(
            f"kv_pool_tokens={kv_pool_tokens} holds no page of {page_size} tokens "
            f"(max_len={max_len} per slot)"
        )
    return pages


def check_engine(
    cfg: ModelConfig, max_batch: int, max_len: int, token_budget: int, page_size: int
) -> None:
    """What the engine runs: no state layers (their slots are not written), a model with an
    extend step, and positive limits."""
    if cfg.is_hybrid:
        raise KvjaxError(f"{cfg.name}: state layers are not slotted by the engine yet")
    check_extend(cfg, model=True)
    limits = {
        "max_batch": max_batch,
        "max_len": max_len,
        "token_budget": token_budget,
        "page_size": page_size,
    }
    for name, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KvjaxError(f"{name}={value!r} must be a positive integer")


def check_requests(requests: list[Request], max_len: int, sched: Scheduler | None) -> None:
    """Refused before anything runs, by name: a request longer than a slot, or than the pool."""
    for r in requests:
        need = r.prompt_len + r.output_len - 1  # the last output is never computed
        if need > max_len:
            raise KvjaxError(
                f"request {r.id}: {r.prompt_len} + {r.output_len} tokens need {need} "
                f"positions; a slot holds max_len={max_len}: it can never be served"
            )
        if sched is not None:
            sched.check(r)


class Engine:
    """The model with random seeded weights and its slotted cache, compiled and warmed up."""

    def __init__(
        self,
        cfg: ModelConfig,
        max_batch: int,
        max_len: int,
        token_budget: int,
        page_size: int = 16,
        kv_pool_tokens: int | None = None,
        seed: int = 0,
    ):
        from flax import nnx

        from kvjax.measured.engine_steps import slotted_steps
        from kvjax.nn import Transformer

        check_engine(cfg, max_batch, max_len, token_budget, page_size)
        self.cfg, self.max_batch, self.max_len = cfg, max_batch, max_len
        self.token_budget, self.seed = token_budget, seed
        self.buckets = buckets_for(min(token_budget, max_len))
        pages = pool_pages(max_batch, max_len, page_size, kv_pool_tokens)
        self.pool_pages, self.page_size = pages, page_size
        self._check_memory()
        model = Transformer(cfg, rngs=nnx.Rngs(seed))
        graphdef, self.state = nnx.split(model)
        self.cache = model.init_cache(max_batch, max_len)
        self.compilations = 0
        steps = slotted_steps(graphdef, self._count_trace)
        self._attend, self._append, self._extend, self._write = steps
        start = time.perf_counter()
        self._warm_up()
        self.warmup_s = time.perf_counter() - start
        self.warm_compilations = self.compilations

    def _count_trace(self) -> None:
        """Counts a trace of a jitted step: runs only when jax traces (a new shape or dtype)."""
        self.compilations += 1

    def _check_memory(self) -> None:
        """Refused by name when the weights, the slots' cache and the largest step do not fit."""
        import jax

        cfg, max_batch, max_len = self.cfg, self.max_batch, self.max_len
        largest = self.buckets[-1] if self.buckets else 1
        needed = (
            weight_bytes(cfg)
            + cache_bytes(cfg, max_len, max_batch)
            + activation_bytes(cfg, Workload(EXTEND, 1, max_len, new_tokens=largest))
        )
        if jax.default_backend() == "cpu" and cfg.weight_bytes_per_element < 4:
            # XLA:CPU converts narrower dots to f32 (DESIGN.md): a step holds f32 weights too
            needed += weight_bytes(cfg) * 4 / cfg.weight_bytes_per_element
        check_fits(
            f"{cfg.name} with {max_batch} slots of {max_len} (weights + cache + step)", needed
        )

    # -- the two kinds of device work ----------------------------------------------------------
    def _decode(self, tokens_B: np.ndarray, pos_B: np.ndarray):
        import jax.numpy as jnp

        cache = dataclasses.replace(self.cache, pos=jnp.asarray(pos_B, jnp.int32))
        next_B, new_k, new_v = self._attend(self.state, jnp.asarray(tokens_B, jnp.int32), cache)
        self.cache = self._append(cache, new_k, new_v)
        return next_B

    def _chunk(self, slot: int, ids: list[int], pos: int):
        import jax.numpy as jnp

        T = bucket_of(len(ids), self.buckets)
        tokens_1T = np.zeros((1, T), np.int32)
        tokens_1T[0, : len(ids)] = ids
        i32 = np.int32
        token, k_rows, v_rows = self._extend(
            self.state, jnp.asarray(tokens_1T), self.cache, i32(slot), i32(pos), i32(len(ids))
        )
        self.cache = self._write(self.cache, i32(slot), k_rows, v_rows)
        return token

    def _warm_up(self) -> None:
        """Every shape once (decode, each bucket's extend, the write-back) on slot 0 at position
        0; what it writes is overwritten before any request reads it."""
        import jax

        zeros = np.zeros(self.max_batch, np.int32)
        outs = [self._decode(zeros, zeros)]
        outs += [self._chunk(0, [0] * b, 0) for b in self.buckets]
        jax.block_until_ready((outs, self.cache))

    # -- serving -------------------------------------------------------------------------------
    def scheduler(self) -> Scheduler:
        return Scheduler(
            PagePool(self.pool_pages, self.page_size),
            self.max_batch,
            self.token_budget,
            prefix_caching=False,
        )

    def calibration(self) -> list[Request]:
        """This engine's calibration requests (`kvjax.serving.calibrate.plan`), on the step
        clock."""
        from kvjax.serving.calibrate import plan

        return plan(
            self.buckets,
            self.max_batch,
            self.max_len,
            self.token_budget,
            self.pool_pages,
            self.page_size,
        )

    @property
    def features(self) -> tuple[str, ...]:
        """The step model's features its calibration determines (all of them unless the limits
        merge some: `kvjax.serving.calibrate.identifiable`), from the scheduler alone."""
        from kvjax.serving.calibrate import batches, identifiable

        return identifiable(batches(self.calibration(), self.scheduler()), self.buckets)

    def calibrate(self) -> EngineResult:
        """The calibration served on the step clock: the same batches at any speed of the
        machine, every feature of `features` determined by them."""
        return self.serve(self.calibration(), clock="steps")

    def check(self, requests: list[Request], sched: Scheduler) -> None:
        check_requests(requests, self.max_len, sched)

    def serve(
        self, requests: list[Request], sched: Scheduler | None = None, clock: str = "wall"
    ) -> EngineResult:
        """Every request from its arrival (seconds after the start) to its last token; `sched`
        a scheduler of its own (a smaller pool, say) instead of `scheduler()`. With
        `clock="steps"` a request's `arrival_s` counts steps instead (it joins before the step of
        that number is scheduled; when nothing runs, the clock jumps to the next arrival), so the
        batches are the scheduler's alone, the same at any speed of the machine
        (`kvjax.serving.calibrate`); steps and tokens are still timed on the wall clock."""
        if clock not in ("wall", "steps"):
            raise KvjaxError(f"clock={clock!r}; allowed: wall, steps")
        pending = sorted(requests, key=lambda r: (r.arrival_s, r.id))
        if len({r.id for r in pending}) != len(pending):
            raise KvjaxError("request ids must be unique")
        sched = sched or self.scheduler()
        if sched.max_batch > self.max_batch or sched.prefix_caching:
            raise KvjaxError(
                f"the engine's scheduler runs at most max_batch={self.max_batch} requests (its "
                "slots) without prefix caching (slots share no rows)"
            )
        self.check(pending, sched)
        seqs = {r.id: prompt_tokens(r, self.cfg.vocab_size, self.seed) for r in pending}
        outputs: dict[int, list[int]] = {r.id: [] for r in pending}
        occupant: dict[int, Request] = {}  # slot -> the request holding it
        compiled = self.compilations
        gc.collect()  # no collector pause inside a step (vLLM freezes its heap after start-up)
        gc.disable()
        try:
            return self._loop(pending, sched, seqs, outputs, occupant, compiled, clock)
        finally:
            gc.enable()

    def _loop(self, pending, sched, seqs, outputs, occupant, compiled, clock) -> EngineResult:
        import jax

        measured: list[MeasuredStep] = []
        pages: list[tuple[float, int]] = []
        i, done = 0, 0
        t0 = time.perf_counter()
        now, step_clock = 0.0, 0.0  # the wall clock, and (clock="steps") the step clock
        while done < len(pending):
            now = time.perf_counter() - t0
            arrived = now if clock == "wall" else step_clock
            while i < len(pending) and pending[i].arrival_s <= arrived:
                sched.add(pending[i])
                i += 1
            batch = sched.schedule()
            if not batch:
                if i == len(pending):
                    raise KvjaxError(f"{len(sched.waiting)} requests wait and none can run")
                if clock == "steps":
                    step_clock = pending[i].arrival_s
                else:
                    time.sleep(max(0.0, pending[i].arrival_s - (time.perf_counter() - t0)))
                continue
            step_clock += 1
            self._seat(sched, batch, occupant)
            sampled = jax.device_get(self._run(batch, occupant, seqs))  # waits for the device
            end = time.perf_counter() - t0
            for s, token in zip(batch, sampled, strict=True):
                r = s.request
                if r.computed + s.tokens == r.known:  # all it knows computed: one more token
                    outputs[r.id].append(int(token))
                    seqs[r.id].append(int(token))
            finished = {r.id for r in sched.finish_step(batch, end)}
            for slot in [k for k, r in occupant.items() if r.id in finished]:
                del occupant[slot]
            stop = time.perf_counter() - t0
            measured.append(
                MeasuredStep(tuple((s.tokens, s.context) for s in batch), stop - now, now)
            )
            done += len(finished)
            pages.append((stop, sched.pool.used_pages))
        in_system = sum(r.finish_s - r.arrival_s for r in pending)  # the integral, exactly
        return EngineResult(
            pending,
            len(measured),
            sched.preemptions,
            time.perf_counter() - t0,
            sum(m.wall_s for m in measured),
            in_system,
            pages,
            0,
            0,
            measured=measured,
            compilations_after_warmup=self.compilations - compiled,
            warmup_s=self.warmup_s,
            outputs=outputs,
        )

    def _seat(self, sched: Scheduler, batch: list[Scheduled], occupant: dict) -> None:
        """Slots given back by the requests the scheduler preempted, then taken by those it
        admitted (running never exceeds max_batch, the slots)."""
        running = {id(r) for r in sched.running}
        for slot in [k for k, r in occupant.items() if id(r) not in running]:
            del occupant[slot]
        seated = {id(r) for r in occupant.values()}
        free = (k for k in range(self.max_batch) if k not in occupant)
        for s in batch:
            if id(s.request) not in seated:
                occupant[next(free)] = s.request

    def _run(self, batch: list[Scheduled], occupant: dict, seqs) -> list:
        """Dispatch the step: one decode over every slot for the one-token entries, then one
        extend per longer chunk. Returns each entry's sampled token (device values)."""
        slot_of = {id(r): k for k, r in occupant.items()}
        ones = [s for s in batch if s.tokens == 1]
        samples: dict[int, object] = {}
        if ones:
            tokens_B = np.zeros(self.max_batch, np.int32)
            # every held slot at its request's next position: a slot not decoding this step
            # gets a row there that its next step overwrites before reading; a free slot at 0
            pos_B = np.zeros(self.max_batch, np.int32)
            for k, r in occupant.items():
                pos_B[k] = r.computed
            for s in ones:
                tokens_B[slot_of[id(s.request)]] = seqs[s.request.id][s.request.computed]
            next_B = self._decode(tokens_B, pos_B)
            for s in ones:
                samples[id(s)] = next_B[slot_of[id(s.request)]]
        for s in batch:
            if s.tokens > 1:
                r = s.request
                ids = seqs[r.id][r.computed : r.computed + s.tokens]
                samples[id(s)] = self._chunk(slot_of[id(r)], ids, r.computed)
        return [samples[id(s)] for s in batch]
