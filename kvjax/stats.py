"""Statistics of repeated runs: the mean of a quality metric over seeds with its Student-t
confidence interval, and a table of them per (task, num_kv_heads, ...) group. Pure numpy/scipy
(scipy comes with jax)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvjax.errors import KvjaxError


@dataclass(frozen=True)
class Interval:
    """mean +- half_width: the `level` two-sided Student-t interval of n values."""

    mean: float
    half_width: float
    n: int
    std: float
    level: float = 0.95

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high


def t_critical(level: float, dof: int) -> float:
    """The two-sided Student-t critical value (t_{(1+level)/2, dof})."""
    from scipy import stats

    if not 0 < level < 1:
        raise KvjaxError(f"level={level!r} must be in (0, 1)")
    if dof < 1:
        raise KvjaxError(f"dof={dof} must be >= 1 (at least two values)")
    return float(stats.t.ppf((1 + level) / 2, dof))


def mean_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean and Student-t interval (sample standard deviation, n - 1 degrees of freedom); one
    value has no interval (half width nan)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise KvjaxError("mean_interval needs at least one value")
    if x.size == 1:
        return Interval(float(x[0]), float("nan"), 1, float("nan"), level)
    std = float(x.std(ddof=1))
    half = t_critical(level, x.size - 1) * std / np.sqrt(x.size)
    return Interval(float(x.mean()), float(half), int(x.size), std, level)


def paired_difference(a: pd.Series, b: pd.Series, level: float = 0.95) -> Interval:
    """The interval of a - b paired by index (the seed: the same data order, and for the
    conversions the same MHA model, on both sides), which removes the seed-to-seed spread the
    two means share. Both sides must hold the same seeds."""
    if set(a.index) != set(b.index):
        raise KvjaxError(
            f"paired values need the same seeds on both sides: {sorted(a.index)} against "
            f"{sorted(b.index)}"
        )
    return mean_interval((a - b.loc[a.index]).to_numpy(), level)


def summarize(
    df: pd.DataFrame, by: Sequence[str], metrics: Sequence[str], level: float = 0.95
) -> pd.DataFrame:
    """One row per group of `by`: for each metric its mean, CI half width, n and std over the
    group's rows (the seeds)."""
    rows = []
    for key, g in df.groupby(list(by), sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key, strict=True))
        for m in metrics:
            values = g[m].dropna()
            if values.empty:
                continue
            ci = mean_interval(values, level)
            row.update({m: ci.mean, f"{m}_ci": ci.half_width, f"{m}_n": ci.n, f"{m}_std": ci.std})
        rows.append(row)
    return pd.DataFrame(rows)


def detectable_difference(std: float, n: int, level: float = 0.95, power: float = 0.8) -> float:
    """The smallest true mean difference a paired two-sided t-test of n pairs (at `level`) finds
    with probability `power`, for pairs whose differences spread by `std`: the d at which the
    noncentral t (noncentrality d sqrt(n) / std, n - 1 degrees of freedom) falls outside
    +-t_crit that often (a power note: differences below it can go undetected)."""
    from scipy import optimize, stats

    if not 0 < power < 1:
        raise KvjaxError(f"power={power!r} must be in (0, 1)")
    if not np.isfinite(std) or std < 0:
        raise KvjaxError(f"std={std!r} must be a finite number >= 0")
    t = t_critical(level, n - 1)
    if std == 0:
        return 0.0

    def short(d: float) -> float:
        nc = d * np.sqrt(n) / std
        other_tail = np.nan_to_num(stats.nct.cdf(-t, n - 1, nc))  # scipy: nan where ~1e-20
        return stats.nct.sf(t, n - 1, nc) + other_tail - power

    high = 2 * (t + stats.t.ppf(power, n - 1) + 1) * std / np.sqrt(n)  # power there is ~1
    return float(optimize.brentq(short, 0.0, high, xtol=1e-12 * std))
