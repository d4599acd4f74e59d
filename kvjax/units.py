"""Formatting of sizes and rates. Sizes shown as KiB/MiB/GiB/TiB are binary; rates and GB are
decimal (1 GB/s = 1e9 B/s). Every label says which."""

from __future__ import annotations

import math

_BINARY = [("B", 1), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40), ("PiB", 2**50)]


def sig(x: float, digits: int = 3) -> str:
    """`x` to `digits` significant figures, without an exponent for ordinary magnitudes."""
    if x == 0 or not math.isfinite(x):
        return str(x if not math.isfinite(x) else 0)
    magnitude = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - magnitude)
    rounded = round(x, decimals)
    if abs(rounded) >= 10 ** (magnitude + 1):  # 9.996 -> 10.0: one decimal fewer
        decimals = max(0, decimals - 1)
    return f"{x:,.{decimals}f}"


def fmt_bytes(n: float, unit: str | None = None, digits: int = 3) -> str:
    """Binary size: `fmt_bytes(2.5 * 2**30) == '2.50 GiB'`; `unit` forces one of B..PiB."""
    if unit is None:
        unit = "B"
        for name, size in _BINARY:
            if abs(n) >= size:
                unit = name
    size = dict(_BINARY)[unit]
    return f"{sig(n / size, digits)} {unit}"


def fmt_rate(x: float, unit: str, digits: int = 3) -> str:
    """Decimal rate: fmt_rate(3.35e12, 'B/s') == '3.35 TB/s'."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{sig(x / scale, digits)} {prefix}{unit}"
    return f"{sig(x, digits)} {unit}"


def fmt_seconds(s: float, digits: int = 3) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{sig(s / scale, digits)} {unit}"
    return f"{sig(s / 1e-9, digits)} ns"


def fmt_count(x: float, digits: int = 3) -> str:
    """Decimal count: 7.24e9 -> '7.24 G'."""
    return fmt_rate(x, "", digits).strip()
