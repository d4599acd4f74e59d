"""The KV pool as engines size it: what remains of `memory_utilization` x the chip's memory after
the weights and the activation peak of the largest step, in pages. Pure Python.

Every attention layer's KV (or MLA latent, or quantized rows with their scales) is counted per
token (`kvjax.analytic.sizes.kv_cache_bytes` of one position), so a sliding-window layer's pages
are counted as a global layer's (vLLM's hybrid allocator gives them fewer); a model with state
layers is refused (its flat states are not pages). Reserves engines also keep (CUDA graphs,
communication buffers) are not subtracted: no sourced figure is in kvjax yet; `reserve_bytes`
takes one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvjax.analytic import Workload
from kvjax.analytic.costs import EXTEND
from kvjax.analytic.sizes import activation_bytes, kv_cache_bytes, weight_bytes
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig


@dataclass(frozen=True)
class KvPool:
    pages: int
    page_size: int
    bytes_per_token: int
    pool_bytes: float
    weight_bytes: float
    activation_bytes: float
    reserve_bytes: float
    memory_bytes: float
    memory_utilization: float

    @property
    def tokens(self) -> int:
        return self.pages * self.page_size


def kv_pool(
    cfg: ModelConfig, chip: ChipSpec, page_size: int, token_budget: int, max_context: int,
    memory_utilization: float = 0.9, reserve_bytes: float = 0.0,
) -> KvPool:  # fmt: skip
    """The pool's pages; a KvjaxError with the bytes needed and the bytes there are when the
    weights and the largest step leave no page."""
    if cfg.is_hybrid:
        raise KvjaxError(f"{cfg.name}: state layers hold flat states, not pages; not modelled")
    if not chip.memory_bytes:
        raise KvjaxError(f"chip {chip.name!r} has no memory size; give --memory")
    if not 0 < memory_utilization <= 1:
        raise KvjaxError(f"memory_utilization={memory_utilization!r} must lie in (0, 1]")
    per_token = kv_cache_bytes(cfg, 1, 1)
    tokens = min(token_budget, max_context)
    largest = Workload(EXTEND, 1, max_context, new_tokens=tokens) if tokens < max_context else (
        Workload("prefill", 1, max_context))  # fmt: skip
    act = activation_bytes(cfg, largest)
    weights = weight_bytes(cfg)
    pool = memory_utilization * chip.memory_bytes - weights - act - reserve_bytes
    pages = math.floor(pool / (page_size * per_token)) if pool > 0 else 0
    if pages < 1:
        raise KvjaxError(
            f"{cfg.name} on {chip.name}: weights {weights:,.0f} B + the largest step's activations "
            f"{act:,.0f} B + reserve {reserve_bytes:,.0f} B leave no page of {page_size} tokens "
            f"({page_size * per_token:,} B) in {memory_utilization:g} x {chip.memory_bytes:,} B"
        )
    return KvPool(pages, page_size, per_token, pool, weights, act, reserve_bytes,
                  chip.memory_bytes, memory_utilization)  # fmt: skip
