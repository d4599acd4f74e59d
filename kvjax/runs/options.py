"""Experiment options, typed: each experiment module declares `OPTIONS` (name -> `Option`), and
every point's `options:` is checked against it with the rest of the config, before any point
runs. An unknown key is refused with the allowed ones; a value of the wrong type or range is
refused naming the key and what it must be (a typo is never silently ignored, `contexts:
[1024, -5]` never writes negative byte counts)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvjax.dtypes import dtype_choices, dtype_key
from kvjax.errors import KvjaxError


@dataclass(frozen=True)
class Option:
    check: Callable[[Any], bool]
    want: str  # what is allowed, in words


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v and abs(v) != 1e999


POSITIVE_INT = Option(lambda v: _int(v) and v > 0, "a positive integer")
NONNEGATIVE_INT = Option(lambda v: _int(v) and v >= 0, "an integer >= 0")
POSITIVE = Option(lambda v: _number(v) and v > 0, "a positive number")
NONNEGATIVE = Option(lambda v: _number(v) and v >= 0, "a number >= 0")
FRACTION = Option(lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]")
BOOLEAN = Option(lambda v: isinstance(v, bool), "true or false")


def one_of(*allowed: str) -> Option:
    return Option(lambda v: v in allowed, f"one of: {', '.join(allowed)}")


def dtype_of(*allowed: str) -> Option:
    """A dtype name among `allowed`, or an alias of one ('fp16' for f16; `kvjax.dtypes`)."""
    return Option(
        lambda v: isinstance(v, str) and dtype_key(v) in allowed,
        f"one of: {dtype_choices(allowed)}",
    )


def list_of(item: Option) -> Option:
    return Option(
        lambda v: isinstance(v, list) and len(v) > 0 and all(item.check(x) for x in v),
        f"a non-empty list, each {item.want}",
    )


PAIRS = Option(
    lambda v: (
        isinstance(v, list)
        and len(v) > 0
        and all(
            isinstance(p, list) and len(p) == 2 and all(POSITIVE_INT.check(x) for x in p) for p in v
        )
    ),
    "a non-empty list of [context, batch] pairs of positive integers",
)


def check_options(module, points, source) -> None:
    """Every point's options against `module.OPTIONS` (an experiment without one takes none)."""
    from omegaconf import OmegaConf

    schema: dict[str, Option] = getattr(module, "OPTIONS", {})
    name = module.__name__.rsplit(".", 1)[-1]
    for point in points:
        options = OmegaConf.to_container(point.options, resolve=True)
        for key, value in options.items():
            if key not in schema:
                allowed = ", ".join(sorted(schema)) or "none"
                raise KvjaxError(
                    f"{source}: options.{key}: unknown option for experiment {name} "
                    f"(allowed: {allowed})"
                )
            if not schema[key].check(value):
                raise KvjaxError(f"{source}: options.{key}={value!r} must be {schema[key].want}")
