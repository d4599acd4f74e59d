"""One device's share of a step under a placement (`kvjax.analytic.parallel.Placement`): the
shard's weights, cache and activations, the step's FLOPs and bytes, the collectives it sends, and
the bound, compute, memory and the link overlapped (the larger), with the serial schedule beside
it: what `kvjax calc --tp/--ep/--dp-attention` and `kvjax trace --sharded` report per device.
Pure Python."""

from __future__ import annotations

from dataclasses import dataclass

from kvjax.analytic import roofline
from kvjax.analytic.costs import Workload
from kvjax.analytic.parallel import (
    Placement,
    collective_hops_per_step,
    device_config,
    device_workload,
    kv_replication,
    placed_collectives,
    placed_weight_bytes,
)
from kvjax.analytic.sizes import activation_bytes, kv_cache_bytes
from kvjax.analytic.step import step_cost
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig


@dataclass(frozen=True)
class PlacementPoint:
    """One device's share of a step under a placement: its shard's sizes, its step's FLOPs and
    bytes, the collectives it sends, the bound (compute, memory and link overlapped) and the
    serial schedule beside it, and whether it fits the chip's memory."""

    tp: int
    kv_heads_per_device: int
    kv_replication: float
    weight_bytes_per_device: int
    kv_cache_bytes_per_device: int
    step_flops_per_device: float
    step_bytes_per_device: float
    collective_bytes_per_step: float
    collective_hops_per_step: int
    link_latency_s: float  # per message, as given (0: bandwidth only)
    compute_memory_floor_s: float
    link_s: float | None
    step_floor_s: float | None
    fits_in_memory: bool | None
    ep: int = 1
    dp_attention: int = 1
    devices: int = 1
    activation_bytes_per_device: int = 0
    collectives: dict | None = None  # kind -> count, bytes_per_device
    serial_step_s: float | None = None  # collectives after compute (a schedule, not the bound)

    @property
    def per_device(self) -> dict[str, int]:
        return {
            "weight_bytes": self.weight_bytes_per_device,
            "kv_cache_bytes": self.kv_cache_bytes_per_device,
            "activation_bytes": self.activation_bytes_per_device,
        }

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return {**asdict(self), "per_device": self.per_device}


def tensor_parallel_point(
    cfg: ModelConfig, tp: int, wl: Workload, chip: ChipSpec, link_latency_s: float = 0.0
) -> PlacementPoint:
    """One device's share of a step on `tp` chips (`placement_point` with tp alone)."""
    return placement_point(cfg, Placement(tp=tp), wl, chip, link_latency_s)


def placement_point(
    cfg: ModelConfig,
    pl: Placement,
    wl: Workload,
    chip: ChipSpec,
    link_latency_s: float = 0.0,
    capacity_factor: float | None = None,
) -> PlacementPoint:
    """One device's share of a step under `pl`; the bound overlaps compute and the link
    (the larger: `step_floor_s`), the serial one `serial_step_s`. The link: bytes / bandwidth,
    plus `link_latency_s` a message (rings: 2 (tp-1) an all-reduce, tp-1 an all-gather, ep-1 an
    all-to-all; no preset has a sourced value: default 0). `wl` is the whole batch."""
    if not isinstance(link_latency_s, (int, float)) or link_latency_s < 0:
        raise KvjaxError(f"link_latency_s={link_latency_s!r} must be a number >= 0 (seconds)")
    dev = device_config(cfg, pl.tp)
    dev_wl = device_workload(cfg, pl, wl)
    step = step_cost(dev, dev_wl)
    peak, bw = chip.peak(cfg.peak_dtype), chip.bandwidth_bytes_per_s
    floor = roofline.bound_time_s(step.flops, step.bytes, peak, bw)
    colls = placed_collectives(cfg, pl, wl, capacity_factor)
    coll = sum(c["bytes_per_device"] for c in colls.values())
    link = chip.interconnect_bytes_per_s
    hops = collective_hops_per_step(cfg, pl.tp) + (
        colls["all-to-all"]["count"] * (pl.ep - 1) if "all-to-all" in colls else 0
    )
    many = pl.devices > 1
    link_s = (coll / link + hops * link_latency_s) if (link and many) else (None if many else 0.0)
    weights = placed_weight_bytes(cfg, pl)
    kv = kv_cache_bytes(dev, dev_wl.context, dev_wl.batch)
    act = activation_bytes(dev, dev_wl)
    return PlacementPoint(
        tp=pl.tp,
        kv_heads_per_device=1 if cfg.is_mla else dev.num_kv_heads,  # MLA: the one latent
        kv_replication=kv_replication(cfg, pl.tp),
        weight_bytes_per_device=weights,
        kv_cache_bytes_per_device=kv,
        step_flops_per_device=step.flops,
        step_bytes_per_device=step.bytes,
        collective_bytes_per_step=coll,
        collective_hops_per_step=hops,
        link_latency_s=float(link_latency_s),
        compute_memory_floor_s=floor,
        link_s=link_s,
        step_floor_s=None if link_s is None else max(floor, link_s),
        serial_step_s=None if link_s is None else floor + link_s,
        fits_in_memory=None if not chip.memory_bytes else weights + kv + act <= chip.memory_bytes,
        ep=pl.ep,
        dp_attention=pl.dp_attention,
        devices=pl.devices,
        activation_bytes_per_device=act,
        collectives=colls,
    )
