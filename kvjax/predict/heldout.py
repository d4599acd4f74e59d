"""Held out: each row predicted by a model that never saw its group, inside an 80% interval
calibrated on residuals that never saw it either, and the summary of how that went. Written
once for every prediction kvjax validates: the kernel classes (`kvjax.predict.model`), the
engine-step overhead (`kvjax.predict.steps`) and the serving systems
(`kvjax.serving.system_summary`).

The interval is split-conformal (Vovk, Gammerman and Shafer 2005; Lei et al. 2018, "Distribution-
Free Predictive Inference for Regression"): the order statistics ceil((n + 1)(1 - a)) from each
side of n calibration residuals log(measured / predicted), which cover a new row with
probability >= 1 - 2a when it is exchangeable with them. Nested: the residuals that calibrate
group g's interval are those of every other group h, each predicted by a model fitted on neither
g nor h, so nothing that sets g's interval saw g. Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

LEVEL = 0.8  # the intervals' nominal coverage
M = TypeVar("M")


def conformal_ends(resid: np.ndarray, a: float = (1 - LEVEL) / 2) -> tuple[float, float]:
    """Split-conformal ends: the order statistics ceil((n + 1)(1 - a)) from each side of n
    calibration residuals (the finite-sample rank that keeps coverage >= 1 - 2a)."""
    r = np.sort(np.asarray(resid, float))
    n = len(r)
    k = min(n, math.ceil((n + 1) * (1 - a)))
    return float(r[n - k]), float(r[k - 1])


@dataclass(frozen=True)
class Nested(Generic[M]):
    """Leave-one-group-out with nested intervals: per group the model fitted without it and its
    interval's (lo, hi) on log(measured / predicted); each row's held-out prediction and
    residual (nan where no model could be fitted without its group)."""

    alone: dict[str, M | None]
    ends: dict[str, tuple[float, float]]
    predicted: np.ndarray
    resid: np.ndarray

    def covered(self, groups: Sequence[str]) -> np.ndarray:
        """Each row inside its group's nested interval (False where its group has none)."""
        out = np.zeros(len(self.resid), bool)
        g = np.asarray(groups)
        for name, (lo, hi) in self.ends.items():
            rows = g == name
            out[rows] = (self.resid[rows] >= lo) & (self.resid[rows] <= hi)
        return out


def leave_one_group_out(
    groups: Sequence[str],
    measured: Sequence[float],
    fit_without: Callable[..., M | None],
    predict: Callable[[M, np.ndarray], np.ndarray],
) -> Nested[M]:
    """`fit_without(*groups)`: a model fitted on the rows of every other group (None: too few
    rows); `predict(model, rows)`: its predictions for the rows selected by a boolean mask. Each
    group's interval is calibrated on the other groups' residuals under models that saw neither
    (each pair fitted once)."""
    y = np.asarray(measured, float)
    g = np.asarray(groups)
    names = sorted(set(groups))
    alone = {name: fit_without(name) for name in names}
    predicted = np.full(len(y), np.nan)
    for name, model in alone.items():
        if model is not None:
            rows = g == name
            predicted[rows] = predict(model, rows)
    resid = np.log(y / predicted)
    pairs: dict[frozenset, M | None] = {}
    ends = {}
    for name in names:
        calib = []
        for other in names:
            if other == name:
                continue
            key = frozenset((name, other))
            if key not in pairs:
                pairs[key] = fit_without(name, other)
            if pairs[key] is not None:
                rows = g == other
                calib.append(np.log(y[rows] / predict(pairs[key], rows)))
        if alone[name] is not None and calib:
            ends[name] = conformal_ends(np.concatenate(calib))
    return Nested(alone, ends, predicted, resid)


def summary(
    ratio: Sequence[float],
    covered: Sequence[bool] | None = None,
    widths: Sequence[float] | None = None,
) -> dict[str, float | int]:
    """Rows, the median |predicted / measured - 1|, the median predicted / measured, and where
    given the share of rows inside their 80% interval and the interval's median width (relative
    to the prediction; None where no row has one): the figures every held-out report gives."""
    r = np.asarray(ratio, float)
    out = {
        "rows": len(r),
        "median_abs_error": float(np.median(np.abs(r - 1))),
        "median_ratio": float(np.median(r)),
    }
    if covered is not None:
        out["coverage_80"] = float(np.mean(covered)) if len(covered) else None
    if widths is not None:
        out["interval_80_median_width"] = float(np.median(widths)) if len(widths) else None
    return out
