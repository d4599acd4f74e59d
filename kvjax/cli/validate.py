"""`kvjax validate`: published accelerator measurements against kvjax's bounds, and (`--predict`)
serving systems predicted by the simulator, held out by implementation."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from kvjax.cli.args import emit
from kvjax.cli.render_common import console, progress_bar
from kvjax.errors import KvjaxError

DESCRIPTION = """\
Each CSV row is one published measurement (columns: source, source_group, chip, dtype, kernel,
implementation, batch, seq_q, seq_kv, num_heads, num_kv_heads, head_dim, causal, latent_dim,
rope_dim, m, n, k, model, context, measured_s, convention, confidence; optional num_chips,
kv_dtype, flag_reason, timing: kernel, graph, events or host, how the source timed it;
page_size: a paged cache's tokens a page, which some decode kernels plan by; window: a
sliding window's key positions a query sees, itself included, which the bound counts;
implementation_version, l2_flushed (true or false) and clock_locked (MHz): how the run was
set up, recorded to tell runs apart). For
each row: kvjax's closed form for that exact shape, the bound on the chip's spec,
fraction_of_bound = bound / measured (above 1: the measurement beats the bound, which is then
wrong), and the time an efficiency model predicts with its 80% interval:
for a row of the committed corpus, the fit that left the row's source group out (nested
interval); for a row of another CSV (a new source), the fit on the whole corpus (each row's
prediction_from says which); per kernel class the distribution of the fraction and the model's
leave-one-group-out error, coverage and interval width. A CSV in the form of
experiments/published/systems.csv (whole serving systems: source, source_group, chip, num_chips,
model, the dtypes, tp, pp, ep, dp_attention, replicas, scenario, input_len, output_len,
length_distribution, requests, concurrency, rate_per_s, the SLO columns, metric, scope,
measured, convention, confidence; optional implementation, engine_version, spec_tokens,
acceptance, cached_input_fraction) is put under the system bound of each row's metric (class
`system`), with the committed prediction where one ran. `--predict` runs the simulator on each
system row it can (a progress bar, the seconds a row): a row of an implementation the corpus
holds is predicted by fits that never saw that implementation's rows, and calibrated on other
implementations' systems; `prediction_from` says what fed it. Without a CSV: the committed corpus
(experiments/published/, systems.csv included)."""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "validate",
        help="published GPU/TPU measurements against kvjax's bounds and predictions",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("csv", nargs="*", help="corpus CSV files (default: the committed corpus)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--predict", action="store_true", help="simulate each system row (seconds to minutes a row)"
    )
    p.add_argument(
        "--out",
        default=None,
        help="with --predict: write the predictions to this CSV as they finish "
        "(experiments/results/system_predictions.csv is what it wrote for the committed corpus)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="with --predict --out: keep the rows the CSV already holds and run the others",
    )
    p.add_argument(
        "--views",
        action="store_true",
        help="each kernel class held out three ways: by source group, by implementation, by chip "
        "(`held_out_views` in --json)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvjax.predict.corpus import read_corpus
    from kvjax.predict.validate import validate
    from kvjax.serving.systems import SYSTEMS_CSV, is_systems_csv, read_systems, validate_systems

    systems = [p for p in args.csv if is_systems_csv(p)] if args.csv else [SYSTEMS_CSV]
    kernels = [p for p in args.csv if p not in systems]
    report: dict[str, Any] = {"rows": [], "classes": {}, "summary": {}}
    if kernels or not args.csv:
        report = validate(read_corpus(kernels or None))
        if args.views:
            from kvjax.predict.views import held_out_views

            report["held_out_views"] = held_out_views(read_corpus(kernels or None))
    if (args.out or args.resume) and not args.predict:
        raise KvjaxError("--out and --resume apply to --predict only")
    if systems:
        rows = [r for p in systems for r in read_systems(p)]
        predictions = predict_systems(rows, args) if args.predict else None
        rows, summary = validate_systems(rows, predictions)
        report["system_rows"] = rows
        report["classes"]["system"] = summary
        if not args.predict:  # the committed P99 latencies' predictions (latency_predict)
            from kvjax.serving.latency_predict import latency_summary

            report["latency"] = latency_summary()
    return emit(args, report, print_validate)


def predict_systems(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict:
    """`--predict`: every row the simulator can run, with a progress bar and the seconds a row
    (on stderr under --json), keyed by (source, metric)."""
    from kvjax.serving.system_predict import predict_rows, runnable

    con = console(stderr=args.json)
    todo = runnable(rows)
    skipped: Counter[str] = Counter()
    with progress_bar(con) as bar:
        task = bar.add_task("predicting", total=len(todo))

        def on_row(row, pred) -> None:
            where = f"{row['source']} ({row['metric']})"
            if isinstance(pred, str) and pred.startswith("not predicted"):  # not in the bar
                if len(rows) > 20:
                    skipped[pred] += 1  # a long CSV: the reasons counted, below
                else:
                    con.print(f"{where}: {pred}")
                return
            if isinstance(pred, str):  # a run that failed, said
                con.print(f"{where}: {pred}")
            else:
                con.print(
                    f"{where}: predicted {pred['predicted_value']:.4g}, measured "
                    f"{row['measured']:.4g}, {pred['seconds']:.1f} s"
                )
            bar.advance(task)

        done = predict_rows(rows, args.out, args.resume, on_row)
    for reason, n in skipped.most_common():
        con.print(f"{n} rows {reason}")
    return {(p["source"], p["metric"]): p for p in done}


def print_validate(report: dict[str, Any]) -> None:
    """`kvjax validate`: the corpus in one line, the systems, then per kernel class the fraction
    of the bound and the held-out error, and the rows nearest (or above) their bound."""
    con = console()
    s = report["summary"]
    if s:
        con.print(
            f"{s['rows']} measurements from {s['sources']} sources in {s['source_groups']} "
            f"groups; {s['above_bound']} faster than their bound (fraction_of_bound = bound / "
            "measured > 1)"
        )
    if "system" in report["classes"]:
        print_systems(report, con)
    if not s:
        return
    _print_classes(con, report)
    if report.get("held_out_views"):
        _print_views(con, report)
    for cls, e in report["classes"].items():  # the held-out error by how the sources timed
        if e.get("by_timing"):
            con.print(
                f"{cls} held out, by how the source timed it: "
                + ", ".join(
                    f"{k} {b['rows']} rows ({b['groups']} groups) {b['median_abs_error']:.1%}, "
                    f"predicted/measured {b['median_ratio']:.2f}"
                    for k, b in e["by_timing"].items()
                )
            )
    _print_rows(con, report)


def _print_classes(con, report: dict[str, Any]) -> None:
    """Per kernel class: bound / measured over its rows, and the model's held-out error."""
    from rich.table import Table

    t = Table(title="per kernel class: bound / measured, and the model's leave-one-group-out error")
    for col in (
        "class",
        "rows",
        "above",
        "min",
        "median",
        "max",
        "fitted",
        "groups",
        "median |pred/meas - 1|",
        "80% coverage",
    ):
        t.add_column(col, justify="left" if col == "class" else "right")
    for cls, e in report["classes"].items():
        if cls == "system":
            continue
        f = e["fraction_of_bound"]
        t.add_row(
            cls,
            str(e["rows"]),
            str(e["above_bound"]),
            f"{f['min']:.3f}",
            f"{f['median']:.3f}",
            f"{f['max']:.3f}",
            str(e.get("fitted_rows", "-")),
            str(e.get("sources", "-")),
            f"{e['loso_median_abs_error']:.1%}" if "fit" in e else "-",
            f"{e['loso_coverage_80']:.0%}" if "fit" in e else "-",
        )
    con.print(t)


def _print_views(con, report: dict[str, Any]) -> None:
    """`--views`: each class's held-out error by source group, by implementation, by chip."""
    from rich.table import Table

    t = Table(title="held out three ways: median |pred/meas - 1| (rows; of group medians)")
    for col in ("class", "view", "groups", "rows", "median", "of group medians", "80% coverage"):
        t.add_column(col, justify="left" if col in ("class", "view") else "right")
    for cls, views in report.get("held_out_views", {}).items():
        for view, e in views.items():
            cover = e["coverage_80"]
            t.add_row(
                cls,
                view,
                str(e["groups"]),
                str(e["rows"]),
                f"{e['median_abs_error']:.1%}",
                f"{e['median_of_group_medians']:.1%}",
                "-" if cover is None else f"{cover:.0%}",
            )
    con.print(t)


def _print_rows(con, report: dict[str, Any]) -> None:
    """The rows faster than their bound, or else the ten closest to it, with predictions."""
    from rich.table import Table

    from kvjax.units import fmt_seconds

    flagged = [r for r in report["rows"] if r["above_bound"]]
    rows = flagged or sorted(report["rows"], key=lambda r: -r["fraction_of_bound"])[:10]
    t = Table(title="faster than the bound" if flagged else "closest to their bound (none above)")
    for col in (
        "where",
        "kernel",
        "chip",
        "implementation",
        "measured",
        "bound",
        "fraction",
        "predicted [80%]",
    ):
        t.add_column(col)
    for r in rows:
        p = r["predicted_s"]
        lo, hi = r["predicted_lo_s"], r["predicted_hi_s"]
        span = f"[{fmt_seconds(lo)}, {fmt_seconds(hi)}]" if p is not None else ""
        pred = "-" if p is None else f"{fmt_seconds(p)} {span}"
        t.add_row(
            f"{r['file'].rsplit('/', 1)[-1]}:{r['line']}",
            r["kernel"],
            r["chip"],
            str(r["implementation"] or "-"),
            fmt_seconds(r["measured_s"]),
            fmt_seconds(r["bound_s"]),
            f"{r['fraction_of_bound']:.3f}",
            pred,
        )
        if r.get("flag_reason"):
            t.add_row("", f"[dim]{r['flag_reason']}[/dim]", "", "", "", "", "", "")
    con.print(t)


def print_systems(report: dict[str, Any], con) -> None:
    """The serving systems' rows: the class, its held-out predictions by implementation and chip
    family, and the rows (all of a short CSV, else those nearest their bound)."""
    from rich.table import Table

    c = report["classes"]["system"]
    f = c["fraction_of_bound"]
    con.print(
        f"{c['rows']} serving-system results from {c['sources']} source groups and "
        f"{c['implementations']} implementations; {c['above_bound']} beat their system bound "
        f"(fraction: min {f['min']:.3g}, median {f['median']:.3g}, max {f['max']:.3g}); the "
        f"prediction: {c['prediction']}"
    )
    if c["loso_median_abs_error"] is not None:
        con.print(
            f"held out by implementation: median |predicted/measured - 1| "
            f"{_pct(c['loso_median_abs_error'], 1)} over {c['predicted_rows']} rows, 80% interval "
            f"covering {_pct(c['loso_coverage_80'])} (median width "
            f"{_pct(c['interval_80_median_width'])}); the median of the implementations' medians "
            f"{_pct(c['median_of_implementation_medians'], 1)}, of the source groups' "
            f"{_pct(c['median_of_group_medians'], 1)}"
        )
        for key, label in (("by_implementation", "implementation"), ("by_chip_family", "chip")):
            con.print(
                f"  by {label}: "
                + ", ".join(
                    f"{g} {e['rows']} rows {e['median_abs_error']:.1%} (covered "
                    f"{_pct(e['coverage_80'])})"
                    for g, e in c[key].items()
                )
            )
    for metric, e in (report.get("latency") or {}).items():
        con.print(
            f"{metric} at the submission's rate (MLPerf Server and Interactive): "
            f"{e['rows']} rows, median |predicted/measured - 1| {_pct(e['median_abs_error'], 1)}, "
            f"predicted/measured {e['median_ratio']:.2f}, covered {_pct(e['coverage_80'])}"
        )
    t = Table(
        title="serving systems"
        if len(report["system_rows"]) <= 20
        else "serving systems closest to their bound"
    )
    for col in (
        "source",
        "metric",
        "scope",
        "measured",
        "bound",
        "fraction",
        "side",
        "predicted [80%]",
    ):
        t.add_column(col)
    rows = sorted(report["system_rows"], key=lambda r: -r["fraction_of_bound"])
    if len(rows) > 20:
        rows = [r for r in rows if r["above_bound"]] or rows[:10]
    for r in rows:
        p = r.get("predicted_value")
        span = (
            ""
            if r.get("predicted_lo") is None
            else f" [{r['predicted_lo']:.4g}, {r['predicted_hi']:.4g}]"
        )
        pred = "-" if p is None else f"{p:.4g}{span}"
        t.add_row(
            r["source"],
            r["metric"],
            r["scope"],
            f"{r['measured']:.4g}",
            f"{r['bound_value']:.4g}",
            f"{r['fraction_of_bound']:.3f}",
            r["bound_side"],
            pred,
        )
    con.print(t)


def _pct(x, digits=0) -> str:
    return "-" if x is None else f"{x:.{digits}%}"


def print_predicted(pred: dict[str, Any], con) -> None:
    """`calc --predict`: the bound beside what the best published kernels are predicted to take."""
    from rich.table import Table

    from kvjax.units import fmt_seconds

    def span(r):
        if r.get("predicted_s") is None:
            return "-"
        return (
            f"{fmt_seconds(r['predicted_s'])} [{fmt_seconds(r['predicted_lo_s'])}, "
            f"{fmt_seconds(r['predicted_hi_s'])}]"
        )

    t = Table(
        title="predicted (efficiency model fitted on the published measurements; 80% interval): "
        "kvjax validate"
    )
    for col in ("kernel", "class", "bound", "predicted [80%]"):
        t.add_column(col, justify="left" if col in ("kernel", "class") else "right")
    for r in pred["kernels"]:
        t.add_row(r["name"], r["class"] or "-", fmt_seconds(r["bound_s"]), span(r))
    t.add_row("whole step", "step", "", span(pred["step"]))
    t.add_row("whole step", "from kernels", "", span(pred["step_from_kernels"]))
    con.print(t)
