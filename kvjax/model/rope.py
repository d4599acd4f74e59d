"""RoPE frequency scaling for long contexts, as Hugging Face computes it
(`transformers.modeling_rope_utils`): Llama 3.1's `llama3` (the low frequencies divided by the
factor, the high ones kept, a smooth ramp between) and YaRN (Peng et al. 2023, arXiv:2309.00071:
the same idea with the ramp set by rotations counted over the original context, plus a
temperature `attention_factor` on cos and sin). Pure Python in float32 steps like the reference:
the model embeds the result as constants, and neither changes a kernel's cost but the RoPE
tables' (kvjax.analytic.primitives.rope_cost: `table` and `attention_factor`).

`linear` scaling (positions / factor) stays `ModelConfig.rope_linear_factor`.
"""

from __future__ import annotations

import math

import numpy as np

SCALINGS = ("none", "llama3", "yarn")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's 0.1 * mscale * ln(factor) + 1 (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def inverse_frequencies(cfg, dim: int, theta: float) -> np.ndarray:
    """The `dim // 2` inverse frequencies (float32) of a RoPE of width `dim` and base `theta`
    under `cfg.rope_scaling` (fields `rope_factor`, `rope_original_context`,
    `rope_low_freq_factor` / `rope_high_freq_factor` for llama3, `rope_beta_fast` /
    `rope_beta_slow` / `rope_truncate` for YaRN)."""
    f32 = np.float32
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(f32) / f32(dim)
    pos_freqs = np.power(f32(theta), exponents, dtype=f32)
    inv_freq = (f32(1.0) / pos_freqs).astype(f32)
    factor, original = cfg.rope_factor, cfg.rope_original_context
    if cfg.rope_scaling == "llama3":
        low_wavelen = original / cfg.rope_low_freq_factor
        high_wavelen = original / cfg.rope_high_freq_factor
        wavelen = (f32(2 * math.pi) / inv_freq).astype(f32)
        scaled = np.where(wavelen > low_wavelen, inv_freq / f32(factor), inv_freq).astype(f32)
        low, high = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        smooth = ((f32(original) / wavelen - f32(low)) / f32(high - low)).astype(f32)
        smoothed = (1 - smooth) * scaled / f32(factor) + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(f32)
    if cfg.rope_scaling == "yarn":

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

        low, high = correction_dim(cfg.rope_beta_fast), correction_dim(cfg.rope_beta_slow)
        if cfg.rope_truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # the reference's guard against a zero-width ramp
        ramp = np.clip((np.arange(dim // 2, dtype=f32) - f32(low)) / f32(high - low), 0, 1)
        extrapolation = (1 - ramp).astype(f32)
        interpolation = (f32(1.0) / (f32(factor) * pos_freqs)).astype(f32)
        return (interpolation * (1 - extrapolation) + inv_freq * extrapolation).astype(f32)
    return inv_freq
