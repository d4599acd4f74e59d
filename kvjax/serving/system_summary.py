"""The serving systems' predictions held out by implementation, and their summary.

A row's prediction (`kvjax.serving.system_predict`) comes from kernel classes and an engine-step
overhead fitted without any row of the row's implementation (`kvjax.predict.groups`); its 80%
interval is calibrated without them too: split-conformal on log(measured / predicted) of the
other implementations' predicted system rows on the row's chip family (`calibrate`), where they
number `MIN_CALIBRATION` or more. The chip family, because a prediction's error is as much the
chip's as the engine's: a family without its own kernels in the corpus (AMD's, today) is
predicted on other chips' efficiencies, and its residuals say nothing of a Hopper row's. Where
fewer do, the interval is the simulator's own, run at the ends of the held-out engine steps'
nested interval (steps of other implementations only), and the row says so (`interval_from`): it
carries the steps' uncertainty, not the engine's.

The summary (`kvjax validate --json`, `classes.system`): the pooled median |predicted / measured
- 1| and the 80% interval's coverage over every held-out row, and the same per implementation,
per chip family and per source group (who published), each with the median of its groups'
medians beside the pooled one (a group of many rows weighs as one there).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvjax.predict.groups import chip_family
from kvjax.predict.heldout import conformal_ends, summary

MIN_CALIBRATION = 20  # system rows of other implementations an interval is calibrated on, least


def attach(
    rows: list[dict[str, Any]],
    predictions: dict[tuple[str, str], dict],
    reference: list[dict[str, Any]] | None = None,
) -> None:
    """Each row's prediction (by its source and metric), where one ran, and its interval
    calibrated by implementation on `reference`'s predicted rows (None: these rows')."""
    for r in rows:
        p = predictions.get((r["source"], r["metric"]))
        if p is None:
            continue
        how = p.get("prediction_from") or p.get("step_fit") or ""
        r.update(
            predicted_value=p["predicted_value"],
            predicted_lo=p.get("predicted_lo"),
            predicted_hi=p.get("predicted_hi"),
            prediction_from=how,
            held_out_predicted_value=p["predicted_value"] if how.startswith("held out") else None,
        )
    predicted = [r for r in rows if r.get("predicted_value") is not None]
    calibrate(predicted, predicted if reference is None else reference)


def calibrate(predicted: list[dict[str, Any]], reference: list[dict[str, Any]]) -> None:
    """Each predicted row's 80% interval from the whole-system residuals of `reference`'s rows of
    other implementations on its chip family (`conformal_ends`), times its prediction, where
    they number `MIN_CALIBRATION` or more; else the simulator's interval at the held-out steps'
    ends. The simulator's interval stays as `simulated_lo`/`_hi` on every row. A row that names
    no implementation is calibrated on every reference row of its family but itself."""
    impl = np.array([r.get("implementation") or "" for r in reference])
    family = np.array([chip_family(r["chip"]) for r in reference])
    keys = [(r["source"], r["metric"]) for r in reference]
    resid = np.log([r["measured"] / r["predicted_value"] for r in reference])
    for r in predicted:
        r.update(simulated_lo=r["predicted_lo"], simulated_hi=r["predicted_hi"])
    for r in predicted:
        name = r.get("implementation") or ""
        keep = (impl != name) if name else np.array([k != (r["source"], r["metric"]) for k in keys])
        others = resid[keep & (family == chip_family(r["chip"]))] if len(resid) else resid
        if len(others) < MIN_CALIBRATION:
            r["interval_from"] = (
                f"the held-out engine steps' interval, simulated (other implementations' system "
                f"rows on its chip family: {len(others)}, under {MIN_CALIBRATION})"
            )
            continue
        lo, hi = conformal_ends(others)
        r["predicted_lo"] = r["predicted_value"] * math.exp(lo)
        r["predicted_hi"] = r["predicted_value"] * math.exp(hi)
        r["interval_from"] = (
            f"the other implementations' {len(others)} system rows on its chip family"
        )


def _errors(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`heldout.summary` of the rows' predicted / measured, coverage and interval widths."""
    spans = [r for r in rows if r.get("predicted_lo") is not None]
    return summary(
        [r["predicted_value"] / r["measured"] for r in rows],
        [r["predicted_lo"] <= r["measured"] <= r["predicted_hi"] for r in spans],
        [(r["predicted_hi"] - r["predicted_lo"]) / r["predicted_value"] for r in spans],
    )


def by(rows: list[dict[str, Any]], key) -> dict[str, dict[str, Any]]:
    """`_errors` per value of `key(row)`."""
    keys = sorted({key(r) for r in rows})
    return {k: _errors([r for r in rows if key(r) == k]) for k in keys}


def median_of_medians(groups: dict[str, dict[str, Any]]) -> float | None:
    return float(np.median([g["median_abs_error"] for g in groups.values()])) if groups else None


def summarize(out: list[dict[str, Any]]) -> dict[str, Any]:
    """The class `system`: rows, groups, above the bound, the fractions, and the held-out
    predictions pooled, by implementation, by chip family and by source group."""
    held = [r for r in out if r.get("held_out_predicted_value") is not None]
    f = np.array([r["fraction_of_bound"] for r in out])
    pooled = _errors(held) if held else {}
    simulated = [
        r["simulated_lo"] <= r["measured"] <= r["simulated_hi"]
        for r in held
        if r.get("simulated_lo") is not None
    ]
    groups = {
        "by_implementation": by(held, lambda r: r.get("implementation") or "unstated"),
        "by_chip_family": by(held, lambda r: chip_family(r["chip"])),
        "by_group": by(held, lambda r: r["source_group"]),
    }
    return {
        "rows": len(out),
        "above_bound": int(sum(r["above_bound"] for r in out)),
        "sources": len({r["source_group"] for r in out}),
        "implementations": len({r.get("implementation") or "unstated" for r in out}),
        "fraction_of_bound": {
            k: float(v)
            for k, v in zip(
                ("min", "p10", "median", "p90", "max"),
                np.quantile(f, [0, 0.1, 0.5, 0.9, 1]),
                strict=True,
            )
        },
        "predicted_rows": len(held),
        "loso_median_abs_error": pooled.get("median_abs_error"),
        "loso_coverage_80": pooled.get("coverage_80"),
        "interval_80_median_width": pooled.get("interval_80_median_width"),
        "simulated_coverage_80": float(np.mean(simulated)) if simulated else None,
        "median_of_implementation_medians": median_of_medians(groups["by_implementation"]),
        "median_of_group_medians": median_of_medians(groups["by_group"]),
        **groups,
        "prediction": f"the simulator on the row's engine, every fit and its interval held out "
        f"by implementation, for {len(held)} rows (`kvjax validate --predict`; "
        "the committed corpus's: experiments/results/system_predictions.csv)",
    }
