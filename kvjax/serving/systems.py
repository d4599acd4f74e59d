"""Published serving-system results (`experiments/published/systems.csv`: MLPerf Inference, the
engines' performance tables, reports of serving at scale; issue 50) against the system bound of
`kvjax.serving.system_bound`, per row: the bound of the row's metric on its chips, measured over
bound for a throughput (bound over measured for a latency), and whether the row beats it.

A row says what it can; where a source is silent the bound takes what favours the system, so it
stays a bound: the chips as one replica (more chips together hold a larger batch than apart), the
shortest prompt where no input length is published (the dataset's shortest where
experiments/published/lengths.csv states it, else 1 token; a stated placement of
`replicas` copies is kept: each copy's bound, times the copies), the least per token where no
output length is, an fp8 cache where the cache dtype is not stated, and the chip's fastest
matmul dtype the weights allow where the compute dtype is not. FP4 weights (NVFP4: 4.5 bits an
element) are sized at 4 bits. A `per_node` row is a node of 8 chips. The prediction beside the
bound (`kvjax.serving.system_predict`: the simulator on the row's engine, held out by group) is
slow to run for every row: its committed results (experiments/results/system_predictions.csv)
fill `predicted_value` where it ran (null elsewhere), and its 80% interval (`predicted_lo`,
`predicted_hi`) is calibrated on the other source groups' whole-system residuals (`_calibrate`)."""

from __future__ import annotations

import csv
import math
from functools import cache
from pathlib import Path
from typing import Any

from kvjax.dtypes import dtype_key
from kvjax.errors import KvjaxError
from kvjax.hardware import get_chip
from kvjax.model.config import get_model_config
from kvjax.serving.system_bound import LATENCY, THROUGHPUT, metric_bound, system_bound

SYSTEMS_CSV = Path(__file__).resolve().parents[2] / "experiments" / "published" / "systems.csv"
PREDICTIONS_CSV = SYSTEMS_CSV.parents[1] / "results" / "system_predictions.csv"
# the named length distributions the rows use, with what their sources state (min, mean, cap)
LENGTHS_CSV = SYSTEMS_CSV.with_name("lengths.csv")
COLUMNS = (
    "source, source_group, chip, num_chips, model, weight_dtype, kv_dtype, compute_dtype, tp, pp, "
    "ep, dp_attention, replicas, scenario, input_len, output_len, length_distribution, requests, "
    "concurrency, rate_per_s, slo_ttft_s, slo_tpot_s, slo_percentile, metric, scope, measured, "
    "convention, confidence"
).split(", ")
SCENARIOS = ("offline", "server", "interactive", "concurrency", "rate", "prefill_only",
             "decode_only")  # fmt: skip
SCOPES = ("system", "per_chip", "per_node", "per_user")
NODE_CHIPS = 8


def is_systems_csv(path: str | Path) -> bool:
    """A CSV in the systems corpus's form (its header has `metric` and `scenario`)."""
    with open(path, newline="") as f:
        header = next(csv.reader(f), [])
    return "metric" in header and "scenario" in header


def _number(path, line, row, column, integer=False):
    text = (row.get(column) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise KvjaxError(f"{path}:{line}: {column}={text!r} is not a number") from None
    if not value > 0 or not math.isfinite(value):
        raise KvjaxError(f"{path}:{line}: {column}={text!r} must be a positive number")
    return int(value) if integer else value


def read_systems(path: str | Path = SYSTEMS_CSV) -> list[dict[str, Any]]:
    """The rows, each checked: the columns present, the names allowed, the numbers positive."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise KvjaxError(f"{path}: columns missing: {', '.join(missing)}")
        rows = []
        for line, raw in enumerate(reader, start=2):
            for column, allowed in (("scenario", SCENARIOS), ("scope", SCOPES),
                                    ("metric", sorted(THROUGHPUT | LATENCY))):  # fmt: skip
                if raw[column] not in allowed:
                    raise KvjaxError(f"{path}:{line}: {column}={raw[column]!r} is not one of: "
                                     f"{', '.join(allowed)}")  # fmt: skip
            row = dict(raw, file_line=f"{Path(path).name}:{line}")
            for column in ("num_chips", "tp", "pp", "ep", "replicas", "requests", "concurrency"):
                row[column] = _number(path, line, raw, column, integer=True)
            for column in ("input_len", "output_len", "measured", "rate_per_s"):
                row[column] = _number(path, line, raw, column)
            if row["measured"] is None or row["num_chips"] is None:
                raise KvjaxError(f"{path}:{line}: measured and num_chips are required")
            get_chip(row["chip"]), get_model_config(row["model"])  # named, or refused by name
            rows.append(row)
    return rows


@cache
def _bound(model, chip_name, devices, weight, kv, compute, inp, out, phase, prefill_len=None):
    chip = get_chip(chip_name)
    cfg = get_model_config(model, weight_dtype="fp8" if weight == "fp4" else weight, kv_dtype=kv)
    if compute is None:  # the fastest the chip has that the weights allow
        compute = next(d for d in ("fp4", "fp8", "bf16") if d in chip.peak_flops_per_s and
                       (d != "fp4" or weight == "fp4"))  # fmt: skip
    cfg = cfg.replace(matmul_dtype=compute)
    return system_bound(cfg, chip, devices, inp, out, weight_scale=0.5 if weight == "fp4" else 1,
                        phase=phase, prefill_len=prefill_len)  # fmt: skip


def row_bound(row: dict[str, Any]) -> dict[str, Any]:
    """The bound of one row's metric at its scope, and what the row left to the bound."""
    assumed = []
    chip = get_chip(row["chip"])
    weight = dtype_key(row["weight_dtype"]) if row["weight_dtype"] else None
    if weight is None:  # the lightest weights the chip computes
        weight = "fp4" if "fp4" in chip.peak_flops_per_s else "fp8"
        assumed.append(f"{weight} weights")
    kv = dtype_key(row["kv_dtype"]) if row["kv_dtype"] else "fp8"
    if not row["kv_dtype"]:
        assumed.append("fp8 cache")
    compute = dtype_key(row["compute_dtype"]) if row["compute_dtype"] else None
    if compute is None:
        assumed.append("the chip's fastest matmul dtype")
    inp, prefill_len = row["input_len"], None
    lengths = read_lengths().get(row.get("length_distribution") or "", {})
    if inp is None and lengths.get("input_min"):  # every prompt at least the dataset's shortest
        inp, prefill_len = lengths["input_min"], lengths.get("input_mean")
        assumed.append(
            f"prompts of {inp:.0f} tokens, the dataset's shortest ({LENGTHS_CSV.name}), but for "
            + (f"the prefill's FLOPs, at its mean {prefill_len:.0f} (convex: Jensen)"
               if prefill_len else "nothing")
        )  # fmt: skip
    elif inp is None:
        assumed.append("1-token prompts (no input length published)")
    out = row["output_len"]
    metric, scenario = row["metric"], row["scenario"]
    phase = {"prefill_only": "prefill", "decode_only": "decode"}.get(scenario, "serve")
    if out is None and metric in THROUGHPUT and phase == "serve":
        phase = "decode"
        assumed.append("decodes alone at the prompt's context (no output length published)")
    chips = row["num_chips"]
    replicas = row["replicas"] or 1
    if chips % replicas:
        raise KvjaxError(f"{row['file_line']}: replicas={replicas} does not divide "
                         f"num_chips={chips}")  # fmt: skip
    if replicas == 1 and chips > 1:
        assumed.append(f"the {chips} chips as one replica")
    b = _bound(
        row["model"],
        row["chip"],
        chips // replicas,
        weight,
        kv,
        compute,
        max(1, math.floor(inp or 1)),
        out or 1,
        phase,
        prefill_len,
    )  # a mean's floor: still a bound
    value = metric_bound(b, metric) * (replicas if metric in THROUGHPUT else 1)
    if row["scope"] == "per_chip":
        value /= chips
    elif row["scope"] == "per_node":
        value *= NODE_CHIPS / chips
    elif row["scope"] == "per_user" and metric in THROUGHPUT:
        value = 1 / b.tpot_s
    latency = metric in LATENCY
    fraction = value / row["measured"] if latency else row["measured"] / value
    return {"bound_value": value, "bound_side": b.side, "fraction_of_bound": fraction,
            "above_bound": fraction > 1 + 1e-9, "bound_assumes": assumed,
            "predicted_value": None, "predicted_lo": None, "predicted_hi": None}  # fmt: skip


@cache
def read_lengths(path: Path = LENGTHS_CSV) -> dict[str, dict[str, Any]]:
    """The committed length distributions by name: each stated statistic as a number (None where
    its source states none)."""
    if not path.exists():
        return {}
    stats = ("samples", "input_min", "input_mean", "input_max", "input_cap", "output_mean")
    with open(path, newline="") as f:
        return {r["name"]: {**r, **{k: float(r[k]) if r[k] else None for k in stats}}
                for r in csv.DictReader(f)}  # fmt: skip


def read_predictions(path: Path = PREDICTIONS_CSV) -> dict[tuple[str, str], dict[str, Any]]:
    """The committed predictions by row (source, metric) (none when the file is absent; a file
    without a `metric` column predicted output tokens/s)."""
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        return {(r["source"], r.get("metric") or "output_tokens_per_s"): {
                    **r, **{k: float(r[k]) if r.get(k) else None
                            for k in ("predicted_value", "predicted_lo", "predicted_hi")}}
                for r in csv.DictReader(f)}  # fmt: skip


def _by_group(held: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per source group: its predicted rows, their median |predicted/measured - 1| and the share
    inside their 80% interval."""
    import numpy as np

    out = {}
    for g in sorted({r["source_group"] for r in held}):
        rs = [r for r in held if r["source_group"] == g]
        inside = [r["predicted_lo"] <= r["measured"] <= r["predicted_hi"] for r in rs
                  if r["predicted_lo"] is not None]  # fmt: skip
        out[g] = {"rows": len(rs),
                  "median_abs_error": float(np.median([abs(r["predicted_value"] / r["measured"]
                                                           - 1) for r in rs])),
                  "coverage_80": float(np.mean(inside)) if inside else None}  # fmt: skip
    return out


def _calibrate(predicted: list[dict[str, Any]]) -> None:
    """Each predicted row's 80% interval, calibrated on whole systems: the split-conformal ends of
    log(measured / predicted) over the other source groups' rows (`conformal_ends`), times its
    prediction. Nested as it is: no system row enters a fit (the simulator's steps are fitted
    on kernels and engine steps, without the row's group), so no residual that calibrates a
    group came from a prediction that saw it. The simulator's own interval, run at the ends of
    the held-out steps' interval, stays as `simulated_lo`/`_hi`: it carries the steps'
    uncertainty only, not the engine's (`simulated_coverage_80` in the summary)."""
    import numpy as np

    from kvjax.predict.model import LEVEL, conformal_ends

    groups = np.array([r["source_group"] for r in predicted])
    resid = np.log([r["measured"] / r["predicted_value"] for r in predicted])
    for r in predicted:
        r.update(simulated_lo=r["predicted_lo"], simulated_hi=r["predicted_hi"])
    for g in set(groups):
        others = resid[groups != g]
        if len(others) < 2:
            continue
        lo, hi = conformal_ends(others, (1 - LEVEL) / 2)
        for r in (r for r, h in zip(predicted, groups, strict=True) if h == g):
            r.update(predicted_lo=r["predicted_value"] * math.exp(lo),
                     predicted_hi=r["predicted_value"] * math.exp(hi))  # fmt: skip


def validate_systems(rows: list[dict[str, Any]]) -> tuple[list[dict], dict[str, Any]]:
    """Each row with its bound; the class `system`'s summary (rows, groups, above, fractions)."""
    import numpy as np

    out = [{**r, **row_bound(r)} for r in rows]
    predicted = read_predictions()
    for r in out:
        p = predicted.get((r["source"], r["metric"]))
        if p is not None:
            r.update(predicted_value=p["predicted_value"], predicted_lo=p.get("predicted_lo"),
                     predicted_hi=p.get("predicted_hi"), prediction_from=p["step_fit"],
                     held_out_predicted_value=p["predicted_value"]
                     if p["step_fit"].startswith("held out") else None)  # fmt: skip
    _calibrate([r for r in out if r.get("predicted_value") is not None])
    held = [r for r in out if r.get("held_out_predicted_value") is not None]
    errors = [abs(r["predicted_value"] / r["measured"] - 1) for r in held]
    spans = [r for r in held if r["predicted_lo"] is not None]
    covered = [r["predicted_lo"] <= r["measured"] <= r["predicted_hi"] for r in spans]
    widths = [(r["predicted_hi"] - r["predicted_lo"]) / r["predicted_value"] for r in spans]
    simulated = [r["simulated_lo"] <= r["measured"] <= r["simulated_hi"] for r in spans
                 if r["simulated_lo"] is not None]  # fmt: skip
    f = np.array([r["fraction_of_bound"] for r in out])
    summary = {
        "rows": len(out), "above_bound": int(sum(r["above_bound"] for r in out)),
        "sources": len({r["source_group"] for r in out}),
        "fraction_of_bound": {k: float(v) for k, v in zip(
            ("min", "p10", "median", "p90", "max"), np.quantile(f, [0, 0.1, 0.5, 0.9, 1]),
            strict=True)},
        "predicted_rows": len(errors),
        "loso_median_abs_error": float(np.median(errors)) if errors else None,
        "loso_coverage_80": float(np.mean(covered)) if covered else None,
        "interval_80_median_width": float(np.median(widths)) if widths else None,
        "simulated_coverage_80": float(np.mean(simulated)) if simulated else None,
        "by_group": _by_group(held),
        "prediction": f"the simulator on the row's engine, held out by group, for {len(errors)} "
                      "rows (experiments/results/system_predictions.csv); none elsewhere",
    }  # fmt: skip
    return out, summary
