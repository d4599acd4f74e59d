"""The KV pool as engines size it: what remains of `memory_utilization` x the chip's memory after
the weights, the activation peak of the largest step, the engine's fixed reserves and a slot of
fixed size for each request that may run, in pages. Pure Python.

- Global attention layers hold every position: their KV (or MLA latent, or 1-byte rows with
  their scales) per token (`kvjax.analytic.sizes.kv_bytes_per_token_per_layer`) is what a page
  holds, and the pool's pages are what `kvjax serve`/`simulate` print ("KV cache: N tokens").
- Sliding-window layers hold at most W (+ sinks) positions a request, and state layers (DeltaNet,
  Mamba-2, LFM2's convolutions) a flat state: each running request gets a slot of those bytes,
  reserved for `max_batch` requests before the pages are cut, as SGLang sizes its state pool by
  its running requests. For windows this is conservative: vLLM v1's hybrid allocator takes a
  sliding layer's pages from the shared pool as a request grows, so a batch of short requests
  holds less than max_batch windows.
- Reserves (`engine_reserve_bytes`): what a GPU engine keeps off the pool, from vLLM's own
  memory profile: CUDA graphs ("Estimated CUDA graph memory: 0.36 GiB total", vLLM 0.27 with
  its default capture sizes; vLLM subtracts them from the pool since 0.21) and the memory
  outside PyTorch's allocator (CUDA context, cuBLAS and NCCL buffers: "non_torch_memory takes
  0.33GiB" on one GPU, vLLM's worker log). Logged figures, not derived: give `reserve_bytes` to
  change them; a TPU or another chip gets none (no sourced figure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvjax.analytic import Workload
from kvjax.analytic.costs import EXTEND
from kvjax.analytic.hybrid import state_bytes
from kvjax.analytic.quant import tensor_scale_bytes
from kvjax.analytic.sizes import activation_bytes, kv_bytes_per_token_per_layer, paged, weight_bytes
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig

GIB = 1 << 30
# (what, bytes, source): the reserves a GPU engine keeps off the KV pool
GPU_RESERVES = (
    (
        "CUDA graphs",
        0.36 * GIB,
        "vLLM 0.27 log 'Estimated CUDA graph memory: 0.36 GiB total' (gpustack/runner#251)",
    ),
    (
        "non-torch memory",
        0.33 * GIB,
        "vLLM worker log 'non_torch_memory takes 0.33GiB' (vllm-project/vllm#14452)",
    ),
)


def engine_reserve_bytes(chip: ChipSpec) -> float:
    """The fixed reserves of `GPU_RESERVES` on a GPU (a chip that is not a TPU or a CPU)."""
    if chip.name.startswith("tpu") or "cpu" in chip.name.lower():
        return 0.0
    return sum(b for _, b, _ in GPU_RESERVES)


@dataclass(frozen=True)
class KvPool:
    pages: int
    page_size: int
    bytes_per_token: int  # the global attention layers' KV of one position
    pool_bytes: float
    weight_bytes: float
    activation_bytes: float
    reserve_bytes: float
    slot_bytes: int  # per running request: sliding layers' windows and state layers' states
    slots: int
    memory_bytes: float
    memory_utilization: float

    @property
    def tokens(self) -> int:
        return self.pages * self.page_size


def slot_bytes(cfg: ModelConfig, page_size: int, max_context: int) -> int:
    """One request's fixed share: each sliding layer's W + sinks positions (no more than the
    longest request's, on pages) and the state layers' states."""
    held = min(cfg.sliding_window + cfg.sink_tokens, max_context)
    window = paged(held, page_size) if cfg.num_sliding_layers else 0
    per_layer = kv_bytes_per_token_per_layer(cfg) if cfg.num_attention_layers else 0
    return cfg.num_sliding_layers * window * per_layer + state_bytes(cfg, 1)


def kv_pool(
    cfg: ModelConfig,
    chip: ChipSpec,
    page_size: int,
    token_budget: int,
    max_context: int,
    memory_utilization: float = 0.9,
    reserve_bytes: float | None = None,
    max_batch: int = 256,
    weight_scale: float = 1.0,
) -> KvPool:
    """The pool's pages; a KvjaxError with the bytes needed and the bytes there are when the
    weights, the largest step, the reserves and the slots leave no page. `reserve_bytes` None:
    `engine_reserve_bytes(chip)`; `weight_scale`: the weights' bytes against the config's dtype
    (NVFP4 weights on an fp8 config: 4.5 / 8)."""
    if not chip.memory_bytes:
        raise KvjaxError(f"chip {chip.name!r} has no memory size; give --memory")
    if not 0 < memory_utilization <= 1:
        raise KvjaxError(f"memory_utilization={memory_utilization!r} must lie in (0, 1]")
    if reserve_bytes is None:
        reserve_bytes = engine_reserve_bytes(chip)
    global_layers = cfg.num_attention_layers - cfg.num_sliding_layers
    per_token = kv_bytes_per_token_per_layer(cfg) * global_layers
    tokens = min(token_budget, max_context)
    largest = (
        Workload(EXTEND, 1, max_context, new_tokens=tokens)
        if tokens < max_context
        else (Workload("prefill", 1, max_context))
    )
    act = activation_bytes(cfg, largest)
    weights = weight_bytes(cfg) * weight_scale
    slot = slot_bytes(cfg, page_size, max_context)
    fixed = weights + act + reserve_bytes + tensor_scale_bytes(cfg) + max_batch * slot
    pool = memory_utilization * chip.memory_bytes - fixed
    if per_token:
        pages = math.floor(pool / (page_size * per_token)) if pool > 0 else 0
    else:  # no global layer: positions cost no pages; as many as max_batch contexts need
        pages = max_batch * -(-max_context // page_size) if pool >= 0 else 0
    if pages < 1:
        raise KvjaxError(
            f"{cfg.name} on {chip.name}: weights {weights:,.0f} B + the largest step's activations "
            f"{act:,.0f} B + reserve {reserve_bytes:,.0f} B + {max_batch} slots of {slot:,} B "
            f"leave no page of {page_size} tokens ({page_size * per_token:,} B) in "
            f"{memory_utilization:g} x {chip.memory_bytes:,.0f} B"
            + (" (lower --max-batch: each running request's slot is reserved)" if slot else "")
        )
    return KvPool(
        pages,
        page_size,
        per_token,
        pool,
        weights,
        act,
        reserve_bytes,
        slot,
        max_batch,
        chip.memory_bytes,
        memory_utilization,
    )


def whole_prefill_reason(cfg: ModelConfig) -> str | None:
    """Why prompts must be prefilled whole (no chunked prefill, no prefix cache hits): the
    closed form has no extend step for the model's sliding-window or state layers; None when
    it has."""
    from kvjax.model.checks import check_extend

    try:
        check_extend(cfg)
    except KvjaxError as exc:
        return str(exc)
    return None
