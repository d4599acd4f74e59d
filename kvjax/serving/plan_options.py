"""What `kvjax plan` searches (`kvjax.serving.plan` runs the search): the workload and its SLO
(`Traffic`), and the options for N chips: every placement that splits them (tensor and pipeline
parallel copies, experts over data-parallel attention groups, replicas), and prefill and decode
apart (xP + yD instances of tp chips each, the prompt's cache over the link), each with a KV dtype
and an engine batch (`Option`).

Tensor parallelism stays inside a node (at most 8 chips, and the node's chips); an instance of a
disaggregated option too, its KV crossing the node's link (NVLink) on one node, the given link
between nodes on several.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig
from kvjax.serving.deployment import Placement

PLAN_REQUESTS = 100  # requests a replica serves in a refined option's run
TP_MAX = 8  # tensor parallel within one node's NVLink (or ICI) domain
SHARES = 8  # a disaggregated option's prefill instances: every eighth of the instances


@dataclass(frozen=True)
class Traffic:
    """The workload: fixed prompt and output lengths, at a rate, a concurrency, or (neither) the
    highest rate the SLO holds at; the SLO at a percentile of requests (MLPerf's P99)."""

    prompt_len: int
    output_len: int
    rate: float | None = None
    concurrency: int | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    percentile: float = 99.0
    requests: int = PLAN_REQUESTS

    def __post_init__(self) -> None:
        if self.rate is not None and self.concurrency is not None:
            raise KvjaxError("give --rate or --concurrency, not both (neither: the SLO's rate)")
        if self.rate is None and self.concurrency is None and not self.has_slo:
            raise KvjaxError(
                "with neither --rate nor --concurrency the plan serves the highest rate an SLO "
                "holds at: give --slo-ttft and/or --slo-tpot"
            )
        if not 0 < self.percentile <= 100:
            raise KvjaxError(f"slo_percentile={self.percentile!r} must lie in (0, 100]")

    @property
    def has_slo(self) -> bool:
        return self.slo_ttft_s is not None or self.slo_tpot_s is not None

    def meets(self, ttft_s: float, tpot_s: float) -> bool:
        return (self.slo_ttft_s is None or ttft_s <= self.slo_ttft_s) and (
            self.slo_tpot_s is None or tpot_s <= self.slo_tpot_s
        )


@dataclass(frozen=True)
class Option:
    """One configuration: a placement of the chips, the cache's dtype, the engine's batch;
    disaggregated (`instances` = (x, y)), x prefill and y decode instances of the placement's tp
    chips."""

    placement: Placement
    kv_dtype: str
    max_batch: int
    instances: tuple[int, int] | None = None

    @property
    def devices(self) -> int:
        """Chips one replica (disaggregated: one instance) spans."""
        p = self.placement
        return p.tp * p.pp * p.dp_attention

    @property
    def units(self) -> int:
        """Runs one simulation's requests are scaled by: the instances of the busier kind."""
        return max(self.instances) if self.instances else 1

    @property
    def label(self) -> str:
        p = self.placement
        if self.instances:
            x, y = self.instances
            split = f"disagg {x}P+{y}D tp{p.tp}"
        elif p.ep > 1:
            split = f"ep{p.ep} dp-attn{p.dp_attention} x{p.replicas}"
        else:
            split = f"tp{p.tp} pp{p.pp} x{p.replicas}"
        return f"{split}, kv {self.kv_dtype}, batch {self.max_batch}"


def _sizes(chips: int) -> list[int]:
    return [d for d in (2**i for i in range(12)) if d <= chips and chips % d == 0]


def _check_chips(chips: int, nodes: int) -> int:
    """The chips a node holds (refused by name where they do not split evenly)."""
    for name, value in (("chips", chips), ("nodes", nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KvjaxError(f"{name}={value!r} must be a positive integer")
    if chips % nodes:
        raise KvjaxError(f"chips={chips} do not split over nodes={nodes} evenly")
    return chips // nodes


def placements(cfg: ModelConfig, chips: int, nodes: int = 1) -> list[Placement]:
    """Every split of `chips` into replicas of tp x pp chips (tp <= 8 and within a node, powers of
    two), and for a mixture of experts into replicas of D data-parallel attention groups with the
    experts over them (ep = D, tp = 1)."""
    per_node = _check_chips(chips, nodes)
    sizes = _sizes(chips)
    out = [
        Placement(tp=tp, pp=pp, replicas=chips // (tp * pp))
        for tp in sizes
        if tp <= min(TP_MAX, per_node)
        for pp in sizes
        if chips % (tp * pp) == 0
    ]
    if cfg.is_moe:
        out += [Placement(ep=d, dp_attention=d, replicas=chips // d) for d in sizes if d > 1]
    return out


def disaggregated(chips: int, nodes: int = 1) -> list[tuple[Placement, tuple[int, int]]]:
    """The xP + yD of `chips`: instances of tp chips (tp <= 8, within a node), x + y = n =
    chips / tp, x and y >= 1; x every eighth of n (all of them up to 8 instances)."""
    per_node = _check_chips(chips, nodes)
    out = []
    for tp in _sizes(chips):
        n = chips // tp
        if tp > min(TP_MAX, per_node) or n < 2:
            continue
        shares = sorted({round(k * n / SHARES) for k in range(1, SHARES)} - {0, n})
        out += [(Placement(tp=tp), (x, n - x)) for x in shares]
    return out
