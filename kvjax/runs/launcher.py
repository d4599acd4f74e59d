"""`kvjax run`: an experiment config's points, each written as records into a run folder.

The default run id is a hash of the resolved config, so running the same config again resumes
it: finished points (their record files exist, written atomically) are skipped. A run resumed
after the code changed warns that its finished points are other code's (`RunDir.stale_points`:
each environment records `code_fingerprint`); they are kept, not recomputed.

Several processes (`kvjax.runs.distributed`: `srun`, or `kvjax run --processes N`) run one sweep
together, writing into one run folder (a folder all hosts share). Process 0 holds the lock and
writes the config, environment and manifest; the pending points are divided among the processes,
each written by one. Two kinds of point:
- on one process (most): a closed form, a compile, a single-device training run: point j of the
  pending list runs on process j mod N;
- on every process together (`module.runs_together(point)`): a program sharded over the global
  mesh (SPMD: every process must run the same jitted program); process 0 writes its records.
Measured experiments (`MEASURED = True`) time every point on process 0 alone, the others idle:
timings interleave points to see one machine state, and ceilings are measured per machine, so
points timed on different hosts would not compare.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import pkgutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvjax.errors import KvjaxError
from kvjax.runs import distributed
from kvjax.runs.config import expand, load_config, point_key, to_dict
from kvjax.runs.options import check_options
from kvjax.runs.records import RunDir, _warn

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


def suite_members(config_path: str | Path) -> list[Path] | None:
    """The member configs of a suite file (`suite: [a.yaml, b.yaml]`), else None."""
    import yaml

    path = Path(config_path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # load_config reports it
    if not isinstance(raw, dict) or "suite" not in raw:
        return None
    if set(raw) != {"suite"} or not isinstance(raw["suite"], list) or not raw["suite"]:
        raise KvjaxError(f"{path}: suite: must be the only key, a non-empty list of config files")
    members = [path.parent / str(m) for m in raw["suite"]]
    for m in members:
        if not m.exists():
            raise KvjaxError(f"{path}: suite: {m} does not exist")
    return members


def run_config(config_path, overrides=(), runs_root="runs", run_id=None, progress=True):
    """A single experiment config, or every member of a suite (each resumable on its own)."""
    members = suite_members(config_path)
    if members is None:
        return [run_experiment(config_path, overrides, runs_root, run_id, progress)]
    if overrides or run_id:
        raise KvjaxError(f"{config_path}: a suite takes no overrides or --run-id; run a member")
    for m in members:  # validate every member before running any
        validated(m, ())
    return [run_experiment(m, (), runs_root, None, progress) for m in members]


def validated(config_path, overrides):
    """(config, experiment module, points) with everything checked before anything runs: the
    config's keys and values, every point's model, workload and chip, the options against the
    experiment's schema, and parallelism only where the experiment models it."""
    cfg = load_config(config_path, overrides)
    try:
        module = experiment_module(cfg.experiment)
    except KvjaxError as exc:
        raise KvjaxError(f"{config_path}: experiment: {exc}") from None
    points = expand(cfg)
    fields = ("tp", "dp", "ep", "dp_attention")
    parallel = sorted({tuple(p.workload[f] for f in fields) for p in points} - {(1, 1, 1, 1)})
    if parallel and not getattr(module, "TENSOR_PARALLEL", False):
        models = [
            n
            for n in available_experiments()
            if getattr(experiment_module(n), "TENSOR_PARALLEL", 0)
        ]
        tp, dp, ep, dpa = parallel[0]
        given = f"workload.tp={tp}, workload.dp={dp}" + (
            f", workload.ep={ep}, workload.dp_attention={dpa}" if (ep, dpa) != (1, 1) else ""
        )
        raise KvjaxError(
            f"{config_path}: {given}: experiment {cfg.experiment} "
            f"does not model parallelism (it would ignore them); experiments that do: "
            f"{', '.join(models)}"
        )
    placed = [p for p in parallel if p[2:] != (1, 1)]
    if placed and not getattr(module, "PLACEMENTS", False):
        raise KvjaxError(
            f"{config_path}: workload.ep={placed[0][2]}, workload.dp_attention={placed[0][3]}: "
            f"experiment {cfg.experiment} models tensor parallelism only (it would ignore "
            f"them); experiments that model these placements: serving_frontier"
        )
    check_options(module, points, config_path)
    return cfg, module, points


def run_experiment(
    config_path: str | Path = DEFAULT_CONFIG,
    overrides: tuple[str, ...] | list[str] = (),
    runs_root: str | Path = "runs",
    run_id: str | None = None,
    progress: bool = True,
    on_point: Callable[[int, str], None] | None = None,
) -> RunDir:
    """Run (or resume) every point; returns the run folder."""
    cfg, module, points = validated(config_path, overrides)
    config = to_dict(cfg)
    keys = [point_key(cfg, p) for p in points]
    run = RunDir(runs_root, cfg.name or cfg.experiment, run_id or default_run_id(config))
    run.check_config(config)
    stale = run.stale_points(keys)
    if stale and distributed.process_index() == 0:
        _warn(stale)
    if all(run.done(k) for k in keys):
        return run  # finished: nothing is written (a read-only folder resumes as a no-op)
    hosts = distributed.host_names()  # every process takes part (an allgather)
    with shared_lock(run):
        if distributed.process_index() == 0:
            for k in keys:
                run.set_aside_corrupt(k)
            run.start(config, keys, hosts)
        distributed.barrier("kvjax-run-start")  # every process sees the same finished points
        todo = [
            (i, k, p) for i, (k, p) in enumerate(zip(keys, points, strict=True)) if not run.done(k)
        ]
        distributed.barrier("kvjax-run-planned")  # before any process writes a point
        _run_points(run, module, cfg, keys, todo, progress, on_point, hosts)
    return run


def _fail_if_not(ok: int, run) -> None:
    if not ok:
        raise KvjaxError(f"{run.path}: process 0 could not lock the run (see its error)")


@contextmanager
def shared_lock(run):
    """The run's lock, held by process 0 for all the processes until every one is done."""
    if not distributed.is_multiprocess():
        with run.lock():
            yield
        return
    if distributed.process_index() != 0:
        _fail_if_not(distributed.broadcast_flag(0), run)
        yield  # an exception leaves at once: the launcher (or the scheduler) stops the rest
        distributed.barrier("kvjax-run-end")
        return
    try:
        lock = run.lock()
        lock.__enter__()
    except KvjaxError:
        distributed.broadcast_flag(0)
        raise
    distributed.broadcast_flag(1)
    try:
        yield
        distributed.barrier("kvjax-run-end")
    finally:
        lock.__exit__(None, None, None)


def assign(module, todo, rank: int, count: int):
    """The pending points process `rank` of `count` runs: (index, key, point, writes)."""
    if count == 1:
        return [(i, k, p, True) for i, k, p in todo]
    if getattr(module, "MEASURED", False) or hasattr(module, "run_points"):
        return [(i, k, p, True) for i, k, p in todo] if rank == 0 else []
    together = getattr(module, "runs_together", lambda point: False)
    mine, alone = [], 0
    for i, k, p in todo:
        if together(p):
            mine.append((i, k, p, rank == 0))
        else:
            if alone % count == rank:
                mine.append((i, k, p, True))
            alone += 1
    return mine


def _run_points(run, module, cfg, keys, todo, progress, on_point, hosts) -> None:
    rank, count = distributed.process_index(), len(hosts)
    writer = {"process": rank, "process_count": count, "host": hosts[rank]} if count > 1 else None
    mine = assign(module, todo, rank, count)
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeRemainingColumn(),
    ]
    import sys

    show = progress and sys.stderr.isatty()
    started = time.perf_counter()

    def done_line(key: str) -> None:
        """Without a terminal (a log, CI, a pipe): one line a point, so a reader sees it work."""
        nonlocal started
        if progress and not show:
            now = time.perf_counter()
            who = f"[process {rank}/{count}] " if count > 1 else ""
            print(
                f"{who}{cfg.experiment} {key or '(one point)'} {now - started:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            started = now

    with Progress(*columns, disable=not show, transient=True) as bar:
        task = bar.add_task(f"{cfg.experiment}", total=len(keys), completed=len(keys) - len(todo))
        if mine and hasattr(module, "run_points"):
            # an experiment that measures its points together, interleaved (they would see
            # different machine states one after another): all pending points at once
            for i, key, _, _ in mine:
                if on_point:
                    on_point(i, key)
            for (_, key, _, _), records in zip(
                mine, module.run_points([p for _, _, p, _ in mine]), strict=True
            ):
                run.write_point(key, records, writer)
                bar.advance(task)
                done_line(key)
            run.write_manifest(keys)
            mine = []
        for i, key, point, writes in mine:
            if on_point:
                on_point(i, key)
            if "artifacts" in inspect.signature(module.run_point).parameters:
                # files an experiment keeps beside its records (a profile's traces)
                records = module.run_point(point, artifacts=run.artifacts_dir(key))
            else:
                records = module.run_point(point)
            if writes:
                run.write_point(key, records, writer)
                run.write_manifest(keys)
            bar.advance(task)
            done_line(key)
    if count > 1:
        distributed.barrier("kvjax-run-points")
        if rank == 0:
            run.write_manifest(keys)  # every process's points written
