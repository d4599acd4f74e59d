"""Every corpus row against its bound, and the efficiency model fitted on the corpus.

`validate(rows)` is `kvjax validate`'s report: per row the closed form for its exact shape
(`bounds.closed_form`): the bound on its chip (`bound_flops`, `bound_bytes`: exact FLOPs and
compulsory bytes, what any implementation does; `bound_s` their max over the roofs),
`fraction_of_bound` = bound / measured (above 1: the measurement beats the bound, which
falsifies it), the implementation model's counts (`closed_flops`, `closed_bytes`: one plan's
tiles, re-reads and partials, what the prediction is fitted on), and the prediction with its
80% interval (its lower edge no lower than the bound): for a row of the committed corpus,
from the fit that left the row's source group out (its interval nested:
`model.leave_one_source_out`), so `predicted_s` is `held_out_predicted_s`; for
a row of any other CSV (a new source), from the fit on the whole corpus. Each row says which
(`prediction_from`). Per kernel class: the distribution of the fraction and the held-out error,
coverage and interval width over the corpus's source groups.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from kvjax.predict import bounds, heldout, model
from kvjax.predict.corpus import COLUMNS, CORPUS_DIR, OPTIONAL, TIMING, Row, read_corpus
from kvjax.predict.groups import implementation_of

# a row's shape: its columns but where it came from and what it measured, and its chips, cache
# and window
_NOT_SHAPE = ("source", "source_group", "implementation", "measured_s", "convention", "confidence")
_SHAPE = (*(c for c in COLUMNS if c not in _NOT_SHAPE), "num_chips", "kv_dtype", "window")


def features(closed: bounds.Closed) -> model.Features:
    return model.Features(
        closed.tile_flops or closed.flops,
        closed.bytes,
        closed.peak_flops_per_s,
        closed.bandwidth_bytes_per_s,
        closed.tiles,
        closed.cores,
        closed.special_s,
        closed.family,
        closed.launches,
        closed.fill,
        closed.serial_s,
        closed.stretch,
    )


def best_of_each_shape(rows: list[Row]) -> list[bool]:
    """True for the fastest measurement of each (chip, dtype, kernel, shape): what the best
    published implementation reaches there."""
    fastest: dict[tuple, float] = {}
    for r in rows:
        key = tuple(r.values.get(c) for c in _SHAPE)
        fastest[key] = min(fastest.get(key, np.inf), r.measured_s)
    return [r.measured_s == fastest[tuple(r.values.get(c) for c in _SHAPE)] for r in rows]


def fit_classes(
    rows: list[Row], closed: list[bounds.Closed], group: Callable[[Row], str] | None = None
) -> dict[str, model.Validation]:
    """Per class, the model fitted on the fastest rows, validated leaving one group out: a
    source group (`Row.group`), or what `group` says of a row (`views`: an implementation, a
    chip)."""
    group = group or (lambda r: r.group)
    best = best_of_each_shape(rows)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        if best[i]:
            groups[model.kernel_class(r.kernel)].append(i)
    out = {}
    for cls, idx in groups.items():
        by_group = defaultdict(int)
        for i in idx:
            by_group[group(rows[i])] += 1
        if len(by_group) < 2 or len(idx) - max(by_group.values()) < 2:
            continue  # too few rows to hold a group out
        out[cls] = model.leave_one_source_out(
            [features(closed[i]) for i in idx],
            [rows[i].measured_s for i in idx],
            [group(rows[i]) for i in idx],
        )
    return out


def in_corpus(row: Row) -> bool:
    """A row of the committed corpus (experiments/published/), not of a user's CSV."""
    from pathlib import Path

    return Path(row.path).resolve().parent == CORPUS_DIR.resolve()


def corpus_rows(without: str | None = None) -> list[Row]:
    """The committed corpus's rows; `without`: but those of that serving implementation's own
    code (`groups.implementation_of`: what a prediction held out by implementation never sees)."""
    rows = [r for r in read_corpus() if in_corpus(r)]
    if without is None:
        return rows
    return [r for r in rows if implementation_of(r.values.get("implementation")) != without]


@functools.cache
def corpus_classes(without: str | None = None) -> dict[str, model.Validation]:
    """The committed corpus's classes (`corpus_rows(without)`), each fitted and validated leaving
    one group out, computed once a process."""
    rows = corpus_rows(without)
    return fit_classes(rows, [bounds.closed_form(r) for r in rows])


def corpus_fits() -> dict[str, model.Fit]:
    """The committed corpus's fit per class on every group (what `calc --predict` and
    `frontier --predict` use)."""
    return {cls: v.fit for cls, v in corpus_classes().items()}


def by_timing(records: list[dict]) -> dict[str, dict[str, Any]]:
    """The held-out rows of a class by how their sources timed them (`corpus.TIMING`; "unstated"
    where the source does not say): rows, groups, the median |predicted / measured - 1|, the
    median predicted / measured (below 1: the rows took longer than the model predicts, as a
    host's dispatch adds) and the 80% interval's coverage."""
    out: dict[str, dict[str, Any]] = {}
    for key in (*TIMING, "unstated"):
        sel = [r for r in records if (r.get("timing") or "unstated") == key]
        if not sel:
            continue
        ratio = [r["held_out_predicted_s"] / r["measured_s"] for r in sel]
        out[key] = {
            **heldout.summary(ratio, [r["held_out_covered"] for r in sel]),
            "groups": len({r["source_group"] for r in sel}),
        }
    return out


def validate(rows: list[Row]) -> dict[str, Any]:
    """`kvjax validate`'s report (the module docstring): every row, the classes, the summary."""
    closed = [bounds.closed_form(r) for r in rows]
    corpus = [in_corpus(r) for r in rows]
    ours = [i for i, c in enumerate(corpus) if c]
    fits = fit_classes([rows[i] for i in ours], [closed[i] for i in ours]) if ours else {}
    best = best_of_each_shape(rows)
    held: dict[int, bool] = {}  # a fitted (fastest) corpus row: inside its held-out interval
    for cls, v in fits.items():
        idx = [i for i in ours if best[i] and model.kernel_class(rows[i].kernel) == cls]
        for j, i in enumerate(idx):
            if not np.isnan(v.held_out[j]):
                held[i] = bool(v.covered[j])
    whole: list[dict | None] = [None]  # the whole corpus's fits, computed once when needed
    out_rows = [
        _record(r, c, fits if corpus[i] else {}, corpus[i], best[i], held.get(i), whole)
        for i, (r, c) in enumerate(zip(rows, closed, strict=True))
    ]
    classes = {cls: _class_entry(cls, out_rows, fits.get(cls)) for cls in model.CLASSES}
    return {
        "rows": out_rows,
        "classes": {cls: e for cls, e in classes.items() if e is not None},
        "summary": {
            "rows": len(rows),
            "sources": len({r.source_key for r in rows}),
            "source_groups": len({r.group for r in rows}),
            "above_bound": sum(rec["above_bound"] for rec in out_rows),
        },
    }


def _record(
    r: Row,
    c: bounds.Closed,
    fits: dict,
    in_committed: bool,
    best: bool,
    covered: bool | None,
    whole: list,
) -> dict[str, Any]:
    """One row's record: its columns, its bound and the closed form's counts, and the
    prediction with its interval from the fit that left its group out (the whole corpus's fit
    for a new source's row, or a group no fit can leave out), saying which."""
    v = fits.get(model.kernel_class(r.kernel))
    fitted = v.held_fits.get(r.group) if v is not None else None
    if fitted is not None:
        source = f"held out: fitted without the source group {r.group!r}"
    else:
        if whole[0] is None:
            whole[0] = corpus_fits()
        fitted = whole[0].get(model.kernel_class(r.kernel))
        source = "the committed corpus's fit (every group)" if fitted is not None else None
        if in_committed and fitted is not None:
            source += ", in sample"
    record = {k: r.values.get(k) for k in (*COLUMNS, *OPTIONAL)}
    record.update(file=r.path, line=r.line, source_group=r.group)
    fraction = c.bound_s / r.measured_s
    record.update(
        bound_flops=c.floor_flops,
        bound_bytes=c.floor_bytes,
        bound_intensity=c.intensity,
        closed_flops=c.flops,
        closed_bytes=c.bytes,
        closed_intensity=c.flops / c.bytes,
        peak_flops_per_s=c.peak_flops_per_s,
        bandwidth_bytes_per_s=c.bandwidth_bytes_per_s,
        bound_s=c.bound_s,
        bound_side=c.bound_side,
        fraction_of_bound=fraction,
        above_bound=bool(fraction > 1.0),
        best_of_shape=best,
        # a decode row's schedule: its implementation's rule (`implementations`), or "kvjax"
        # where no rule names it (kvjax's own plan); the programs it launches and the busiest
        # core's walk over the mean core's
        schedule=c.schedule or None,
        programs=c.tiles if c.schedule else None,
        stretch=c.stretch if c.schedule else None,
    )
    if fitted is not None:
        p, lo, hi = (float(x[0]) for x in fitted.interval([features(c)]))
        lo = max(lo, c.bound_s)  # no implementation beats the bound
        record.update(predicted_s=p, predicted_lo_s=lo, predicted_hi_s=hi)
    else:
        record.update(predicted_s=None, predicted_lo_s=None, predicted_hi_s=None)
    held_out = source is not None and source.startswith("held out")
    record.update(
        prediction_from=source,
        held_out_predicted_s=record["predicted_s"] if held_out else None,
        held_out_covered=covered,
    )
    return record


def _class_entry(cls: str, out_rows: list[dict], v) -> dict[str, Any] | None:
    """A class's fractions of the bound and, where it was fitted, its fit and held-out figures
    (None: no row of the class)."""
    fr = [rec["fraction_of_bound"] for rec in out_rows if model.kernel_class(rec["kernel"]) == cls]
    if not fr:
        return None
    q = np.quantile(fr, [0.0, 0.1, 0.5, 0.9, 1.0])
    entry: dict[str, Any] = {
        "rows": len(fr),
        "above_bound": int(sum(f > 1 for f in fr)),
        "fraction_of_bound": dict(
            zip(("min", "p10", "median", "p90", "max"), map(float, q), strict=True)
        ),
    }
    if v is not None:
        held = [
            rec
            for rec in out_rows
            if rec["held_out_covered"] is not None and model.kernel_class(rec["kernel"]) == cls
        ]
        entry.update(
            fit=v.fit.to_dict(),
            fitted_rows=v.fit.rows,
            sources=v.fit.sources,
            loso_median_abs_error=v.median_abs_error,
            loso_coverage_80=v.coverage,
            interval_80_median_width=v.median_interval_width,
            by_timing=by_timing(held),
        )
    return entry
