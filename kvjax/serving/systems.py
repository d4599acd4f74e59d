"""Published serving-system results (`experiments/published/systems.csv`: MLPerf Inference, the
engines' performance tables, reports of serving at scale) against the system bound of
`kvjax.serving.system_bound`, per row: the bound of the row's metric on its chips, measured over
bound for a throughput (bound over measured for a latency), and whether the row beats it.

A row says what it can; where a source is silent the bound takes what favours the system, so it
stays a bound, and `bound_assumes` says what it took: the chips as one replica (more chips
together hold a larger batch than apart), the shortest prompt where no input length is published
(the dataset's shortest where experiments/published/lengths.csv states it, else 1 token; a
stated placement of `replicas` copies is kept: each copy's bound, times the copies), the least
per token where no output length is, and the lowest precisions the chip computes where the
source leaves them open (`favourable_dtypes`): FP4 weights and compute and a 4-bit cache on a
chip with an FP4 peak, else one byte. FP4 weights (NVFP4: 4.5 bits an element) are sized at 4
bits. A `per_node` row is a node of 8 chips. What an engine did that changes the physics is
bounded with it (`spec_tokens`: speculative decoding's drafted tokens a step, every draft taken
as accepted; `cached_input_fraction`: input tokens a prefix cache served), and where a source
says it was used without a number (`used`), at its most favourable value. Every row names the
code that ran it (`implementation`, `kvjax.predict.groups`), which is what its prediction is
held out from (`kvjax.serving.system_predict`, `kvjax.serving.system_summary`)."""

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
# columns a user's CSV may leave out (empty: not stated); the committed corpus fills them
OPTIONAL = (
    "implementation",
    "engine_version",
    "spec_tokens",
    "acceptance",
    "cached_input_fraction",
)
USED = "used"  # a column's value where a source says the feature ran, without a number
SCENARIOS = (
    "offline",
    "server",
    "interactive",
    "concurrency",
    "rate",
    "prefill_only",
    "decode_only",
)
SCOPES = ("system", "per_chip", "per_node", "per_user")
NODE_CHIPS = 8


def is_systems_csv(path: str | Path) -> bool:
    """A CSV in the systems corpus's form (its header has `metric` and `scenario`)."""
    with open(path, newline="") as f:
        header = next(csv.reader(f), [])
    return "metric" in header and "scenario" in header


def _number(path, line, row, column, integer=False, zero=False, used=False):
    """A column's number (None: empty); `zero`: 0 allowed; `used`: the word `used` allowed."""
    text = (row.get(column) or "").strip()
    if not text:
        return None
    if used and text == USED:
        return USED
    try:
        value = float(text)
    except ValueError:
        also = f" or {USED!r}" if used else ""
        raise KvjaxError(f"{path}:{line}: {column}={text!r} is not a number{also}") from None
    if not (value >= 0 if zero else value > 0) or not math.isfinite(value):
        least = "a number >= 0" if zero else "a positive number"
        raise KvjaxError(f"{path}:{line}: {column}={text!r} must be {least}")
    if integer and value != int(value):
        raise KvjaxError(f"{path}:{line}: {column}={text!r} must be a whole number")
    return int(value) if integer else value


def _engine_columns(path, line, raw, row) -> None:
    """What an engine did that changes the physics: drafted tokens a step, their acceptance,
    the input tokens a prefix cache served."""
    row["implementation"] = (raw.get("implementation") or "").strip()
    row["engine_version"] = (raw.get("engine_version") or "").strip()
    row["spec_tokens"] = _number(path, line, raw, "spec_tokens", integer=True, zero=True, used=True)
    row["acceptance"] = _number(path, line, raw, "acceptance")
    row["cached_input_fraction"] = _number(
        path, line, raw, "cached_input_fraction", zero=True, used=True
    )
    if row["acceptance"] is not None and row["acceptance"] > 1:
        raise KvjaxError(f"{path}:{line}: acceptance={row['acceptance']} must lie in (0, 1]")
    cached = row["cached_input_fraction"]
    if cached not in (None, USED) and cached >= 1:
        raise KvjaxError(f"{path}:{line}: cached_input_fraction={cached} must lie in [0, 1)")


def read_systems(path: str | Path = SYSTEMS_CSV) -> list[dict[str, Any]]:
    """The rows, each checked: the columns present, the names allowed, the numbers positive."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise KvjaxError(f"{path}: columns missing: {', '.join(missing)}")
        rows = []
        for line, raw in enumerate(reader, start=2):
            for column, allowed in (
                ("scenario", SCENARIOS),
                ("scope", SCOPES),
                ("metric", sorted(THROUGHPUT | LATENCY)),
            ):
                if raw[column] not in allowed:
                    raise KvjaxError(
                        f"{path}:{line}: {column}={raw[column]!r} is not one of: "
                        f"{', '.join(allowed)}"
                    )
            row = dict(raw, file_line=f"{Path(path).name}:{line}")
            for column in ("num_chips", "tp", "pp", "ep", "replicas", "requests", "concurrency"):
                row[column] = _number(path, line, raw, column, integer=True)
            for column in ("input_len", "output_len", "measured", "rate_per_s"):
                row[column] = _number(path, line, raw, column)
            _engine_columns(path, line, raw, row)
            if row["measured"] is None or row["num_chips"] is None:
                raise KvjaxError(f"{path}:{line}: measured and num_chips are required")
            get_chip(row["chip"]), get_model_config(row["model"])  # named, or refused by name
            rows.append(row)
    return rows


def favourable_dtypes(
    chip, is_mla: bool, weight: str | None, kv: str | None, compute: str | None
) -> tuple[str, str, str, list[str]]:
    """The row's weight, cache and compute dtypes, each the stated one or, where its source
    leaves it open, the lowest precision the chip computes (a bound takes the most favourable
    value): weights and compute in FP4 on a chip with an FP4 peak, else one byte (fp8, or int8
    where the chip has no fp8); the cache in 4 bits beside FP4 (`int4` with one scale a row,
    lighter than NVFP4's 4.5 bits; MLA's latent: fp8, the least kvjax models), else one byte;
    compute the chip's fastest that the weights allow (FP4 only with FP4 weights). The list:
    what was assumed, in words."""
    peaks = chip.peak_flops_per_s
    byte = "fp8" if "fp8" in peaks else "int8"
    assumed = []
    if weight is None:
        weight = "fp4" if "fp4" in peaks else byte
        assumed.append(f"{weight} weights (the lowest precision {chip.name} computes)")
    if kv is None:
        kv = "int4" if "fp4" in peaks and not is_mla else byte
        said = "a 4-bit" if kv == "int4" else f"an {kv}"
        assumed.append(f"{said} cache (the lowest precision {chip.name} computes)")
    if compute is None:
        compute = next(
            d
            for d in ("fp4", "fp8", "int8", "bf16")
            if d in peaks and (d != "fp4" or weight == "fp4")
        )
        assumed.append(f"{compute} matmuls (the chip's fastest the weights allow)")
    return weight, kv, compute, assumed


@cache
def _bound(
    model,
    chip_name,
    devices,
    weight,
    kv,
    compute,
    inp,
    out,
    phase,
    prefill_len=None,
    spec=0,
    cached=0.0,
):
    chip = get_chip(chip_name)
    base = get_model_config(model)
    group = {"kv_group_size": base.head_dim} if kv == "int4" else {}  # one scale a row
    cfg = base.replace(
        weight_dtype="fp8" if weight == "fp4" else weight,
        kv_dtype=kv,
        matmul_dtype=compute,
        **group,
    )
    return system_bound(
        cfg,
        chip,
        devices,
        inp,
        out,
        spec,
        0.5 if weight == "fp4" else 1,
        phase,
        prefill_len,
        cached,
    )


def _engine_terms(row, inp) -> tuple[float, float, list[str]]:
    """The row's drafted tokens a step and cached input share, as the bound takes them."""
    assumed = []
    spec = row.get("spec_tokens") or 0
    if spec == USED:
        spec = math.inf
        assumed.append(
            "speculative decoding with no stated draft length: every decode in one "
            "verification step"
        )
    elif spec:
        assumed.append(f"{spec} drafted tokens a step, every draft accepted")
    cached = row.get("cached_input_fraction") or 0.0
    if cached == USED:
        cached = (inp - 1) / inp  # every token of a prompt but its last
        assumed.append(
            "prefix caching with no stated hit rate: every prompt token but the last "
            "served from the cache"
        )
    elif cached:
        assumed.append(
            f"{cached:.1%} of input tokens from a prefix cache, charged no prefill FLOPs"
        )
    return spec, cached, assumed


def row_bound(row: dict[str, Any]) -> dict[str, Any]:
    """The bound of one row's metric at its scope, and what the row left to the bound."""
    chip = get_chip(row["chip"])
    stated = [
        dtype_key(row[c]) if row[c] else None for c in ("weight_dtype", "kv_dtype", "compute_dtype")
    ]
    weight, kv, compute, assumed = favourable_dtypes(
        chip, get_model_config(row["model"]).is_mla, *stated
    )
    inp, prefill_len = row["input_len"], None
    lengths = read_lengths().get(row.get("length_distribution") or "", {})
    if inp is None and lengths.get("input_min"):  # every prompt at least the dataset's shortest
        inp, prefill_len = lengths["input_min"], lengths.get("input_mean")
        assumed.append(
            f"prompts of {inp:.0f} tokens, the dataset's shortest ({LENGTHS_CSV.name}), but for "
            + (
                f"the prefill's FLOPs, at its mean {prefill_len:.0f} (convex: Jensen)"
                if prefill_len
                else "nothing"
            )
        )
    elif inp is None:
        assumed.append("1-token prompts (no input length published)")
    inp = max(1, math.floor(inp or 1))  # a mean's floor: still a bound
    out = row["output_len"]
    metric, scenario = row["metric"], row["scenario"]
    phase = {"prefill_only": "prefill", "decode_only": "decode"}.get(scenario, "serve")
    if out is None and metric in THROUGHPUT and phase == "serve":
        phase = "decode"
        assumed.append("decodes alone at the prompt's context (no output length published)")
    chips = row["num_chips"]
    replicas = row["replicas"] or 1
    if chips % replicas:
        raise KvjaxError(
            f"{row['file_line']}: replicas={replicas} does not divide num_chips={chips}"
        )
    if replicas == 1 and chips > 1:
        assumed.append(f"the {chips} chips as one replica")
    spec, cached, said = _engine_terms(row, inp)
    b = _bound(
        row["model"],
        row["chip"],
        chips // replicas,
        weight,
        kv,
        compute,
        inp,
        out or 1,
        phase,
        prefill_len,
        spec,
        cached,
    )
    value = metric_bound(b, metric) * (replicas if metric in THROUGHPUT else 1)
    if row["scope"] == "per_chip":
        value /= chips
    elif row["scope"] == "per_node":
        value *= NODE_CHIPS / chips
    elif row["scope"] == "per_user" and metric in THROUGHPUT:
        value = 1 / b.tpot_s
    latency = metric in LATENCY
    fraction = value / row["measured"] if latency else row["measured"] / value
    return {
        "bound_value": value,
        "bound_side": b.side,
        "fraction_of_bound": fraction,
        "above_bound": fraction > 1 + 1e-9,
        "bound_assumes": assumed + said,
        "predicted_value": None,
        "predicted_lo": None,
        "predicted_hi": None,
    }


@cache
def read_lengths(path: Path = LENGTHS_CSV) -> dict[str, dict[str, Any]]:
    """The committed length distributions by name: each stated statistic as a number (None where
    its source states none)."""
    if not path.exists():
        return {}
    stats = ("samples", "input_min", "input_mean", "input_max", "input_cap", "output_mean")
    with open(path, newline="") as f:
        return {
            r["name"]: {**r, **{k: float(r[k]) if r[k] else None for k in stats}}
            for r in csv.DictReader(f)
        }


def read_predictions(path: Path = PREDICTIONS_CSV) -> dict[tuple[str, str], dict[str, Any]]:
    """The committed predictions by row (source, metric) (none when the file is absent; a file
    without a `metric` column predicted output tokens/s)."""
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        return {
            (r["source"], r.get("metric") or "output_tokens_per_s"): {
                **r,
                **{
                    k: float(r[k]) if r.get(k) else None
                    for k in ("predicted_value", "predicted_lo", "predicted_hi")
                },
            }
            for r in csv.DictReader(f)
        }


def validate_systems(
    rows: list[dict[str, Any]], predictions: dict[tuple[str, str], dict] | None = None
) -> tuple[list[dict], dict[str, Any]]:
    """Each row with its bound and, where one ran, its prediction (`predictions`, by (source,
    metric); None: the committed ones); the class `system`'s summary
    (`system_summary.summarize`). Fresh predictions of a user's rows are calibrated on the
    committed corpus's predicted rows beside their own (`system_summary.calibrate`)."""
    from kvjax.serving.system_summary import attach, summarize

    out = [{**r, **row_bound(r)} for r in rows]
    if predictions is None:
        attach(out, read_predictions())
        return out, summarize(out)
    ours = {(r["source"], r["metric"]) for r in out}
    committed = read_predictions()
    reference = [
        {**committed[k], **r}
        for r in read_systems()
        if (k := (r["source"], r["metric"])) in committed and k not in ours
    ]
    fresh = [
        dict(r, **predictions[k]) for r in out if (k := (r["source"], r["metric"])) in predictions
    ]
    attach(out, predictions, reference + fresh)
    return out, summarize(out)
