"""`kvjax run` (an experiment config's points into a run folder), `kvjax figures` (paper_figures/
from the records) and `kvjax explore` (the offline explorer page)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvjax.cli.args import DEFAULT_CHIP, DEFAULT_MODEL


def add_parsers(sub) -> None:
    run = sub.add_parser("run", help="run (or resume) an experiment config's points")
    run.add_argument(
        "config",
        nargs="?",
        default="configs/default.yaml",
        help="an experiment config or a suite (default configs/default.yaml)",
    )
    run.add_argument(
        "overrides", nargs="*", help="key=value, e.g. model.num_kv_heads=4 (before any --option)"
    )
    run.add_argument("--runs", default="runs", help="the runs folder (default runs/)")
    run.add_argument("--run-id", help="default: a hash of the resolved config (reruns resume)")
    run.add_argument(
        "--processes",
        type=int,
        default=None,
        help="start N local processes joined by jax.distributed (4 simulated CPU devices each); "
        "under srun or with JAX_NUM_PROCESSES set, each process joins by itself",
    )
    run.set_defaults(func=run_run)

    figures = sub.add_parser("figures", help="regenerate paper_figures/ from the records")
    figures.add_argument(
        "--runs",
        nargs="+",
        help="runs folder(s); several are merged (e.g. a GPU run's folder beside a CPU run's); "
        "default runs/ unless --results is given",
    )
    figures.add_argument(
        "--results",
        nargs="+",
        default=[],
        help="folder(s) of the quality runs' exports (experiments/results: hkv_quality.csv, "
        "gqa_uptrain.csv and their _history.json): draws hkv_quality, kv_pareto, mla_quality, "
        "gqa_uptrain and mla_uptrain without the run folders (alone: those five only, no "
        "explorer.html)",
    )
    figures.add_argument("--out", default="paper_figures")
    figures.set_defaults(func=run_figures)

    explore = sub.add_parser(
        "explore",
        help="write the interactive B / S / num_kv_heads explorer as one offline HTML file",
    )
    explore.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="initial model: a preset or a Hugging Face config.json (as calc takes)",
    )
    explore.add_argument("--chip", default=DEFAULT_CHIP, help="initial chip preset")
    explore.add_argument("--out", default="explorer.html", help="the .html file to write")
    explore.set_defaults(func=run_explore)


def without_processes(argv: list[str]) -> list[str]:
    """The command line less its `--processes N` (what each local process runs)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--processes":
            skip = True
        elif not a.startswith("--processes="):
            out.append(a)
    return out


def run_run(args: argparse.Namespace) -> int:
    from kvjax.runs import distributed

    if args.processes is not None:
        distributed.check_processes(args.processes)
        if args.processes > 1:
            return distributed.launch(without_processes(args.argv), args.processes)
    distributed.initialize()  # one of several processes (SLURM, JAX_*): join them
    from kvjax.runs.launcher import run_config

    runs = run_config(args.config, args.overrides, args.runs, args.run_id, progress=True)
    if distributed.process_index() == 0:  # the others ran their share; one summary
        for run in runs:
            print(f"{run.path}: {len(run.records())} records")
        print(f"figures: python3 -m kvjax figures --runs {args.runs}")
    return 0


def run_figures(args: argparse.Namespace) -> int:
    """Draw every figure whose records exist; say which runs were read, which figures were drawn
    and which were skipped for lack of records."""
    import pandas as pd

    from kvjax.errors import KvjaxError
    from kvjax.plotting import FIGURES, make_figures, write_explorer
    from kvjax.runs.exports import load_exports
    from kvjax.runs.records import load_records

    roots = args.runs if args.runs is not None else ([] if args.results else ["runs"])
    for root in roots:
        if not Path(root).is_dir():
            raise KvjaxError(f"--runs {root!r} is not a folder (run `kvjax run` first)")
    for folder in args.results:
        if not Path(folder).is_dir():
            raise KvjaxError(f"--results {folder!r} is not a folder")
    frames = [load_records(roots)] if roots else []
    for folder in args.results:
        exported = load_exports(folder)
        have = set(frames[0].experiment) if frames and len(frames[0]) else set()
        if have & set(exported.experiment):  # a run's own records win over its export
            print(
                f"{folder}: {', '.join(sorted(have & set(exported.experiment)))} read from "
                "--runs instead"
            )
            exported = exported[~exported.experiment.isin(have)]
        frames.append(exported)
    records = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    runs = sorted(set(zip(records.run_name, records.run_id, strict=True))) if len(records) else []
    print(f"read {len(records)} records of {len(runs)} runs in {', '.join(roots + args.results)}")
    written = make_figures(records, args.out)
    if roots:  # the explorer comes from the presets: drawn with the runs, not the exports
        written.append(write_explorer(Path(args.out) / "explorer.html"))
    for path in written:
        print(path)
    have = set(records.experiment) if len(records) else set()
    for name, (experiment, _, _) in FIGURES.items():
        if experiment not in have:
            print(f"skipped {name}: no records of experiment {experiment}")
    return 0


def run_explore(args: argparse.Namespace) -> int:
    from kvjax.cli.args import model_from_name
    from kvjax.plotting import write_explorer

    path = write_explorer(args.out, model=model_from_name(args.model), chip=args.chip)
    print(f"wrote {path} (open it in a browser; it needs no server and no network)")
    return 0
