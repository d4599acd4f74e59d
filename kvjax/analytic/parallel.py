"""Closed forms of a model placed on several devices: Megatron-style tensor parallelism over
`tp` devices, data-parallel attention over `dp_attention` groups and expert parallelism over `ep`
devices with all-to-all dispatch (`placement_point`). Pure Python.

Query heads are split evenly over the devices (tp must divide N); device d holds query heads
[d*N/tp, (d+1)*N/tp) and every KV head those heads read (head n reads KV head n // G). When
tp > K each KV head is therefore replicated on tp/K devices, and GQA/MQA save less per device
than the single-device table says. The MLP is split over d_ff (column then row parallel), the
embedding and LM head over the vocabulary. Each layer ends its attention and its MLP with an
all-reduce of the [B*T, D] activations; a ring all-reduce of X bytes sends and receives
2 (tp - 1) / tp * X bytes per device.

A placement (`Placement`) runs on tp * dp_attention devices: attention, the dense MLPs, the
shared experts and the embeddings run tp-way inside each of dp_attention groups, each group on
B / dp_attention of the batch (its own KV or latent cache: so MLA's latent, whole on every device
under tp, is split by sequence). The routed experts follow the dense MLP (each expert's width
split tp-way, replicated over the groups) when ep = 1, or are spread E / ep a device over all
ep = dp_attention devices (tp = 1: SGLang's DP attention + EP and vLLM's DP + EP, with the dense
parts data parallel as SGLang's moe_dense_tp_size=1) with two all-to-alls a MoE layer: each
device's M_l = M / ep tokens go to their k experts (dispatch) and come back (combine). A
ragged all-to-all (DeepEP, what an engine sends) carries M_l * k * D * a bytes each way, of
which (ep - 1) / ep leave the device under uniform routing; a fixed-shape one (GShard, what
XLA:CPU can run) carries E * C * D * a with C = ceil(cf * M_l * k / E) rows an expert
(`capacity_factor` cf).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kvjax.analytic.costs import SCORE_BYTES, Workload
from kvjax.analytic.moe import expected_experts_touched, expert_matrix_bytes, expert_params
from kvjax.analytic.sizes import kv_cache_bytes, weight_bytes
from kvjax.errors import KvjaxError
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
    if cfg.is_hybrid and tp > 1:
        experts.update(_state_heads_per_device(cfg, tp))
    return cfg.replace(
        num_heads=n_dev,
        num_kv_heads=k_dev,
        d_ff=cfg.d_ff // tp,
        vocab_size=math.ceil(cfg.vocab_size / tp),
        name=f"{cfg.name}/tp{tp}",
        **experts,
    )


def _state_heads_per_device(cfg: ModelConfig, tp: int) -> dict[str, int]:
    """A hybrid's state layers split by head as vLLM's: DeltaNet's value heads and Mamba-2's
    heads (state_heads) tp-way, their q/k heads or B/C groups (state_groups) tp-way, or one a
    device, copied, when tp exceeds them (as KV heads); the conv channels follow."""
    if "C" in cfg.layer_kinds:
        raise KvjaxError(
            f"tp={tp}: splitting LFM2's short-convolution layers (layer_kinds="
            f"{cfg.layer_kinds!r}) over devices is not modelled; use tp=1"
        )
    J, Y = cfg.state_heads, cfg.state_groups
    if J % tp:
        raise KvjaxError(f"tp={tp} does not divide state_heads={J} (the state layers' heads)")
    if Y % tp and tp % Y:
        raise KvjaxError(
            f"tp={tp} and state_groups={Y} do not divide one another (a device would hold part "
            "of a q/k head's or B/C group's heads)"
        )
    return {"state_heads": J // tp, "state_groups": max(1, Y // tp)}


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
    colls = placed_collectives(cfg, Placement(tp=tp), wl)
    return sum(c["bytes_per_device"] for c in colls.values())


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
class Placement:
    """A model on tp * dp_attention devices: tp-way tensor parallel inside each of dp_attention
    groups (attention, dense MLPs, shared experts, embeddings), the routed experts tp-way like
    the dense MLP (ep = 1) or spread over all ep = dp_attention devices (tp = 1)."""

    tp: int = 1
    ep: int = 1
    dp_attention: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.dp_attention

    def describe(self) -> str:
        parts = [
            f"{n}={v}"
            for n, v in (("tp", self.tp), ("dp_attention", self.dp_attention), ("ep", self.ep))
            if v > 1
        ]
        return " x ".join(parts) or "one device"


def check_placement(cfg: ModelConfig, pl: Placement) -> None:
    """A KvjaxError naming the field and the values allowed when `pl` does not divide `cfg`."""
    for name in ("tp", "ep", "dp_attention"):
        value = getattr(pl, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise KvjaxError(f"{name}={value!r} must be a positive integer")
    _check_tp(cfg, pl.tp)
    if pl.ep == 1:
        return
    if not cfg.is_moe:
        raise KvjaxError(f"ep={pl.ep}: {cfg.name} has no experts (num_experts=0); allowed: ep=1")
    if pl.ep != pl.dp_attention or pl.tp != 1:
        raise KvjaxError(
            f"ep={pl.ep} with tp={pl.tp}, dp_attention={pl.dp_attention}: expert parallelism is "
            f"modelled over data-parallel attention, ep = dp_attention and tp = 1 (e.g. "
            f"--dp-attention {pl.ep} --ep {pl.ep})"
        )
    if cfg.num_experts % pl.ep:
        allowed = [e for e in range(1, cfg.num_experts + 1) if cfg.num_experts % e == 0]
        raise KvjaxError(
            f"ep={pl.ep} does not divide num_experts={cfg.num_experts}; allowed ep: "
            f"{', '.join(map(str, allowed))}"
        )


def device_workload(cfg: ModelConfig, pl: Placement, wl: Workload) -> Workload:
    """One device's share of the step: B / dp_attention sequences; under expert parallelism its
    MoE layers read the experts it holds that the whole batch touches, (E/ep) * (1 - (1-k/E)^M)
    (`kvjax.cli.calc_report.expert_parallel_report`), and compute its M_l * k routed rows
    (balanced)."""
    check_placement(cfg, pl)
    if wl.batch % pl.dp_attention:
        raise KvjaxError(
            f"batch={wl.batch} is not divisible by dp_attention={pl.dp_attention} (each "
            f"attention group takes batch / dp_attention sequences)"
        )
    touched = wl.experts_touched
    if pl.ep > 1 and touched is None:
        touched = expected_experts_touched(cfg.num_experts, cfg.experts_per_token, wl.tokens)
    if pl.ep > 1:
        touched /= pl.ep
    return dataclasses.replace(wl, batch=wl.batch // pl.dp_attention, experts_touched=touched)


def placed_weight_bytes(cfg: ModelConfig, pl: Placement) -> int:
    """Weights one device holds: its tp share; under ep, all but the E - E/ep routed experts of
    each MoE layer held elsewhere."""
    check_placement(cfg, pl)
    held = weight_bytes(device_config(cfg, pl.tp))
    if pl.ep > 1:  # each expert's matrices (MXFP4 where stored so) and gpt-oss's biases
        E, D, F = cfg.num_experts, cfg.d_model, cfg.moe_d_ff
        away = cfg.num_moe_layers * (E - E // pl.ep)
        bias = (2 * F + D) * cfg.weight_bytes_per_element if cfg.expert_bias else 0
        held -= round(away * (expert_matrix_bytes(cfg, expert_params(cfg)) + bias))
    return held


def all_to_all_bytes(
    cfg: ModelConfig, ep: int, local_tokens: int, capacity_factor: float | None = None
) -> float:
    """X of one dispatch (or combine) all-to-all on one device: ragged (None), its M_l tokens'
    k routed rows, M_l * k * D * a; fixed-shape, E experts x C rows, C = ceil(cf * M_l * k / E).
    A device sends (ep - 1) / ep of X (the collectives' convention)."""
    D, a = cfg.d_model, DTYPE_BYTES[cfg.compute_dtype]
    k, E = cfg.experts_per_token, cfg.num_experts
    if capacity_factor is None:
        return local_tokens * k * D * a
    if not isinstance(capacity_factor, (int, float)) or capacity_factor <= 0:
        raise KvjaxError(f"capacity_factor={capacity_factor!r} must be a number > 0 (or None)")
    return E * expert_capacity(cfg, local_tokens, capacity_factor) * D * a


def expert_capacity(cfg: ModelConfig, local_tokens: int, capacity_factor: float) -> int:
    """GShard's rows an expert takes from one device: ceil(cf * M_l * k / E), at most M_l (a token
    picks an expert once); cf = E / k never drops a token."""
    k, E = cfg.experts_per_token, cfg.num_experts
    return min(local_tokens, math.ceil(capacity_factor * local_tokens * k / E))


def shared_expert_message(cfg: ModelConfig, pl: Placement, wl: Workload) -> float:
    """XLA's extra [M, D] all-reduce message a MoE layer under tp: it reduces the shared experts'
    partial sums apart from the routed ones (engines add them first)."""
    act = device_workload(cfg, pl, wl).tokens * cfg.d_model * DTYPE_BYTES[cfg.compute_dtype]
    extra = pl.tp > 1 and cfg.is_moe and cfg.shared_d_ff
    return cfg.num_moe_layers * allreduce_bytes_per_device(act, pl.tp) if extra else 0.0


def placed_collectives(
    cfg: ModelConfig, pl: Placement, wl: Workload, capacity_factor: float | None = None
) -> dict[str, dict[str, float]]:
    """The step's collectives by kind (count, bytes one device sends): tp's all-reduces and the
    logits' all-gather inside each attention group (on its B / dp_attention sequences), the
    MoE layers' dispatch and combine all-to-alls under ep. Ring conventions as
    `kvjax.traced.collectives`: all-reduce 2 (n-1)/n X, all-gather and all-to-all (n-1)/n X."""
    dev_wl = device_workload(cfg, pl, wl)
    out: dict[str, dict[str, float]] = {}
    tp = pl.tp
    if tp > 1:
        a = DTYPE_BYTES[cfg.compute_dtype]
        act = dev_wl.tokens * cfg.d_model * a
        logits = dev_wl.tokens * math.ceil(cfg.vocab_size / tp) * tp * SCORE_BYTES
        counts = collective_counts_per_step(cfg, tp)
        sent = {
            "all-reduce": allreduce_bytes_per_device(act, tp),  # one of each kind
            "all-gather": (tp - 1) / tp * logits,
        }
        # MoE: shared and routed sums in one all-reduce, as engines (`shared_expert_message`)
        for kind, n in counts.items():
            out[kind] = {"count": n, "bytes_per_device": n * sent[kind]}
    if pl.ep > 1:
        x = all_to_all_bytes(cfg, pl.ep, dev_wl.tokens, capacity_factor)
        n = 2 * cfg.num_moe_layers  # dispatch and combine
        out["all-to-all"] = {"count": n, "bytes_per_device": n * (pl.ep - 1) / pl.ep * x}
    return out
