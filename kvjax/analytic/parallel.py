"""Closed forms of Megatron-style tensor parallelism over `tp` devices. Pure Python.

Query heads are split evenly over the devices (tp must divide N); device d holds query heads
[d*N/tp, (d+1)*N/tp) and every KV head those heads read (head n reads KV head n // G). When
tp > K each KV head is therefore replicated on tp/K devices, and GQA/MQA save less per device
than the single-device table says. The MLP is split over d_ff (column then row parallel), the
embedding and LM head over the vocabulary. Each layer ends its attention and its MLP with an
all-reduce of the [B*T, D] activations; a ring all-reduce of X bytes sends and receives
2 (tp - 1) / tp * X bytes per device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvjax.analytic import roofline
from kvjax.analytic.costs import SCORE_BYTES, Workload
from kvjax.analytic.sizes import kv_cache_bytes, weight_bytes
from kvjax.analytic.step import step_cost
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import DTYPE_BYTES, ModelConfig


def kv_heads_per_device(cfg: ModelConfig, tp: int) -> int:
    """KV heads one device must hold (the most over devices), replication included."""
    _check_tp(cfg, tp)
    n_dev, g = cfg.num_heads // tp, cfg.group_size
    return max(len({n // g for n in range(d * n_dev, (d + 1) * n_dev)}) for d in range(tp))


def kv_replication(cfg: ModelConfig, tp: int) -> float:
    """Copies of each KV head across the devices (1 = none); MLA's latent, on every device: tp."""
    if cfg.is_mla:
        _check_tp(cfg, tp)
        return float(tp)
    return kv_heads_per_device(cfg, tp) * tp / cfg.num_kv_heads


def _check_tp(cfg: ModelConfig, tp: int) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp <= 0:
        raise KvjaxError(f"tp={tp!r} must be a positive integer")
    if cfg.num_heads % tp:
        allowed = [t for t in range(1, cfg.num_heads + 1) if cfg.num_heads % t == 0]
        raise KvjaxError(
            f"tp={tp} does not divide num_heads={cfg.num_heads}; allowed tp: "
            f"{', '.join(map(str, allowed))}"
        )
    if cfg.d_ff % tp:
        raise KvjaxError(f"tp={tp} does not divide d_ff={cfg.d_ff}")


def device_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    """The shapes one device computes: N/tp query heads, its KV heads, d_ff/tp, vocab/tp.

    MLA: the query and KV up-projections and o_proj split by head (N/tp heads a device), while
    the latent down-projection and the latent cache have no heads to split: every device holds
    them whole (kv_lora_rank and the RoPE key unchanged), so the latent cache per device equals
    the unsharded one (SGLang's reason for data-parallel attention)."""
    if cfg.is_mla:
        _check_tp(cfg, tp)
        n_dev = k_dev = cfg.num_heads // tp
    else:
        n_dev, k_dev = cfg.num_heads // tp, kv_heads_per_device(cfg, tp)
    if n_dev % k_dev:
        raise KvjaxError(
            f"tp={tp}: {n_dev} query heads over {k_dev} KV heads per device are uneven groups, "
            "which kvjax does not model"
        )
    experts = {}
    if cfg.is_moe:  # every expert's width split (the router replicated), as vLLM's MoE TP
        if cfg.moe_d_ff % tp:
            raise KvjaxError(
                f"tp={tp} does not divide moe_d_ff={cfg.moe_d_ff}: each expert's width is split "
                f"over the devices"
            )
        experts = {"moe_d_ff": cfg.moe_d_ff // tp}
        if cfg.shared_expert_d_ff:  # a shared expert of its own width, split likewise
            if cfg.shared_expert_d_ff % tp:
                raise KvjaxError(
                    f"tp={tp} does not divide shared_expert_d_ff={cfg.shared_expert_d_ff}"
                )
            experts["shared_expert_d_ff"] = cfg.shared_expert_d_ff // tp
    return cfg.replace(
        num_heads=n_dev,
        num_kv_heads=k_dev,
        d_ff=cfg.d_ff // tp,
        vocab_size=math.ceil(cfg.vocab_size / tp),
        name=f"{cfg.name}/tp{tp}",
        **experts,
    )


def weight_bytes_per_device(cfg: ModelConfig, tp: int) -> int:
    """Sharded matrices, replicated KV projections where heads are replicated, norms whole."""
    dev = device_config(cfg, tp)
    return weight_bytes(dev)


def kv_cache_bytes_per_device(cfg: ModelConfig, tp: int, context: int, batch: int = 1) -> int:
    return kv_cache_bytes(device_config(cfg, tp), context, batch)


def allreduce_bytes_per_device(message_bytes: float, tp: int) -> float:
    """Bytes one device sends (and receives) in a ring all-reduce of `message_bytes`."""
    return 2 * (tp - 1) / tp * message_bytes


def collective_bytes_per_step(cfg: ModelConfig, tp: int, wl: Workload) -> float:
    """Per device per step: 2 all-reduces a layer (after o_proj and after down) of M x D, the
    embedding's all-reduce, and the all-gather of the vocab-sharded f32 logits."""
    if tp == 1:
        return 0.0
    a = DTYPE_BYTES[cfg.compute_dtype]
    act = wl.tokens * cfg.d_model * a
    logits = wl.tokens * math.ceil(cfg.vocab_size / tp) * tp * SCORE_BYTES
    counts = collective_counts_per_step(cfg, tp)
    return (
        counts["all-reduce"] * allreduce_bytes_per_device(act, tp)
        + counts["all-gather"] * (tp - 1) / tp * logits  # ring all-gather
    )


def collective_counts_per_step(cfg: ModelConfig, tp: int) -> dict[str, int]:
    """Collectives per step: an all-reduce after each layer's attention and MLP and one for the
    vocab-split embedding, one all-gather of the logits."""
    if tp == 1:
        return {}
    return {"all-reduce": 2 * cfg.num_layers + 1, "all-gather": 1}


def collective_hops_per_step(cfg: ModelConfig, tp: int) -> int:
    """Sequential messages one device sends per step with ring algorithms: 2 (tp - 1) per
    all-reduce, tp - 1 per all-gather. Times a per-message latency this is the link term's
    latency part (bandwidth alone hides it at large tp)."""
    hops = {"all-reduce": 2 * (tp - 1), "all-gather": tp - 1}
    return sum(n * hops[kind] for kind, n in collective_counts_per_step(cfg, tp).items())


@dataclass(frozen=True)
class TensorParallelPoint:
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

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def tensor_parallel_point(
    cfg: ModelConfig, tp: int, wl: Workload, chip: ChipSpec, link_latency_s: float = 0.0
) -> TensorParallelPoint:
    """One device's share of a step on `tp` chips, and the step floor with the link term (the
    collectives are counted after compute, not overlapped): bytes / link bandwidth, plus
    `link_latency_s` per ring message when given (no preset has a sourced value: default 0)."""
    if not isinstance(link_latency_s, (int, float)) or link_latency_s < 0:
        raise KvjaxError(f"link_latency_s={link_latency_s!r} must be a number >= 0 (seconds)")
    dev = device_config(cfg, tp)
    step = step_cost(dev, wl)
    peak, bw = chip.peak(cfg.compute_dtype), chip.bandwidth_bytes_per_s
    floor = roofline.bound_time_s(step.flops, step.bytes, peak, bw)
    coll = collective_bytes_per_step(cfg, tp, wl)
    link = chip.interconnect_bytes_per_s
    hops = collective_hops_per_step(cfg, tp)
    link_s = (
        (coll / link + hops * link_latency_s) if (link and tp > 1) else (0.0 if tp == 1 else None)
    )
    weights = weight_bytes(dev)
    kv = kv_cache_bytes(dev, wl.context, wl.batch)
    return TensorParallelPoint(
        tp=tp,
        kv_heads_per_device=1 if cfg.is_mla else dev.num_kv_heads,  # MLA: the one latent
        kv_replication=kv_replication(cfg, tp),
        weight_bytes_per_device=weights,
        kv_cache_bytes_per_device=kv,
        step_flops_per_device=step.flops,
        step_bytes_per_device=step.bytes,
        collective_bytes_per_step=coll,
        collective_hops_per_step=hops,
        link_latency_s=float(link_latency_s),
        compute_memory_floor_s=floor,
        link_s=link_s,
        step_floor_s=None if link_s is None else floor + link_s,
        fits_in_memory=None if chip.memory_bytes is None else weights + kv <= chip.memory_bytes,
    )
