"""The closed-form view: FLOPs, bytes and sizes of every kernel from formulas. Pure Python: this
package never imports jax or flax (tests/test_layout.py checks it). Its modules:

    costs            Workload, KernelCost, StepCost: the closed form's vocabulary
    primitives       one matmul, norm, residual add, soft cap, softmax and RoPE
    sizes, params    parameters, weight bytes, the KV cache (2 L K H S B bytes) and activations
    step             every kernel of a prefill, decode or extend step (`kvjax.kernels` names)
    gqa              an MHA/GQA/MQA layer's attention kernels
    mla, moe         multi-head latent attention; mixtures of experts
    hybrid           the layers whose state does not grow (Gated DeltaNet, Mamba-2, short convs)
    quant            a quantized KV cache's quantize and dequantize work
    flash, pairs     fused attention as accelerators run it; the pairs a mask allows
    keys             the key positions a block of queries attends
    compulsory       the bound's count of a fused attention, for any implementation
    attention        decode attention as the seed states it (intensity h / h_kv)
    roofline         ridge, bounds and the one `point` every view places its numbers with
    parallel         tensor, expert and data-parallel-attention placements per device
    placement_point  one device's share of a step under a placement, with its bound
    pipeline         pipeline stages
    serving          speculative decoding, paged caches, TTFT and the batch frontier
    variants         the seed's MHA/GQA/MQA table for any model
"""

from kvjax.analytic.attention import attention_intensity, fused_attention_cost
from kvjax.analytic.costs import INDEX_BYTES, PHASES, SCORE_BYTES, KernelCost, StepCost, Workload
from kvjax.analytic.hybrid import state_bytes
from kvjax.analytic.sizes import (
    cache_bytes,
    cache_equals_at_context,
    kv_bytes_per_token,
    kv_bytes_per_token_per_layer,
    kv_cache_bytes,
    kv_exceeds_weights_at_context,
    kv_positions_held,
    layer_param_counts,
    max_batch_that_fits,
    max_context_that_fits,
    num_params,
    param_counts,
    weight_bytes,
)
from kvjax.analytic.step import (
    attention_cost,
    embed_kernel,
    head_kernels,
    layer_kernels,
    step_cost,
    step_kernels,
)

__all__ = [
    "INDEX_BYTES",
    "PHASES",
    "SCORE_BYTES",
    "KernelCost",
    "StepCost",
    "Workload",
    "attention_cost",
    "attention_intensity",
    "cache_bytes",
    "cache_equals_at_context",
    "embed_kernel",
    "fused_attention_cost",
    "head_kernels",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_layer",
    "kv_cache_bytes",
    "kv_exceeds_weights_at_context",
    "kv_positions_held",
    "layer_kernels",
    "layer_param_counts",
    "max_batch_that_fits",
    "max_context_that_fits",
    "num_params",
    "param_counts",
    "state_bytes",
    "step_cost",
    "step_kernels",
    "weight_bytes",
]
