"""Tensor-parallel all-reduce as engines run it inside one 8-GPU node: the implementation model's
collectives (the bound keeps the link's line rate and no latency: `kvjax.analytic.parallel`).

One all-reduce of an [M, D] message of n bytes over t chips takes

    alpha + 2 (t - 1) / t * n / busbw

with `busbw` the bus bandwidth NCCL reaches on large messages (nccl-tests' busBw, which is
algbw x 2 (t - 1) / t: comparable with the link's per-direction line rate) and `alpha` the time
of a small message on the custom all-reduce the engines run for decode-sized messages
(TensorRT-LLM's one-shot/two-shot kernels). Sourced per chip; a chip with no source keeps the
line rate and no latency (said by `source`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AllReduce:
    bus_bytes_per_s: float | None  # None: the chip's line rate
    latency_s: float
    source: str


_NVLINK4 = AllReduce(
    370e9,
    5.9e-6,
    "busbw: NCCL maintainer, github.com/NVIDIA/nccl-tests/issues/212 ('450GB/s is the line rate."
    " With the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s'; "
    "8 x H100 with NVLink SHARP measured 383 GB/s at 128 MiB, nccl-tests/issues/290); latency: "
    "8 x H100, TensorRT-LLM-derived custom all-reduce, 5.7-5.9 us at 512 B-4 KB "
    "(github.com/sgl-project/sglang/pull/2904, tp 8, without CUDA graph)",
)
ALL_REDUCE = {
    "h100-sxm": _NVLINK4,
    "h200": _NVLINK4,  # the same NVLink 4 and NVSwitch as the H100 SXM's HGX board
    # a latency is published (NCCL 2.17.1, 8 x A100, 1 KB all-reduce: 16.96 us under CUDA graphs,
    # github.com/microsoft/mscclpp docs/performance-ndmv4.md; NVIDIA/nccl-tests#123: 16.88 us at
    # 4 GPUs, 33.7 us at 8, one channel) but left at 0: the corpus's A100 steps (LMDeploy v0.1,
    # no CUDA graphs) carry their per-layer latency in the step's fitted t0, and charging 17 us
    # beside it moved the step class's held-out error from 10.6% to 15.6% (VALIDATE.md)
    "a100-80gb": AllReduce(
        230e9,
        0.0,
        "busbw: NCCL maintainer, github.com/NVIDIA/nccl-tests/issues/149 ('total effective "
        "bandwidth should therefore be 240GB/s on A100, but some other bottlenecks on the GPUs "
        "limits it to ~230GB/s'; 232.5 GB/s measured on 8 GPUs, nccl-tests/issues/175); no "
        "small-message latency sourced",
    ),
}
ALL_REDUCE["a100-40gb"] = ALL_REDUCE["a100-80gb"]
# NVLink 5 (900 GB/s a direction): no nccl-tests table of 8 x B200 is in the stored sources, so
# the two numbers below are the closest published ones, each said for what it is
ALL_REDUCE["b200"] = AllReduce(
    830e9,
    8.7e-6,
    "busbw: 8 x B200 in one node, nccl-tests all_reduce_perf, NCCL 2.27.1: 'Ours is 830+' "
    "(github.com/NVIDIA/nccl/issues/1807, a user's number, no message size given); latency: "
    "8 x B200, tp 8, the TensorRT-LLM all-reduce fused with the residual add and RMSNorm "
    "(FlashInfer) in SGLang serving DeepSeek-R1-FP4: '13.5us->8.7us' "
    "(github.com/sgl-project/sglang/pull/7621; the norm included, so at most the all-reduce's)",
)
ALL_REDUCE["gb200"] = AllReduce(
    679.61e9,
    8e-6,
    "busbw: 4 x GB200 (one tray), nccl-tests AllReduce, ring, in place, 8 GB, NCCL 2.25.1: "
    "679.61 GB/s (github.com/Azure/AI-benchmarking-guide Azure_Results/ND_GB200_v6_results.md);"
    " latency: 'under 8us with all_reduce_perf for messages sizes up to 1KB, on a single-node "
    "GB200 (4 GPUs)' (an NVIDIA engineer, github.com/NVIDIA/nccl-tests/issues/333)",
)


def all_reduce(chip_name: str, line_rate: float) -> AllReduce:
    """The chip's sourced all-reduce, or its line rate with no latency where none is sourced."""
    return ALL_REDUCE.get(chip_name) or AllReduce(
        line_rate, 0.0, f"no source for {chip_name!r}: the line rate, no latency"
    )


def tensor_parallel_link(cfg, chip, tp: int, achieved: bool):
    """(tokens, rows) -> seconds: a step's collectives under tp-way tensor parallelism, run after
    its compute: 2 L + 1 ring all-reduces of its M = tokens x D activations (one a MoE layer's
    shared and routed sums) and the all-gather of the `rows` sampled rows' f32 logits, bytes per
    device over the link at the line rate (`achieved` False: the bound's) or as engines reach it
    (with a latency each)."""
    from kvjax.analytic.parallel import collective_counts_per_step
    from kvjax.dtypes import DTYPE_BYTES
    from kvjax.errors import KvjaxError

    line = chip.interconnect_bytes_per_s
    if not line:
        raise KvjaxError(f"chip {chip.name!r} has no interconnect bandwidth for tp={tp}")
    link = all_reduce(chip.name, line) if achieved else AllReduce(line, 0.0, "")
    reduces = collective_counts_per_step(cfg, tp).get("all-reduce", 0)
    row = cfg.d_model * DTYPE_BYTES[cfg.compute_dtype]
    logits = -(-cfg.vocab_size // tp) * tp * 4
    bw, fixed = link.bus_bytes_per_s or line, (reduces + 1) * link.latency_s
    a, b = reduces * 2 * (tp - 1) / tp * row / bw, (tp - 1) / tp * logits / bw
    return lambda tokens, rows: tokens * a + rows * b + fixed
