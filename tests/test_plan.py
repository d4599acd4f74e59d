"""`kvjax plan` (kvjax.serving.plan): the placements it searches, the frontier by hand, its load
refused by name, and a tiny search whose every prediction lies under its bound."""

import json

import pytest

from kvjax.cli.main import main
from kvjax.errors import KvjaxError
from kvjax.model.config import get_model_config
from kvjax.serving.deployment import Placement
from kvjax.serving.plan import Traffic, frontier, placements
from kvjax.serving.plan_options import disaggregated
from kvjax.serving.plan_report import simulate_command


def test_every_split_of_eight_chips_is_searched():
    dense = placements(get_model_config("llama-3.1-70b"), 8)
    # tp x pp dividing 8, tp <= 8: (1,1) (1,2) (1,4) (1,8) (2,1) (2,2) (2,4) (4,1) (4,2) (8,1)
    assert len(dense) == 10 and all(p.chips == 8 for p in dense)
    assert Placement(tp=4, pp=2, replicas=1) in dense and Placement(replicas=8) in dense
    moe = placements(get_model_config("mixtral-8x7b"), 8)
    # and the experts over 2, 4 or 8 data-parallel attention groups
    ep = [p for p in moe if p.ep > 1]
    assert [(p.ep, p.dp_attention, p.replicas) for p in ep] == [(2, 2, 4), (4, 4, 2), (8, 8, 1)]
    assert (
        len(placements(get_model_config("llama-3.1-70b"), 6)) == 3
    )  # (1,1) (1,2) (2,1) x replicas


def test_prefill_and_decode_apart_over_every_split_of_the_chips():
    """8 chips as xP + yD: instances of 1 chip (1P7D .. 7P1D), of 2 (1P3D .. 3P1D), of 4 (1P1D);
    none of 8; over more instances, x every eighth of them. Over two nodes of 4, tensor
    parallelism stays inside a node; chips that do not split over the nodes, and a KV link not
    given between nodes, are refused by name."""
    from kvjax.hardware import get_chip
    from kvjax.serving.plan import Planner

    apart = disaggregated(8)
    assert [(p.tp, xy) for p, xy in apart if p.tp > 1] == [
        (2, (1, 3)),
        (2, (2, 2)),
        (2, (3, 1)),
        (4, (1, 1)),
    ]
    assert len(apart) == 7 + 3 + 1 and all(p.tp * sum(xy) == 8 for p, xy in apart)
    # 64 chips: x every eighth of the instances (64 of one chip: 8P56D .. 56P8D)
    wide = [xy for p, xy in disaggregated(64) if p.tp == 1]
    assert wide == [(8 * k, 64 - 8 * k) for k in range(1, 8)]
    cfg = get_model_config("llama-3.1-70b")
    assert max(p.tp for p in placements(cfg, 8, nodes=2)) == 4
    assert max(p.tp for p, _ in disaggregated(8, nodes=2)) == 4
    with pytest.raises(KvjaxError, match="chips=8 do not split over nodes=3"):
        placements(cfg, 8, nodes=3)
    traffic = Traffic(512, 64, rate=1.0)
    planner = Planner(cfg, get_chip("h200"), 16, traffic, None, ("bf16",), (256,), nodes=2)
    with pytest.raises(KvjaxError, match="give --link-gb-per-s"):
        planner.link  # noqa: B018
    assert Planner(cfg, get_chip("h200"), 8, traffic, None, (), ()).link == 450e9


def test_the_frontier_keeps_what_no_option_beats_on_both_axes():
    rows = [
        {"option": "a", "predicted": 100.0, "per_user": 10.0},
        {"option": "b", "predicted": 80.0, "per_user": 30.0},
        {"option": "c", "predicted": 70.0, "per_user": 20.0},  # beaten by b on both
        {"option": "d", "predicted": 100.0, "per_user": 5.0},  # beaten by a on per user
        {"option": "e", "predicted": 0.0, "per_user": 50.0},  # nothing predicted: left out
    ]
    assert [r["option"] for r in frontier(rows)] == ["a", "b"]


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"rate": 1.0, "concurrency": 4}, "--rate or --concurrency, not both"),
        ({}, "give --slo-ttft and/or --slo-tpot"),
        ({"rate": 1.0, "percentile": 120.0}, "slo_percentile=120.0"),
    ],
)
def test_a_load_that_cannot_be_planned_is_refused_by_name(kwargs, says):
    with pytest.raises(KvjaxError, match=says):
        Traffic(512, 64, **kwargs)


def test_a_tiny_plan_predicts_under_its_bound_and_names_its_best(capsys):
    args = (
        "plan --model llama-3.1-8b --chip h100-sxm --chips 2 --prompt-len 512 --output-len 64 "
        "--rate 4 --slo-ttft 1 --slo-tpot 0.05 --requests 20 --kv-dtypes bf16 --json"
    )
    assert main(args.split()) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["options"]
    splits = {(r["tp"], r["pp"], r["replicas"], r["prefill"], r["decode"]) for r in rows}
    assert splits == {
        (1, 1, 2, None, None),
        (1, 2, 1, None, None),
        (2, 1, 1, None, None),
        (1, 1, 1, 1, 1),
    }
    for r in rows:
        # at 4 requests/s of 64 tokens no option delivers more than 128 tokens/s a chip
        assert r["bound"] == pytest.approx(min(128.0, r["bound"]))
        for key in ("screened", "predicted", "predicted_hi"):
            if r.get(key):
                assert r[key] <= r["bound"] * (1 + 1e-9), (r["option"], key)
    best = out["best"]
    assert best["meets_slo"] and best["predicted_lo"] <= best["predicted"] <= best["predicted_hi"]
    assert best["ttft_s"] <= 1 and best["tpot_s"] <= 0.05
    assert f"--tp {best['tp']} --pp {best['pp']} --replicas {best['replicas']}" in best["command"]
    assert out["frontier"] and all(f["predicted"] for f in out["frontier"])
    # the chosen option meets the SLO in its own simulation, run from the line plan prints
    assert main([*best["command"].split()[3:], "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert ran["ttft_s"]["p99"] <= 1 and ran["tpot_s"]["p99"] <= 0.05
    # a disaggregated option's line runs its xP + yD
    apart = next(r for r in rows if r["prefill"])
    line = simulate_command("llama-3.1-8b", "h100-sxm", Traffic(512, 64, rate=4.0), apart, None)
    assert "--disaggregate 1P1D --tp 1" in line and "--requests 100" in line
    assert main([*line.replace("--requests 100", "--requests 10").split()[3:], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["instances"] == {"prefill": 1, "decode": 1}


def plan_table_row(r: dict) -> str:
    """One refined option as the serving README's table writes it."""
    return (
        f"| {r['option']} | {r['bound']:,.0f} | {r['predicted']:,.0f} [{r['predicted_lo']:,.0f}, "
        f"{r['predicted_hi']:,.0f}] | {r['per_user']:.1f} | {r['ttft_s']:.2f} s | "
        f"{1e3 * r['tpot_s']:.1f} ms |"
    )


def test_the_serving_readmes_plan_table_is_the_committed_benchmark():
    """kvjax/serving/README.md's table of the 8-chip plan: the refined options of
    experiments/results/plan_search.json, the best first, and the search's seconds."""
    from pathlib import Path

    root = Path(__file__).parents[1]
    case = json.loads((root / "experiments/results/plan_search.json").read_text())["cases"]["8"]
    readme = (root / "kvjax/serving/README.md").read_text()
    rows = case["report"]["options"]
    assert rows and all(r["status"] == "predicted" for r in rows)
    for r in rows:
        assert plan_table_row(r) in readme, r["option"]
        assert r["predicted_lo"] <= r["predicted"] <= r["predicted_hi"] < r["bound"]
    best = case["best"]
    assert best["option"] == max(rows, key=lambda r: r["predicted"] * r["meets_slo"])["option"]
    assert f"in {case['seconds']:.0f} s" in readme


def test_variants_carry_their_committed_quality_cost_within_the_budget(capsys):
    """--variants: llama-3.1-8b's MHA, GQA (8 KV heads), MQA and MLA forms, each option with
    its committed cost read here from quality_differences.csv (GQA: 4 query heads a KV head, the
    quality model's h_kv=2; MQA h_kv=1); over a budget between GQA's and MQA's, MQA is refused
    by name and the best is MHA or GQA, its line setting the variant's KV heads."""
    import csv

    from kvjax.cli.plan_variants import variant_flags
    from kvjax.quality.costs import QUALITY_CSV

    loss = {
        r["comparison"]: float(r["mean"])
        for r in csv.DictReader(QUALITY_CSV.open())
        if r["family"] == "stdlib" and r["metric"] == "val_loss" and not r["condition"]
    }
    gqa, mqa = loss["h_kv=2 - MHA"], loss["h_kv=1 - MHA"]
    assert 0 < gqa < mqa
    args = (
        "plan --model llama-3.1-8b --chip h100-sxm --chips 1 --prompt-len 256 --output-len 16 "
        "--rate 2 --slo-ttft 1 --requests 10 --kv-dtypes bf16 --variants --json "
        f"--max-quality-cost {(gqa + mqa) / 2}"
    )
    assert main(args.split()) == 0
    rows = json.loads(capsys.readouterr().out)["options"]
    by = {r["variant"]: r for r in rows}
    assert by["MHA"]["quality_cost"] == 0 and by["GQA"]["quality_cost"] == pytest.approx(gqa)
    assert by["MQA"]["status"] == "refused" and "over the budget" in by["MQA"]["why"]
    assert by["MQA"]["quality_cost"] == pytest.approx(mqa)
    cfg = get_model_config("llama-3.1-8b")
    assert variant_flags(cfg, cfg.replace(num_kv_heads=1)) == "--kv-heads 1"
    assert variant_flags(cfg, cfg.replace(d_ff=2 * cfg.d_ff)) is None  # not a variant
    with pytest.raises(SystemExit):
        main(["plan", "--model", "llama-3.1-8b", "--chips", "1", "--rate", "1", "--bogus"])


def _best(rows: list[dict], apart: bool) -> dict:
    """The refined option meeting the SLO with the most output tokens/s a chip, of one kind."""
    kind = [r for r in rows if bool(r.get("prefill")) == apart and r.get("meets_slo")]
    return max(kind, key=lambda r: r["predicted"])


def test_the_serving_readmes_disaggregation_cases_are_the_committed_benchmark():
    """The serving README's two disaggregation workloads: the best option together and the best
    apart as experiments/results/plan_search.json holds them; apart wins the first, loses the
    second."""
    from pathlib import Path

    root = Path(__file__).parents[1]
    cases = json.loads((root / "experiments/results/plan_search.json").read_text())["cases"]
    readme = (root / "kvjax/serving/README.md").read_text()
    for name, wins in (("disagg-wins", True), ("disagg-loses", False)):
        rows = cases[name]["report"]["options"]
        together, apart = _best(rows, False), _best(rows, True)
        assert (apart["predicted"] > together["predicted"]) == wins, name
        line = (
            f"| {name} | {together['option']} | {together['predicted']:,.0f} | "
            f"{apart['option']} | {apart['predicted']:,.0f} |"
        )
        assert line in readme, line


def test_the_serving_readmes_plan_vs_published_rows_are_the_committed_csv():
    """Each llama2-70b submission on 8 H200 in experiments/results/plan_vs_published.csv is a
    row of the serving README's table: measured, the submitted option's prediction and rank,
    plan's best and what the row says (pessimistic: best below 0.9 x measured; try: best above
    1.1 x the submitted option's prediction; optimistic: that prediction above 1.1 x measured)."""
    from pathlib import Path

    import pandas as pd

    root = Path(__file__).parents[1]
    table = pd.read_csv(root / "experiments/results/plan_vs_published.csv")
    readme = (root / "kvjax/serving/README.md").read_text()
    mine = table[(table.chip == "h200") & (table.chips == 8) & (table.model == "llama-2-70b")]
    assert len(mine) >= 8
    for r in mine.to_dict("records"):
        version, who, system = r["source"].split(":")[:3]
        who = f"{version.removeprefix('mlperf-inference-')} {who} {system}"
        best, sub, meas = r["best_predicted"], r["submitted_predicted"], r["measured_per_chip"]
        other = r["best_option"] != r["submitted"]
        said = (
            "pessimistic"
            if best < 0.9 * meas
            else "try"
            if best > 1.1 * sub and other
            else "optimistic"
            if sub > 1.1 * meas
            else "agrees"
        )
        assert r["verdict"] == said, r["source"]
        line = (
            f"| {who} {r['scenario']} | {r['measured_per_chip']:,.0f} | {r['submitted']} | "
            f"{r['submitted_predicted']:,.0f} ({int(r['submitted_rank'])}) | {r['best_option']} | "
            f"{r['best_predicted']:,.0f} | {r['verdict']} |"
        )
        assert line in readme, line


def test_plans_prediction_of_a_submitted_option_is_its_rows_own():
    """plan_vs_published's submitted option, searched by the planner, predicts what the row's own
    prediction (experiments/results/system_predictions.csv, by `system_predict`) does: one
    deployment, two paths to it."""
    from pathlib import Path

    import pandas as pd

    root = Path(__file__).parents[1]
    plans = pd.read_csv(root / "experiments/results/plan_vs_published.csv")
    own = pd.read_csv(root / "experiments/results/system_predictions.csv").set_index("source")
    for r in plans.to_dict("records"):
        row = own.loc[r["source"]]
        assert r["submitted_predicted"] * r["chips"] == pytest.approx(row["predicted_value"])


def test_the_serving_readmes_plan_vs_published_summary_counts_the_csv():
    from pathlib import Path

    import pandas as pd

    root = Path(__file__).parents[1]
    t = pd.read_csv(root / "experiments/results/plan_vs_published.csv")
    readme = " ".join((root / "kvjax/serving/README.md").read_text().split())
    k1 = int((t.best_predicted >= 0.9 * t.measured_per_chip).sum())
    k2 = int((t.submitted_rank <= 3).sum())
    k3 = int((t.submitted_predicted >= 0.9 * t.best_predicted).sum())
    said = (
        f"Over all {len(t)} submissions the table holds ({', '.join(sorted(set(t.model)))}), "
        f"plan's best is at least 0.9 x the measured result in {k1}, and the submitted option is "
        f"in plan's top 3 in {k2} and within 10% of plan's best in {k3}."
    )
    assert said in readme
