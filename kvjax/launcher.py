"""`kvjax run`: an experiment config's points, each written as records into a run folder.

The default run id is a hash of the resolved config, so running the same config again resumes
it: finished points (their record files exist, written atomically) are skipped.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvjax.errors import KvjaxError
from kvjax.experiment_config import expand, load_config, point_key, to_dict
from kvjax.records import RunDir

DEFAULT_CONFIG = Path("configs/default.yaml")


def available_experiments() -> list[str]:
    import experiments

    return sorted(
        m.name
        for m in pkgutil.iter_modules(experiments.__path__)
        if hasattr(importlib.import_module(f"experiments.{m.name}"), "run_point")
    )


def experiment_module(name: str):
    if name not in available_experiments():
        from kvjax.errors import unknown_name_error

        raise unknown_name_error("experiment", name, available_experiments())
    return importlib.import_module(f"experiments.{name}")


def default_run_id(config: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]


def run_experiment(
    config_path: str | Path = DEFAULT_CONFIG,
    overrides: tuple[str, ...] | list[str] = (),
    runs_root: str | Path = "runs",
    run_id: str | None = None,
    progress: bool = True,
    on_point: Callable[[int, str], None] | None = None,
) -> RunDir:
    """Run (or resume) every point; returns the run folder."""
    cfg = load_config(config_path, overrides)
    try:
        module = experiment_module(cfg.experiment)
    except KvjaxError as exc:
        raise KvjaxError(f"{config_path}: experiment: {exc}") from None
    config = to_dict(cfg)
    points = expand(cfg)
    keys = [point_key(cfg, p) for p in points]
    run = RunDir(runs_root, cfg.name or cfg.experiment, run_id or default_run_id(config))
    try:
        run.start(config, keys)
    except ValueError as exc:
        raise KvjaxError(str(exc)) from None
    todo = [(i, k, p) for i, (k, p) in enumerate(zip(keys, points, strict=True)) if not run.done(k)]
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
               "{task.total}"), TimeRemainingColumn()]  # fmt: skip
    with Progress(*columns, disable=not progress, transient=True) as bar:
        task = bar.add_task(f"{cfg.experiment}", total=len(keys), completed=len(keys) - len(todo))
        for i, key, point in todo:
            if on_point:
                on_point(i, key)
            records = module.run_point(point)
            run.write_point(key, records)
            run.write_manifest(keys)
            bar.advance(task)
    return run
