"""The closed-form view: FLOPs, bytes and sizes of every kernel from formulas. Pure Python: this
package never imports jax or flax (tests/test_layout.py checks it).

- `costs`: Workload, KernelCost, StepCost;
- `sizes`: parameters, weights and the KV cache; `hybrid`: the layers whose state does not grow
  (Gated DeltaNet, Mamba-2, short convolutions: issue 31);
- `step`: every kernel of a prefill or decode step (keyed by `kvjax.kernels` names); `mla`, `moe`
  and `quant`: multi-head latent attention, mixtures of experts, quantized caches;
- `attention`: decode attention as the seed states it (fused cost, intensity h/h_kv);
- `roofline`: ridge, bounds and the one `point` every view places its numbers with;
- `parallel`: tensor-parallel placement per device; `variants`: the seed's MHA/GQA/MQA table.
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
