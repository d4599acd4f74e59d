"""The kernel classes held out three ways: by source group, by implementation, by chip.

`kvjax validate` holds each row out by its source group (the repository or organisation that
published it: `Row.group`). A model that learned an implementation's or a chip's quirks from its
other groups' rows would pass that test and fail these two: each fitted row predicted by a fit
that never saw its implementation (`implementation_family`: the code that ran, its version
aside), or never saw its chip. Per class and view: the row median of |predicted / measured -
1|, the 80% interval's coverage (nested, as `model.leave_one_source_out` builds it), and the
median of the held-out groups' medians (each group counted once, however many rows it has).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from kvjax.predict import bounds, model
from kvjax.predict.corpus import Row
from kvjax.predict.validate import best_of_each_shape, fit_classes


def implementation_family(text: str | None) -> str:
    """The code a row's `implementation` text names, its version and details aside: the text up
    to its first parenthesis or comma, its first word (a version token after it dropped), and
    PyTorch's operators (torch.mm, torch._scaled_mm, F.linear) as one."""
    head = re.split(r"\s*[(,]", (text or "").strip(), maxsplit=1)[0]
    word = head.split()[0] if head.split() else "unstated"
    return "torch" if re.match(r"torch\b", word) else word


VIEWS: dict[str, Callable[[Row], str]] = {
    "source_group": lambda r: r.group,
    "implementation": lambda r: implementation_family(r.implementation),
    "chip": lambda r: r.chip,
}


def _summary(v: model.Validation, groups: list[str]) -> dict[str, Any]:
    held = ~np.isnan(v.held_out)
    err = np.abs(v.ratio - 1)
    per: dict[str, list[float]] = defaultdict(list)
    for g, e, h in zip(groups, err, held, strict=True):
        if h:
            per[g].append(float(e))
    medians = {g: float(np.median(e)) for g, e in sorted(per.items())}
    return {
        "rows": int(held.sum()),
        "groups": len(per),
        "median_abs_error": float(np.nanmedian(err)),
        # a nested interval is calibrated on a third group's rows: none with two groups
        "coverage_80": v.coverage if len(per) >= 3 else None,
        "median_of_group_medians": float(np.median(list(medians.values()))),
        "group_medians": medians,
    }


def held_out_views(
    rows: list[Row],
    closed: list[bounds.Closed] | None = None,
    views: tuple[str, ...] = tuple(VIEWS),
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per class, per view (`VIEWS`): the class fitted on each shape's fastest rows and each
    row predicted by a fit that left its view's group out (a class with fewer than two groups
    in a view, or too few rows beside its largest, has no entry there)."""
    closed = closed or [bounds.closed_form(r) for r in rows]
    best = best_of_each_shape(rows)
    out: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for view in views:
        if view not in VIEWS:
            raise ValueError(f"view={view!r}; allowed: {', '.join(VIEWS)}")
        key = VIEWS[view]
        for cls, v in fit_classes(rows, closed, key).items():
            idx = [i for i, r in enumerate(rows) if best[i] and model.kernel_class(r.kernel) == cls]
            out[cls][view] = _summary(v, [key(rows[i]) for i in idx])
    return dict(out)
