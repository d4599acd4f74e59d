"""A quantized KV cache's extra work, in closed form: quantizing what is written and dequantizing
what is read, counted as `kvjax.nn.kv_cache.quantize` / `dequantize` run (derivations below; the
trace checks them per kernel). Pure Python. Scales are f32 (`SCALE_BYTES`):

- "tensor" (fp8's default): one scale per layer for K and one for V (vLLM's uncalibrated 1.0);
- "token_head" (int8's default): one per token per KV head for K and for V, absmax / QMAX of the
  H values, so a cache of kv bytes per element holds (kv + 4/H) bytes per element: int8 with f32
  scales is (1 + 4/H) x half of a bf16 cache.
- "group" (the packed int4 / int2 caches, KIVI: Liu et al., 2024): asymmetric quantization in
  groups of G = kv_group_size elements, an f16 scale and an f16 zero point per group (keys grouped
  per channel along tokens, values per token along channels: the same 4/G bytes per element), so
  int4 is (0.5 + 4/G) bytes per element: 0.625 at G = 32, 0.3125 of a bf16 cache. Closed form
  only: kvjax's model holds no packed array (no trace to compare; the quality evaluation
  simulates its numbers, `kvjax.nn.fake_quant`); the FLOPs below are the algorithm's, as a
  fused kernel would run it. KIVI's full-precision residual (the last R tokens
  kept in f16 until a group fills) is not counted: at most R x 2 bytes per element more.
"""

from __future__ import annotations

from kvjax.model.config import GROUP_SCALE_BYTES, SCALE_BYTES, ModelConfig


def scale_bytes_per_row(cfg: ModelConfig) -> float:
    """The scale bytes of one cached K (or V) row of H elements: an f32 per token per head, or
    (packed) H / G groups of an f16 scale and zero point; 0 without per-row scales."""
    kind = cfg.kv_scale_kind
    if kind == "token_head":
        return SCALE_BYTES
    if kind == "group":
        return cfg.head_dim // cfg.kv_group_size * GROUP_SCALE_BYTES
    return 0


def exact(x: float) -> int | float:
    """An integral byte count as an int (a packed cache's half bytes make floats)."""
    return int(x) if float(x).is_integer() else x


def scale_bytes_per_token_per_layer(cfg: ModelConfig) -> float:
    """A token's K and V scales in one layer: 2 * K rows' scales (`scale_bytes_per_row`)."""
    return 2 * cfg.num_kv_heads * scale_bytes_per_row(cfg)


def tensor_scale_bytes(cfg: ModelConfig) -> int:
    """Per-tensor scales held whatever S and B: a K and a V scale per attention layer (a
    hybrid's state layers hold no KV, so no scales; `kvjax.nn.state_cache`)."""
    return 2 * cfg.num_attention_layers * SCALE_BYTES if cfg.kv_scale_kind == "tensor" else 0


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
    if kind == "group":  # per group of G: min, max (2 an element), (max - min) / levels and the
        # zero point (2 a group); per element: subtract the zero, divide, round, clip (4)
        return 2 * (6 * elements + 2 * (elements // cfg.kv_group_size))
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
    if kind == "group":  # fused into the widening: x * scale + zero (2 an element); its scales
        return 2 * elements, rows * scale_bytes_per_row(cfg)
    scales = rows if kind == "token_head" else 1
    flops = elements + (scales if narrow else 0)
    bytes_ = 4 * elements * a + (scales * (4 + a) if narrow else 0)
    bytes_ += 5 * rows * a + 8 * rows if kind == "token_head" else a
    return flops, bytes_
