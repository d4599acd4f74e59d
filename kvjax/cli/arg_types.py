"""Argument types every `kvjax` subcommand shares: each parses one flag's value and refuses a bad
one in a line that names it (argparse adds "argument --flag:"): positive integers (8k = 8192),
positive numbers, numbers in a sane range, fractions, lists of integers, dtype names."""

from __future__ import annotations

import argparse
import math

from kvjax.dtypes import allowed_dtypes, dtype_refusal
from kvjax.errors import KvjaxError
from kvjax.model.config import canonical_dtype

_SUFFIXES = {"k": 2**10, "m": 2**20}
MAX_INT = 2**53  # beyond this an integer is no longer exact as a float: no real batch or context


def positive_int(text: str) -> int:
    """An integer > 0; '8k' = 8192 and '1m' = 1048576 (binary, as context lengths are quoted)."""
    raw = text.strip().lower().replace("_", "")
    scale = 1
    if raw and raw[-1] in _SUFFIXES:
        raw, scale = raw[:-1], _SUFFIXES[raw[-1]]
    try:
        value = int(raw) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a positive integer (e.g. 8192 or 8k)"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer (> 0)")
    if value > MAX_INT:
        raise argparse.ArgumentTypeError(f"{text[:20]!r}... is too large (at most 2**53)")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 3.35e12)") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def in_range(low: float, high: float, unit: str):
    """A positive number within [low, high] (a chip's rate or size): 1e-300 B/s is a typo, not
    a chip, and would print infinite times."""

    def parse(text: str) -> float:
        value = positive_float(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text!r} is outside the sane range {low:g} .. {high:g} {unit}"
            )
        return value

    return parse


def dtype_name(text: str, packed: bool = False, compute: bool = False) -> str:
    """A dtype flag's value, canonical ('fp16' -> 'f16'); refused with the names and aliases."""
    try:
        return canonical_dtype(text, packed=packed, compute=compute)
    except KvjaxError:
        allowed = allowed_dtypes(packed, compute)
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a dtype{dtype_refusal(text, allowed)}"
        ) from None


def matmul_dtype_name(text: str) -> str:
    """A matmul input dtype: the model dtypes and fp4 (a chip's FP4 tensor-core peak)."""
    return dtype_name(text, compute=True)


def kv_dtype_name(text: str) -> str:
    """A KV-cache dtype: the model dtypes and the packed int4 / int2 (closed form only)."""
    return dtype_name(text, packed=True)


def fraction(text: str) -> float:
    """A number in [0, 1] (a probability)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number in [0, 1]") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must lie in [0, 1]")
    return value


def int_list(text: str) -> list[int]:
    """A comma-separated list of positive integers: 1,2,4,8."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of integers, e.g. 1,2,4,8"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} must list positive integers, e.g. 1,2,4,8")
    if any(v > MAX_INT for v in values):
        raise argparse.ArgumentTypeError(f"{text[:20]!r}... lists a value too large (> 2**53)")
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{text!r} lists {repeated[0]} more than once")
    return values


def instances_spec(text: str) -> tuple[int, int]:
    """Disaggregated instances as xPyD (2P2D: two prefill instances, two decode instances)."""
    raw = text.strip().upper()
    p, _, d = raw.partition("P")
    if not (d.endswith("D") and p.isdigit() and d[:-1].isdigit()):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not xPyD: the prefill and decode instances, e.g. 1P1D or 2P3D"
        )
    x, y = int(p), int(d[:-1])
    if min(x, y) < 1 or max(x, y) > 1024:
        raise argparse.ArgumentTypeError(f"{text!r}: each of x and y must lie in 1 .. 1024")
    return x, y
