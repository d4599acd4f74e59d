"""A GEMM as the implementation model sees it: its work units over the cores (`gemm_tiles`: the
output tiles and a split along K, as cuBLAS's split-K and stream-K and DeepGEMM's block choice
fill the cores) and the family its efficiencies are fitted per (`gemm_family`: a chip's compute
design, and FP4's block-scaled formats apart, whose bytes count their scales: `fp4_bits`)."""

from __future__ import annotations

import math

from kvjax.hardware import CHIPS, ChipSpec

TILE = 128  # the output tile GEMM and attention kernels hand one core (the wave term's unit)
SPLIT_K = 512  # the shortest stretch of K a GEMM's split hands one core


def gemm_tiles(m: int, n: int, k: int, groups: int, cores: int) -> int:
    """The work units a GEMM hands the cores: its 128 x 128 output tiles, each split along K
    into s stretches of `SPLIT_K` or more, s the split whose last wave of tiles is fullest (the
    least s of those): what cuBLAS's split-K and stream-K and DeepGEMM's block choice do when the
    output tiles alone fill the cores badly (17 tiles of a 128 x 2112 output on 132 SMs: split
    7 ways, 119 units in one wave, where unsplit 13% of the wave would be busy)."""
    tiles = groups * math.ceil(m / TILE) * math.ceil(n / TILE)
    best, units = 0.0, tiles
    for s in range(1, max(1, k // SPLIT_K) + 1):
        w = tiles * s / (math.ceil(tiles * s / cores) * cores)
        if w > best + 1e-12:
            best, units = w, tiles * s
    return units


def gemm_family(chip: ChipSpec, dtype: str) -> str:
    """The family a GEMM's efficiencies are fitted per: its chip's compute design, and for FP4's
    block-scaled formats (NVFP4, MXFP4) the format too, whose kernels reach a fraction of the FP4
    peak and of the bandwidth of their own (the scales' loads and the epilogue do not double
    with the FP4 rate)."""
    return compute_family(chip) + (" fp4" if dtype == "fp4" else "")


def compute_family(chip: ChipSpec) -> str:
    """The chips of one compute design (the same 16-bit peak over as many cores: the H100 SXM,
    H800 and H200 are one GH100; the H20 is one cut to 78 SMs and capped), joined by '/'."""
    key = (chip.peak_flops_per_s.get("bf16"), chip.num_cores)
    same = [n for n, c in CHIPS.items() if (c.peak_flops_per_s.get("bf16"), c.num_cores) == key]
    return "/".join(same) if chip.name in same else chip.name


def fp4_bits(implementation: str | None) -> float:
    """Bits an FP4 element takes with its block's scale: MXFP4 (OCP: an e8m0 a block of 32)
    4.25, NVFP4 (an e4m3 a block of 16, and the format an FP4 row names by default) 4.5."""
    text = implementation or ""
    return 4.25 if "MXF4" in text or "MXFP4" in text else 4.5
