"""Every corpus row against its bound, and the efficiency model fitted on the corpus.

`validate(rows)` is `kvjax validate`'s report: per row the closed form for its exact shape
(`bounds.closed_form`), the bound on its chip, `fraction_of_bound` = bound / measured (above 1:
the measurement beats the bound, which falsifies it), and the prediction with its interval from
a model that never saw the row's source; per kernel class the distribution of the fraction and
the leave-one-source-out error.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

import numpy as np

from kvjax.predict import bounds, model
from kvjax.predict.corpus import COLUMNS, OPTIONAL, Row, read_corpus

_SHAPE = ("chip", "dtype", "kernel", "batch", "seq_q", "seq_kv", "num_heads", "num_kv_heads",
          "head_dim", "causal", "latent_dim", "rope_dim", "m", "n", "k", "model", "context",
          "num_chips", "kv_dtype")  # fmt: skip


def features(closed: bounds.Closed) -> model.Features:
    return model.Features(closed.tile_flops or closed.flops, closed.bytes,
                          closed.peak_flops_per_s, closed.bandwidth_bytes_per_s, closed.tiles,
                          closed.cores)  # fmt: skip


def best_of_each_shape(rows: list[Row]) -> list[bool]:
    """True for the fastest measurement of each (chip, dtype, kernel, shape): what the best
    published implementation reaches there."""
    fastest: dict[tuple, float] = {}
    for r in rows:
        key = tuple(r.values.get(c) for c in _SHAPE)
        fastest[key] = min(fastest.get(key, np.inf), r.measured_s)
    return [r.measured_s == fastest[tuple(r.values.get(c) for c in _SHAPE)] for r in rows]


def fit_classes(rows: list[Row], closed: list[bounds.Closed]) -> dict[str, model.Validation]:
    """Per class, the model fitted on the fastest rows, validated leaving one source out."""
    best = best_of_each_shape(rows)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        if best[i]:
            groups[model.kernel_class(r.kernel)].append(i)
    out = {}
    for cls, idx in groups.items():
        by_source = defaultdict(int)
        for i in idx:
            by_source[rows[i].source_key] += 1
        if len(by_source) < 2 or len(idx) - max(by_source.values()) < 2:
            continue  # too few rows to hold a source out (the committed corpus's fit applies)
        out[cls] = model.leave_one_source_out(
            [features(closed[i]) for i in idx], [rows[i].measured_s for i in idx],
            [rows[i].source_key for i in idx],
        )  # fmt: skip
    return out


@functools.lru_cache(maxsize=1)
def corpus_fits() -> dict[str, model.Fit]:
    """The committed corpus's fit per class (what `calc --predict` and `frontier --predict`
    use), computed once a process."""
    rows = read_corpus()
    closed = [bounds.closed_form(r) for r in rows]
    return {cls: v.fit for cls, v in fit_classes(rows, closed).items()}


def validate(rows: list[Row]) -> dict[str, Any]:
    closed = [bounds.closed_form(r) for r in rows]
    fits = fit_classes(rows, closed)
    best = best_of_each_shape(rows)
    held: dict[int, tuple[float, bool]] = {}
    for cls, v in fits.items():
        idx = [i for i, r in enumerate(rows) if best[i] and model.kernel_class(r.kernel) == cls]
        for j, i in enumerate(idx):
            held[i] = (float(v.held_out[j]), bool(v.covered[j]))
    out_rows = []
    fallback = None
    for i, (r, c) in enumerate(zip(rows, closed, strict=True)):
        fitted = fits.get(model.kernel_class(r.kernel))
        if fitted is not None:
            fitted = fitted.fit
        else:  # a class these rows cannot fit alone: the committed corpus's model predicts it
            fallback = fallback if fallback is not None else corpus_fits()
            fitted = fallback.get(model.kernel_class(r.kernel))
        record = {k: r.values.get(k) for k in (*COLUMNS, *OPTIONAL)}
        record.update(file=r.path, line=r.line)
        fraction = c.bound_s / r.measured_s
        record.update(
            closed_flops=c.flops, closed_bytes=c.bytes, closed_intensity=c.intensity,
            peak_flops_per_s=c.peak_flops_per_s, bandwidth_bytes_per_s=c.bandwidth_bytes_per_s,
            bound_s=c.bound_s, bound_side="compute" if c.flops / c.peak_flops_per_s
            >= c.bytes / c.bandwidth_bytes_per_s else "memory",
            fraction_of_bound=fraction, above_bound=bool(fraction > 1.0), best_of_shape=best[i],
        )  # fmt: skip
        if fitted is not None:
            p, lo, hi = (float(x[0]) for x in fitted.interval([features(c)]))
            record.update(predicted_s=p, predicted_lo_s=lo, predicted_hi_s=hi)
        else:
            record.update(predicted_s=None, predicted_lo_s=None, predicted_hi_s=None)
        h = held.get(i)
        record.update(held_out_predicted_s=h[0] if h else None,
                      held_out_covered=h[1] if h else None)  # fmt: skip
        out_rows.append(record)
    classes = {}
    for cls in model.CLASSES:
        fr = [rec["fraction_of_bound"] for rec in out_rows
              if model.kernel_class(rec["kernel"]) == cls]  # fmt: skip
        if not fr:
            continue
        q = np.quantile(fr, [0.0, 0.1, 0.5, 0.9, 1.0])
        entry: dict[str, Any] = {
            "rows": len(fr), "above_bound": int(sum(f > 1 for f in fr)),
            "fraction_of_bound": dict(zip(("min", "p10", "median", "p90", "max"),
                                          map(float, q), strict=True)),
        }  # fmt: skip
        v = fits.get(cls)
        if v is not None:
            entry.update(
                fit=v.fit.to_dict(), fitted_rows=v.fit.rows, sources=v.fit.sources,
                loso_median_abs_error=v.median_abs_error, loso_coverage_80=v.coverage,
            )  # fmt: skip
        classes[cls] = entry
    return {
        "rows": out_rows,
        "classes": classes,
        "summary": {
            "rows": len(rows),
            "sources": len({r.source_key for r in rows}),
            "above_bound": sum(rec["above_bound"] for rec in out_rows),
        },
    }
