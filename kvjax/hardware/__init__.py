"""Chips: what one is (`spec`: `ChipSpec`, peak FLOP/s per dtype, bandwidth, capacity, link,
on-chip memory, each number's source) and the ones kvjax knows (`chips`: NVIDIA Hopper,
Blackwell and Ampere, AMD CDNA 3, Google TPUs, `get_chip`).

    spec    ChipSpec, chip_from_numbers (a chip given by numbers), TERA and GIGA
    chips   CHIPS, the datasheets' chips, and get_chip
"""

from kvjax.hardware.chips import CHIPS, get_chip
from kvjax.hardware.spec import GIGA, TERA, ChipSpec, chip_from_numbers

__all__ = ["CHIPS", "GIGA", "TERA", "ChipSpec", "chip_from_numbers", "get_chip"]
