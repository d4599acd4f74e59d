"""Pipeline parallelism: the L layers split into pp stages of consecutive layers (the
first L mod pp stages one layer more, as vLLM's and TensorRT-LLM's default partition), the
embedding table on the first stage, the final norm and the LM head on the last; each stage
tp-way tensor parallel inside (`kvjax.analytic.parallel.device_config`).

Per stage and device: the weights it holds, the KV cache of its layers, and its share of a
step's FLOPs and bytes; between consecutive stages each step sends its M activations, M x D in
the compute dtype (a device of stage s to its peer of stage s + 1). With m micro-batches in
flight (in-flight batching keeps pp of them: one a stage) a step's period is its slowest stage
and a token's latency the sum of the stages; with fewer, the pipeline idles (pp - 1) / (m + pp -
1) of the time (the bubble)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvjax import kernels
from kvjax.analytic.costs import Workload
from kvjax.analytic.params import param_counts, weight_bytes
from kvjax.analytic.sizes import kv_cache_bytes
from kvjax.analytic.step import step_kernels
from kvjax.dtypes import DTYPE_BYTES
from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig

ENDS = {kernels.EMBED: 0, kernels.NORM_FINAL: -1, kernels.LM_HEAD: -1}  # the stage holding each


@dataclass(frozen=True)
class Stage:
    index: int
    layers: int
    weight_bytes: float  # one device's (tp-way inside the stage)
    kv_cache_bytes: float  # one device's, at the workload
    flops: float  # one device's share of the step
    bytes: float

    def to_dict(self) -> dict:
        return asdict(self)


def stage_layers(cfg: ModelConfig, pp: int) -> list[int]:
    """Layers a stage: L // pp each, the first L mod pp one more; refused where a stage would
    hold none, or where layers differ (a stage's cost would depend on which it holds)."""
    if isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
        raise KvjaxError(f"pp={pp!r} must be a positive integer")
    if pp > cfg.num_layers:
        raise KvjaxError(f"pp={pp} exceeds num_layers={cfg.num_layers}: a stage holds a layer")
    kinds = {
        (cfg.layer_is_sliding(i), cfg.layer_is_moe(i), cfg.layer_has_rope(i), cfg.layer_kind(i))
        for i in range(cfg.num_layers)
    }
    if pp > 1 and len(kinds) > 1:
        raise KvjaxError(
            f"{cfg.name}: pp={pp} needs layers of one kind (this model mixes {len(kinds)}: "
            "sliding, MoE, RoPE or state layers); allowed: pp=1"
        )
    q, r = divmod(cfg.num_layers, pp)
    return [q + (i < r) for i in range(pp)]


def stages(cfg: ModelConfig, pp: int, wl: Workload, device_cfg: ModelConfig | None = None):
    """Each stage's `Stage` for the workload; `device_cfg`: one device's shapes (tp inside)."""
    dev = device_cfg or cfg
    split = stage_layers(cfg, pp)
    counts = param_counts(dev)
    per_elt = dev.weight_bytes_per_element
    ends = {name: counts.get(name, 0) * per_elt for name in ENDS}
    body = weight_bytes(dev) - sum(ends.values())  # the layers', in equal parts
    whole = step_kernels(dev, wl)
    end_cost = {n: whole[n] for n in ENDS if n in whole}
    out = []
    for i, n in enumerate(split):
        held = [name for name, at in ENDS.items() if at % pp == i]
        mine = step_kernels(dev.replace(num_layers=n), wl)
        flops = sum(k.flops for name, k in mine.items() if name not in ENDS)
        nbytes = sum(k.bytes for name, k in mine.items() if name not in ENDS)
        flops += sum(end_cost[name].flops for name in held if name in end_cost)
        nbytes += sum(end_cost[name].bytes for name in held if name in end_cost)
        out.append(
            Stage(
                i,
                n,
                body * n / cfg.num_layers + sum(ends[k] for k in held),
                kv_cache_bytes(dev.replace(num_layers=n), wl.context, wl.batch),
                flops,
                nbytes,
            )
        )
    return out


def stage_message_bytes(cfg: ModelConfig, wl: Workload) -> float:
    """What a step sends across each stage boundary: its M tokens' activations, M x D."""
    return wl.tokens * cfg.d_model * DTYPE_BYTES[cfg.compute_dtype]


def bubble_fraction(pp: int, micro_batches: int) -> float:
    """The share of time a pipeline of pp stages idles with m micro-batches in flight."""
    return (pp - 1) / (micro_batches + pp - 1)


def pipeline_report(cfg: ModelConfig, wl: Workload, chip, pp: int, tp: int = 1) -> dict:
    """`kvjax calc --pp`: each stage's weights, cache and bound on one device, the bytes a step
    sends between stages and their time over the link; the step's period (its slowest stage,
    with micro-batches in flight) and its latency through all stages."""
    from kvjax.analytic import roofline
    from kvjax.analytic.parallel import device_config

    dev = device_config(cfg, tp) if tp > 1 else cfg
    peak, bw = chip.peak(cfg.peak_dtype), chip.bandwidth_bytes_per_s
    out = [
        st.to_dict() | {"bound_s": roofline.bound_time_s(st.flops, st.bytes, peak, bw)}
        for st in stages(cfg, pp, wl, dev)
    ]
    message = stage_message_bytes(cfg, wl) / tp  # each device sends its share of the rows
    link = chip.interconnect_bytes_per_s
    hop = message / link if link else None
    return {
        "pp": pp,
        "tp": tp,
        "devices": pp * tp,
        "stages": out,
        "weight_bytes_per_device": max(st["weight_bytes"] for st in out),
        "stage_message_bytes": message,
        "stage_link_s": hop,
        "period_s": max(st["bound_s"] for st in out),
        "latency_s": sum(st["bound_s"] for st in out) + (pp - 1) * (hop or 0.0),
        "bubble_with_one_micro_batch": bubble_fraction(pp, 1),
    }
