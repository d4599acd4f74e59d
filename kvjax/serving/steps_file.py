"""The steps an engine measured, as a file: `kvjax serve --save-steps` writes an engine's limits
and its runs of (batch, seconds) steps as JSON (`save_steps`), and `kvjax simulate --step-time
fitted --steps` reads them back (`load_steps`), each field checked and a file that is not one
named with what it lacks."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from kvjax.errors import KvjaxError
from kvjax.serving.fitted import feature_names

STEPS_FORMAT = "kvjax serve steps, v1"
ENGINE_KEYS = (
    "model",
    "device",
    "max_batch",
    "max_len",
    "token_budget",
    "page_size",
    "kv_pool_tokens",
    "buckets",
)
POSITIVE_KEYS = ("max_batch", "max_len", "token_budget", "page_size", "kv_pool_tokens")
# written since the calibration on the step clock; a file without them: every feature, and
# every run but the last a calibration run
OPTIONAL_KEYS = ("features", "calibration_runs")


def save_steps(path, engine: dict, runs: Sequence[Sequence]) -> None:
    """An engine's measured runs (each a list of `MeasuredStep`s: its `calibration_runs` first,
    the served one last) and its limits (`ENGINE_KEYS`, the fitted `features`), as JSON
    (atomically): `kvjax serve --save-steps`, read back by `load_steps`."""
    from kvjax.files import write_json_atomic

    out = [[[[list(e) for e in s.batch], s.wall_s, s.start_s] for s in run] for run in runs]
    keys = [*ENGINE_KEYS, *(k for k in OPTIONAL_KEYS if k in engine)]
    write_json_atomic(path, {"format": STEPS_FORMAT, **{k: engine[k] for k in keys}, "runs": out})


def load_steps(path) -> tuple[dict, list[list[tuple[tuple, float]]]]:
    """(the engine's limits with its `features` and `calibration_runs`, its runs of (batch,
    seconds) steps) of a `save_steps` file; a file that is not one is named with what it
    lacks."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise KvjaxError(
            f"{path}: not a steps file of `kvjax serve --save-steps` ({exc})"
        ) from None
    if not isinstance(data, dict) or data.get("format") != STEPS_FORMAT:
        raise KvjaxError(
            f"{path}: not a steps file of `kvjax serve --save-steps` "
            f"(format {STEPS_FORMAT!r} expected)"
        )
    _check_engine(path, data)
    runs = _read_runs(path, data)
    full = feature_names(data["buckets"])
    names = data.get("features", list(full))
    if not isinstance(names, list) or not names or any(n not in full for n in names):
        raise KvjaxError(f"{path}: features={names!r} must be a list of {list(full)}")
    calib = data.get("calibration_runs", max(1, len(runs) - 1))
    if isinstance(calib, bool) or not isinstance(calib, int) or not 1 <= calib <= len(runs):
        raise KvjaxError(
            f"{path}: calibration_runs={calib!r} must be an integer in 1..{len(runs)} (the runs)"
        )
    return {
        **{k: data[k] for k in ENGINE_KEYS},
        "features": tuple(names),
        "calibration_runs": calib,
    }, runs


def _check_engine(path, data: dict) -> None:
    """The engine's limits: present, positive, buckets increasing up to min(token_budget,
    max_len), a pool of at least a page."""
    missing = [k for k in (*ENGINE_KEYS, "runs") if k not in data]
    if missing:
        raise KvjaxError(f"{path}: missing {', '.join(missing)}")
    for k in POSITIVE_KEYS:
        v = data[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise KvjaxError(f"{path}: {k}={v!r} must be a positive integer")
    b = data["buckets"]
    if (
        not isinstance(b, list)
        or not b
        or b != sorted(set(b))
        or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in b)
    ):
        raise KvjaxError(f"{path}: buckets={b!r} must be increasing positive integers")
    if b[-1] != min(data["token_budget"], data["max_len"]):
        raise KvjaxError(
            f"{path}: the largest bucket {b[-1]} is not min(token_budget, max_len)"
            f" = {min(data['token_budget'], data['max_len'])}"
        )
    if data["kv_pool_tokens"] < data["page_size"]:
        raise KvjaxError(
            f"{path}: kv_pool_tokens={data['kv_pool_tokens']} holds no page of {data['page_size']}"
        )


def _read_runs(path, data: dict) -> list[list[tuple[tuple, float]]]:
    """Each run's steps as (batch of (tokens, context), seconds), every chunk in the buckets."""
    if not isinstance(data["runs"], list) or not all(isinstance(r, list) for r in data["runs"]):
        raise KvjaxError(f"{path}: runs must be a list of runs, each a list of steps")
    largest = data["buckets"][-1]
    runs = []
    for r, run in enumerate(data["runs"]):
        steps = []
        for i, row in enumerate(run):
            try:
                batch, wall_s = tuple((int(t), int(c)) for t, c in row[0]), float(row[1])
            except (TypeError, ValueError, IndexError, KeyError):
                raise KvjaxError(
                    f"{path}: run {r} step {i} is not [[[tokens, context], ...], seconds, start]"
                ) from None
            if not batch or not wall_s > 0 or any(t < 1 or t > largest for t, _ in batch):
                raise KvjaxError(
                    f"{path}: run {r} step {i} has no entry, no time ({wall_s} s) "
                    f"or a chunk outside the buckets"
                )
            steps.append((batch, wall_s))
        if not steps:
            raise KvjaxError(f"{path}: run {r} has no steps")
        runs.append(steps)
    if not runs:
        raise KvjaxError(f"{path}: no runs")
    return runs
