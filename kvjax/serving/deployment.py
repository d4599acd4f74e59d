"""One deployment as the simulator runs it: a model on chips in a placement, an engine's
scheduler settings, a step-time model; it builds its engine copies (each a `Scheduler` over its
share of the KV pool) and its placed step, and serves requests (`Deployment.run`).

`kvjax simulate`, the published systems' predictions (`kvjax.serving.system_predict`) and the
planner build a `Deployment` and call it, so the chain (the device's shard of the model, the
pool the memory leaves, the copies, the placement's collectives) is written once, here.

The copies: pp micro-batches in flight (each over 1/pp of the largest stage's cache), or one per
data-parallel attention group, times the replicas behind a router (`kvjax.serving.placed`,
`kvjax.serving.router`); disaggregated, x prefill instances and y decode instances of tp chips
each with the prompt's cache moved over the link between (`kvjax.serving.disagg`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig
from kvjax.serving import placed
from kvjax.serving.memory import KvPool, kv_pool, whole_prefill_reason
from kvjax.serving.pages import PagePool
from kvjax.serving.router import ROUTES, closed_loop, simulate_replicas
from kvjax.serving.scheduler import Request, Scheduler
from kvjax.serving.simulate import SimulationResult

PAGE_SIZE = 16  # tokens a page when none is given: vLLM's default block size


@dataclass(frozen=True)
class Placement:
    """How one deployment's chips split the model: tensor parallel inside each copy, pipeline
    stages, expert parallelism over data-parallel attention groups (tp = 1), whole replicas."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp_attention: int = 1
    replicas: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep", "dp_attention", "replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KvjaxError(f"{name}={value!r} must be a positive integer")

    @property
    def copies(self) -> int:
        """Engine copies a replica runs: pp micro-batches in flight, or the attention groups."""
        return self.pp * self.dp_attention

    @property
    def chips(self) -> int:
        return self.tp * self.pp * self.dp_attention * self.replicas


@dataclass(frozen=True)
class EngineSettings:
    """An engine's scheduler: the most requests running, the tokens a step, the page, the share
    of the chip's memory it takes (`memory_utilization`) and of the pool's pages it hands out
    (`cache_fraction`: TensorRT-LLM's kv_cache_free_gpu_mem_fraction), admission (`reserve`: a
    request's whole cache at admission, else preemption by recompute), prefix caching, the
    drafted tokens a step and their acceptance, and the router over replicas."""

    max_batch: int = 256
    token_budget: int = 2048
    page_size: int = PAGE_SIZE
    memory_utilization: float = 0.9
    cache_fraction: float = 1.0
    reserve_bytes: float | None = None  # None: `memory.engine_reserve_bytes(chip)`
    reserve: bool = False
    prefix_caching: bool = True
    chunked_prefill: bool = True
    spec_tokens: int = 0
    acceptance: float = 0.0
    route: str = "round-robin"

    def __post_init__(self) -> None:
        if self.route not in ROUTES:
            raise KvjaxError(f"route={self.route!r} is not supported; allowed: {', '.join(ROUTES)}")
        if not 0 < self.cache_fraction <= 1:
            raise KvjaxError(f"cache_fraction={self.cache_fraction!r} must lie in (0, 1]")


@dataclass(frozen=True)
class Deployment:
    """A model on a chip, placed, on an engine's settings, its steps timed by `step_model`
    (called with one device's model and the chip) for requests of at most `longest` tokens.
    `achieved`: the placement's collectives as engines reach them (a prediction), else at the
    link's line rate (a bound); `weight_scale`: the weights' bytes against the config's dtype
    (NVFP4 weights on an fp8 config)."""

    model: ModelConfig
    chip: ChipSpec
    longest: int
    placement: Placement = field(default_factory=Placement)
    engine: EngineSettings = field(default_factory=EngineSettings)
    step_model: Callable[[ModelConfig, ChipSpec], Any] | None = None
    achieved: bool = False
    weight_scale: float = 1.0

    @property
    def whole_prefill(self) -> str | None:
        """Why prompts are prefilled whole (no closed-form extend for the model's sliding-window
        or state layers), None where chunked prefill runs."""
        return whole_prefill_reason(self.model)

    @property
    def chunked(self) -> bool:
        """Prompts prefilled in chunks of the token budget (the engine's, where the model's
        layers allow it)."""
        return self.engine.chunked_prefill and not self.whole_prefill

    @property
    def token_budget(self) -> int:
        """The engine's tokens a step, raised to the longest request where prompts are
        prefilled whole (as an engine without chunked prefill runs)."""
        b = self.engine.token_budget
        return b if self.chunked else max(b, self.longest - 1)

    @cached_property
    def devices(self) -> tuple[ModelConfig, ModelConfig]:
        """(one device's model for its step, the model whose weights and cache it holds)."""
        p = self.placement
        return placed.device_configs(self.model, p.tp, p.pp, p.ep)

    @cached_property
    def pool(self) -> KvPool:
        """The KV pool one device's memory leaves (refused, with the bytes, where none)."""
        e = self.engine
        return kv_pool(
            self.devices[1],
            self.chip,
            e.page_size,
            self.token_budget,
            self.longest,
            e.memory_utilization,
            reserve_bytes=e.reserve_bytes,
            max_batch=e.max_batch,
            weight_scale=self.weight_scale,
        )

    @property
    def pages_per_copy(self) -> int:
        return int(self.engine.cache_fraction * self.pool.pages) // self.placement.pp

    @cached_property
    def step(self):
        """One device's step on the placement, with its collectives (built once: its caches
        serve every run)."""
        if self.step_model is None:
            raise KvjaxError("a deployment needs a step_model to time its steps")
        p = self.placement
        inner = self.step_model(self.devices[0], self.chip)
        return placed.placed_step(
            inner, self.model, self.chip, p.tp, p.pp, p.ep, achieved=self.achieved
        )

    def scheduler(self) -> Scheduler:
        """One engine copy, fresh."""
        e, whole = self.engine, self.whole_prefill
        return Scheduler(
            PagePool(self.pages_per_copy, self.pool.page_size),
            e.max_batch,
            self.token_budget,
            prefix_caching=e.prefix_caching and not whole,
            chunked_prefill=self.chunked,
            reserve=e.reserve,
            spec_tokens=e.spec_tokens,
            acceptance=e.acceptance,
        )

    def schedulers(self) -> list[Scheduler]:
        """Every copy of every replica, fresh."""
        return [self.scheduler() for _ in range(self.placement.copies * self.placement.replicas)]

    def run(
        self, requests: list[Request], factor: float = 1.0, concurrency: int | None = None
    ) -> SimulationResult:
        """The requests served by the copies behind the engine's router, each step `factor`
        times as long (a prediction's interval ends); at their arrivals, or (`concurrency`) by a
        closed loop of that many clients (`router.closed_loop`)."""
        step = self.step if factor == 1 else placed.Scaled(self.step, factor)
        if concurrency is not None:
            return closed_loop(requests, self.schedulers(), step, concurrency, self.engine.route)
        return simulate_replicas(requests, self.schedulers(), step, self.engine.route)

    def run_disaggregated(
        self,
        requests: list[Request],
        link_bytes_per_s: float,
        latency_s: float = 0.0,
        instances: tuple[int, int] = (1, 1),
        factor: float = 1.0,
    ) -> SimulationResult:
        """Prefill on `instances[0]` instances, decode on `instances[1]` (xP + yD), each on the
        placement's tp chips, the prompt's cache over a link of `link_bytes_per_s` a chip
        between them (each chip moves its shard), each step `factor` times as long."""
        from kvjax.serving.disagg import kv_transfer_s, simulate_disaggregated

        p = self.placement
        if (p.pp, p.ep, p.dp_attention, p.replicas) != (1, 1, 1, 1):
            raise KvjaxError(
                "a disaggregated deployment runs instances of --tp chips (no "
                "--pp/--ep/--dp-attention/--replicas: give the instances as xPyD)"
            )
        x, y = instances
        if min(x, y) < 1:
            raise KvjaxError(f"instances={instances!r}: at least one prefill and one decode")
        decode = replace(
            self.engine, prefix_caching=False, reserve=False, spec_tokens=0, acceptance=0.0
        )
        decode = replace(self, engine=decode)
        step = self.step if factor == 1 else placed.Scaled(self.step, factor)
        move = kv_transfer_s(self.pool.bytes_per_token, link_bytes_per_s, latency_s)
        return simulate_disaggregated(
            requests,
            [self.scheduler() for _ in range(x)],
            [decode.scheduler() for _ in range(y)],
            step,
            step,
            move,
        )


def fewest_tensor_parallel(d: Deployment) -> tuple[Deployment, str | None]:
    """`d` where one chip holds its weights; else on the fewest of 2, 4, 8 tensor-parallel chips
    whose pool holds its engine's max batch of the longest requests at once (else the fewest
    that hold any), as `kvjax frontier` chooses, with why in words."""
    from kvjax.analytic.params import weight_bytes

    held = d.chip.memory_bytes is not None and (
        weight_bytes(d.model) < d.engine.memory_utilization * d.chip.memory_bytes
    )
    if held or d.chip.memory_bytes is None:
        return d, None
    first = None
    for tp in (2, 4, 8):
        option = replace(d, placement=replace(d.placement, tp=tp))
        try:
            tokens = option.pool.tokens
        except KvjaxError:
            if tp == 8 and first is None:
                raise
            continue
        first = first or option
        if tokens >= d.engine.max_batch * d.longest:
            first = option
            break
    note = (
        f"no --tp given and one {d.chip.name} cannot hold the weights: "
        f"tp={first.placement.tp}, the fewest of 2, 4, 8 whose pool holds --max-batch "
        f"{d.engine.max_batch} requests of {d.longest} tokens (or any)"
    )
    return first, note
