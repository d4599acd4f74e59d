"""Per server, in closed form: speculative decoding, paged caches, time to first token, and the
throughput-latency frontier over batch and attention variant. Pure Python; letters:
`kvjax.kernels`.

Every time here is a bound from the per-kernel closed form on one chip: the sum over the step's
kernels of max(FLOPs / peak, bytes / bandwidth) (`step_bound_s`), each kernel its own launch, so
a step is never faster than its weights' read (the seed's floor) and never faster than its
whole-step roofline either.

- Speculative decoding (Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via
  Speculative Decoding", eq. 1): a draft proposes k tokens, the target verifies them in one
  extend step of T = k + 1 (`Workload("extend", ...)`); with each draft token accepted
  independently with probability a, the tokens a verify step yields are
  E = (1 - a^(k+1)) / (1 - a) (k + 1 when a = 1). The target's time per generated token is the
  verify step over E, plus the draft's k decode steps over E when a draft model is named.
- Pages (vLLM's blocks): each sequence holds ceil(S / P) * P positions per layer
  (`kvjax.analytic.sizes.paged`); capacity is counted on pages.
- Frontier: for B from 1 to the largest batch whose weights + paged KV cache + the decode step's
  activations fit the chip, the step's bound time (ms per token for each sequence) and B / step
  (tokens/s per chip). Activations (`activation_bytes`): the residual stream in and out of a
  layer and the largest intermediate the step materializes (a layer's scores and probabilities,
  its MLP's gate/up, or the f32 logits), as the model runs one layer at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvjax.analytic import parallel, roofline
from kvjax.analytic.costs import EXTEND, Workload
from kvjax.analytic.sizes import activation_bytes, cache_bytes, weight_bytes
from kvjax.analytic.step import step_kernels
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig


def step_bound_s(cfg: ModelConfig, wl: Workload, chip: ChipSpec) -> float:
    """Sum of each kernel's roofline bound on `chip` (the step's kernels run one after another)."""
    peak, bw = chip.peak(cfg.peak_dtype), chip.bandwidth_bytes_per_s
    return sum(
        roofline.bound_time_s(k.flops, k.bytes, peak, bw)
        for k in step_kernels(cfg, wl, chip).values()
    )


def expected_tokens(spec_tokens: int, acceptance: float) -> float:
    """Tokens one verify step yields: (1 - a^(k+1)) / (1 - a), k + 1 when a = 1."""
    k, a = spec_tokens, acceptance
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise KvjaxError(f"spec_tokens={k!r} must be an integer >= 1 (draft tokens per step)")
    if isinstance(a, bool) or not isinstance(a, int | float) or not 0 <= a <= 1:
        raise KvjaxError(f"acceptance={a!r} must lie in [0, 1] (a draft token's acceptance)")
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def speculative(
    cfg: ModelConfig,
    wl: Workload,
    chip: ChipSpec,
    spec_tokens: int,
    acceptance: float,
    draft: ModelConfig | None = None,
) -> dict[str, Any]:
    """A verify step of T = k + 1 new tokens on the S - 1 cached (the decode step at context S
    is the k = 0 case) against plain decode, per generated token."""
    if wl.phase != "decode":
        raise KvjaxError(f"speculative decoding applies to --phase decode (got {wl.phase!r})")
    k = spec_tokens
    tokens = expected_tokens(k, acceptance)
    verify_wl = Workload(EXTEND, wl.batch, wl.context + k, new_tokens=k + 1)
    verify = step_kernels(cfg, verify_wl, chip)
    flops, bytes_ = sum(c.flops for c in verify.values()), sum(c.bytes for c in verify.values())
    verify_s = step_bound_s(cfg, verify_wl, chip)
    decode_s = step_bound_s(cfg, wl, chip)
    out = {
        "spec_tokens": k,
        "acceptance": acceptance,
        "expected_tokens_per_step": tokens,
        "verify_flops": flops,
        "verify_bytes": bytes_,
        "verify_intensity": roofline.intensity(flops, bytes_),
        "verify_step_s": verify_s,
        "decode_step_s": decode_s,
        "s_per_token_target_only": verify_s / tokens,
        "s_per_token_plain_decode": decode_s,
        "draft_model": None,
        "draft_step_s": None,
        "s_per_token": verify_s / tokens,
    }
    if draft is not None:
        draft_s = step_bound_s(draft, wl, chip)
        out.update(
            draft_model=draft.name,
            draft_step_s=draft_s,
            s_per_token=(verify_s + k * draft_s) / tokens,
        )
    out["speedup_over_decode"] = decode_s / out["s_per_token"]
    return out


def step_memory_bytes(cfg: ModelConfig, wl: Workload, page_size: int = 0) -> int:
    """Weights + the paged KV cache of B sequences at S (and a hybrid's flat states) + the
    step's activations."""
    return (
        weight_bytes(cfg)
        + cache_bytes(cfg, wl.context, wl.batch, page_size)
        + activation_bytes(cfg, wl)
    )


def max_serving_batch(cfg: ModelConfig, chip: ChipSpec, context: int, page_size: int = 0) -> int:
    """Largest B whose decode step (weights + paged KV + activations) fits the chip's memory."""
    if not chip.memory_bytes:
        raise KvjaxError(f"chip {chip.name!r} has no memory size; give --memory")

    def fits(b: int) -> bool:
        return (
            step_memory_bytes(cfg, Workload("decode", b, context), page_size) <= chip.memory_bytes
        )

    return largest(fits)


def largest(fits) -> int:
    """The largest B >= 1 with fits(B) (memory grows with B), 0 if none."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


@dataclass(frozen=True)
class FrontierPoint:
    variant: str
    batch: int
    step_s: float
    tokens_per_s: float
    ms_per_token: float
    memory_bytes: int


def read_weight_bytes(
    cfg: ModelConfig, context: int, placement: parallel.Placement | None = None
) -> float:
    """The weights a B = 1 decode step reads: every matrix once, but of the embedding table only
    the token's row (an untied table is not read whole), and of an MoE layer the experts its
    token routes to: the floor no batch of decode steps can go below (the seed's 2N / beta).
    Placed, one device's: its share, at one sequence per attention group."""
    pl = placement or parallel.Placement()
    dev = parallel.device_config(cfg, pl.tp) if pl.tp > 1 else cfg
    wl = parallel.device_workload(cfg, pl, Workload("decode", pl.dp_attention, context))
    return sum(k.weight_bytes for k in step_kernels(dev, wl).values())


def frontier_batches(max_batch: int) -> list[int]:
    """1, 2, 4, ... below `max_batch`, then `max_batch` (the curve ends where memory does)."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch] if max_batch else []


def frontier(
    cfg: ModelConfig,
    chip: ChipSpec,
    context: int,
    page_size: int = 0,
    label: str | None = None,
    tp: int = 1,
    ep: int = 1,
    dp_attention: int = 1,
) -> dict[str, Any]:
    """One variant's throughput-latency curve at context S, its batches up to `max_batch`.
    Placed on tp x dp_attention chips (`kvjax.analytic.parallel.Placement`), memory and the step
    are one device's share (B / dp_attention sequences; under ep, the experts it holds and
    touches), the step is the larger of its bound and its collectives' bytes over the chip's
    link (ragged all-to-alls; overlapped, as the bound must), and tokens/s is per chip (B / step
    / devices)."""
    pl = parallel.Placement(tp, ep, dp_attention)
    parallel.check_placement(cfg, pl)
    n = pl.devices
    if n > 1 and not chip.interconnect_bytes_per_s:
        raise KvjaxError(f"chip {chip.name!r} has no interconnect bandwidth for {pl.describe()}")
    dev = parallel.device_config(cfg, tp) if tp > 1 else cfg
    groups = max_placed_batch(cfg, pl, chip, context, page_size)  # a group's sequences
    points = []
    for b in frontier_batches(groups):
        wl = Workload("decode", b * dp_attention, context)
        dev_wl = parallel.device_workload(cfg, pl, wl)
        step_s = step_bound_s(dev, dev_wl, chip)
        if n > 1:  # overlapped with compute, the bound (`placement_point.placement_point`)
            colls = parallel.placed_collectives(cfg, pl, wl)
            link_s = sum(c["bytes_per_device"] for c in colls.values()) / (
                chip.interconnect_bytes_per_s
            )
            step_s = max(step_s, link_s)
        held = placed_memory_bytes(cfg, pl, wl, page_size)
        points.append(
            FrontierPoint(
                label or cfg.name, wl.batch, step_s, wl.batch / step_s / n, 1e3 * step_s, held
            )
        )
    return {
        "variant": label or cfg.name,
        "num_kv_heads": cfg.num_kv_heads,
        "kv_dtype": cfg.kv_dtype,
        "tp": tp,
        "ep": ep,
        "dp_attention": dp_attention,
        "devices": n,
        "max_batch": groups * dp_attention,
        "weights_floor_ms_per_token": 1e3
        * read_weight_bytes(cfg, context, pl)
        / chip.bandwidth_bytes_per_s,
        "points": [p.__dict__ for p in points],
    }


def placed_memory_bytes(
    cfg: ModelConfig, pl: parallel.Placement, wl: Workload, page_size: int = 0
) -> int:
    """One device's weights (its share under the placement) + its sequences' paged KV cache
    (and a hybrid's states) + its step's activations."""
    dev = parallel.device_config(cfg, pl.tp) if pl.tp > 1 else cfg
    dev_wl = parallel.device_workload(cfg, pl, wl)
    return (
        parallel.placed_weight_bytes(cfg, pl)
        + cache_bytes(dev, dev_wl.context, dev_wl.batch, page_size)
        + activation_bytes(dev, dev_wl)
    )


def max_placed_batch(
    cfg: ModelConfig, pl: parallel.Placement, chip: ChipSpec, context: int, page_size: int = 0
) -> int:
    """Largest number of sequences per attention group whose decode step fits one device."""
    if pl.devices == 1:
        return max_serving_batch(cfg, chip, context, page_size)
    if not chip.memory_bytes:
        raise KvjaxError(f"chip {chip.name!r} has no memory size; give --memory")

    def fits(b: int) -> bool:
        wl = Workload("decode", b * pl.dp_attention, context)
        return placed_memory_bytes(cfg, pl, wl, page_size) <= chip.memory_bytes

    return largest(fits)


def time_to_first_token_s(cfg: ModelConfig, chip: ChipSpec, prompt: int, chunk: int = 0) -> float:
    """Bound time to prefill one prompt of S tokens: one prefill step, or with `chunk` C the
    chunked-prefill schedule, extend steps of C new tokens on the C, 2C, ... already cached (the
    last chunk what remains)."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
        raise KvjaxError(f"chunk={chunk!r} must be a positive integer (tokens per prefill chunk)")
    if not chunk or chunk >= prompt:
        return step_bound_s(cfg, Workload("prefill", 1, prompt), chip)
    total, done = 0.0, 0
    while done < prompt:
        T = min(chunk, prompt - done)
        total += step_bound_s(cfg, Workload(EXTEND, 1, done + T, new_tokens=T), chip)
        done += T
    return total
