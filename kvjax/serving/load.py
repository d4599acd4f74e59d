"""Load for the serving clocks: arrivals at a rate (Poisson, or gamma with a burstiness), prompt and
output lengths (fixed, uniform, lognormal, drawn from a dataset's) or a CSV trace, and a shared
prefix (a system prompt of N tokens) for a fraction of the requests. Pure Python + numpy; one
seed gives one load."""

from __future__ import annotations

import csv
import math
from functools import cache
from pathlib import Path

import numpy as np

from kvjax.errors import KvjaxError
from kvjax.serving.scheduler import Request

TRACE_COLUMNS = ("arrival_s", "prompt_len", "output_len")


def lengths(spec: str, n: int, rng: np.random.Generator, name: str) -> list[int]:
    """n lengths from `spec`: "512" (fixed), "uniform:LO:HI" (inclusive), "lognormal:MEDIAN:SIGMA"
    (exp of a normal with that median and sigma, rounded, at least 1), "sample:FILE" (drawn with
    replacement from a CSV's first column of per-sample lengths, under a header: a dataset's)."""
    parts = str(spec).split(":")
    if parts[0] == "sample" and len(parts) >= 2:
        pool = _samples(":".join(parts[1:]), name)
        return [int(x) for x in rng.choice(pool, n)]
    try:
        if len(parts) == 1:
            values = [int(parts[0])] * n
        elif parts[0] == "uniform" and len(parts) == 3:
            lo, hi = int(parts[1]), int(parts[2])
            if lo > hi:
                raise ValueError
            values = [int(x) for x in rng.integers(lo, hi + 1, n)]
        elif parts[0] == "lognormal" and len(parts) == 3:
            median, sigma = float(parts[1]), float(parts[2])
            if median <= 0 or sigma < 0:
                raise ValueError
            values = [max(1, round(x)) for x in rng.lognormal(math.log(median), sigma, n)]
        else:
            raise ValueError
    except ValueError:
        raise KvjaxError(
            f"{name}={spec!r}: give a length (512), uniform:LO:HI, lognormal:MEDIAN:SIGMA "
            "or sample:FILE"
        ) from None
    if min(values, default=1) < 1:
        raise KvjaxError(f"{name}={spec!r}: lengths must be >= 1")
    return values


@cache
def _samples(path: str, name: str) -> np.ndarray:
    """A file's per-sample lengths (its first column under a header), checked."""
    try:
        with open(path, newline="") as f:
            values = np.array([int(r[0]) for r in list(csv.reader(f))[1:] if r], dtype=np.int64)
    except (OSError, ValueError, IndexError) as exc:
        raise KvjaxError(f"{name}=sample:{path}: not a CSV of integer lengths ({exc})") from None
    if values.size == 0 or values.min() < 1:
        raise KvjaxError(f"{name}=sample:{path}: needs at least one length, each >= 1")
    return values


def arrivals(n: int, rate: float, rng: np.random.Generator, cv: float = 1.0) -> list[float]:
    """n arrival times at `rate` requests/s: gaps exponential (Poisson, cv = 1) or gamma with
    coefficient of variation `cv` (burstier above 1), starting at 0."""
    if not (isinstance(rate, int | float) and rate > 0 and math.isfinite(rate)):
        raise KvjaxError(f"rate={rate!r} must be a number > 0 (requests per second)")
    if not cv > 0:
        raise KvjaxError(f"cv={cv!r} must be > 0 (the gaps' coefficient of variation)")
    shape = 1.0 / cv**2
    gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    return list(np.concatenate([[0.0], np.cumsum(gaps[:-1])]))


def generate(
    n: int,
    rate: float,
    prompt: str,
    output: str,
    seed: int = 0,
    cv: float = 1.0,
    prefix_len: int = 0,
    prefix_share: float = 0.0,
) -> list[Request]:
    """n requests; a fraction `prefix_share` of them begins with the same prefix_len tokens (one
    system prompt, added to their prompt lengths)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise KvjaxError(f"requests={n!r} must be an integer >= 1")
    if not 0 <= prefix_share <= 1:
        raise KvjaxError(f"prefix_share={prefix_share!r} must lie in [0, 1]")
    rng = np.random.default_rng(seed)
    times = arrivals(n, rate, rng, cv)
    ps, os_ = lengths(prompt, n, rng, "prompt_len"), lengths(output, n, rng, "output_len")
    shared = rng.random(n) < prefix_share if prefix_len else np.zeros(n, bool)
    return [
        Request(
            i,
            float(t),
            p + (prefix_len if s else 0),
            o,
            prefix_id=0 if s else None,
            prefix_len=prefix_len if s else 0,
        )
        for i, (t, p, o, s) in enumerate(zip(times, ps, os_, shared, strict=True))
    ]


def read_trace(path: str | Path) -> list[Request]:
    """A CSV with columns arrival_s, prompt_len, output_len (one request a row). A malformed
    row is named by file and line."""
    path = Path(path)
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise KvjaxError(f"{path}: {exc.strerror or exc}") from None
    if not rows or any(c not in rows[0] for c in TRACE_COLUMNS):
        raise KvjaxError(f"{path}: needs the columns {', '.join(TRACE_COLUMNS)}")
    out = []
    for line, row in enumerate(rows, start=2):
        try:
            t = float(row["arrival_s"])
            p, o = int(row["prompt_len"]), int(row["output_len"])
            if not (math.isfinite(t) and t >= 0 and p >= 1 and o >= 1):
                raise ValueError
        except (TypeError, ValueError):
            raise KvjaxError(
                f"{path}:{line}: arrival_s >= 0, prompt_len >= 1 and output_len >= 1 expected, "
                f"got {dict(row)}"
            ) from None
        out.append(Request(line - 2, t, p, o))
    return out
