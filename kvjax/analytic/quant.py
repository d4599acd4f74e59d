"""A quantized KV cache's extra work, in closed form: quantizing what is written and dequantizing
what is read, counted as `kvjax.nn.kv_cache.quantize` / `dequantize` run (derivations below; the
trace checks them per kernel). Pure Python. Scales are f32 (`SCALE_BYTES`):

- "tensor" (fp8's default): one scale per layer for K and one for V (vLLM's uncalibrated 1.0);
- "token_head" (int8's default): one per token per KV head for K and for V, absmax / QMAX of the
  H values, so a cache of kv bytes per element holds (kv + 4/H) bytes per element: int8 with f32
  scales is (1 + 4/H) x half of a bf16 cache.
"""

from __future__ import annotations

from kvjax.config import SCALE_BYTES, ModelConfig


def scale_bytes_per_token_per_layer(cfg: ModelConfig) -> int:
    """A token's K and V scales in one layer: 2 * K * 4 bytes per token per head, else 0."""
    return 2 * cfg.num_kv_heads * SCALE_BYTES if cfg.kv_scale_kind == "token_head" else 0


def tensor_scale_bytes(cfg: ModelConfig) -> int:
    """Per-tensor scales held whatever S and B: a K and a V scale per layer."""
    return 2 * cfg.num_layers * SCALE_BYTES if cfg.kv_scale_kind == "tensor" else 0


def quantize_flops(cfg: ModelConfig, elements: int, rows: int, a: int) -> int:
    """Quantizing `elements` values of K and as many of V (`rows` rows of H each).

    tensor: x / scale (1 an element; a 2-byte model first converts x to f32: 1 more);
    token_head: |x|, the row max (elements - rows), / QMAX, > 0 and the select guarding a zero
    row (3 a row), x / scale (1 an element): 3 an element + 2 a row, and a 2-byte model converts
    x and the row max to f32 (1 an element, 1 a row); int8 then rounds and clips (3 an element).
    Times two: K and V. The cast to the cache's dtype is the widening convert counted already.
    """
    kind, narrow = cfg.kv_scale_kind, a != 4
    if kind == "none":
        return 0
    if kind == "tensor":
        per = elements * (2 if narrow else 1)
    else:
        per = 3 * elements + 2 * rows + ((elements + rows) if narrow else 0)
    if cfg.kv_dtype == "int8":
        per += 3 * elements
    return 2 * per


def dequantize_cost(cfg: ModelConfig, elements: int, rows: int, a: int) -> tuple[int, int]:
    """(FLOPs, bytes) of widening one cached tensor's `elements` (`rows` rows of H) by its scales,
    as the lowered module runs it: the multiply (1 FLOP an element; reads the widened values and
    the broadcast scale, writes the product: 3 x a bytes an element) and the scale's broadcast
    (a bytes an element); token_head adds its reshapes (5 x a + 8 bytes a row) and a 2-byte model
    converts the f32 scales (1 FLOP, 4 + a bytes, each)."""
    kind, narrow = cfg.kv_scale_kind, a != 4
    if kind == "none":
        return 0, 0
    scales = rows if kind == "token_head" else 1
    flops = elements + (scales if narrow else 0)
    bytes_ = 4 * elements * a + (scales * (4 + a) if narrow else 0)
    bytes_ += 5 * rows * a + 8 * rows if kind == "token_head" else a
    return flops, bytes_
