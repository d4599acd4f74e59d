"""The README is a first screen and a map (issue 39): short, and every link in it and in the
documents it points to lands on a file and a heading that exist."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "configs/README.md", "experiments/README.md",
        "experiments/published/README.md", "experiments/published/VALIDATE.md",
        "kvjax/README.md", "kvjax/analytic/README.md",
        "kvjax/traced/README.md", "kvjax/measured/README.md", "kvjax/nn/README.md",
        "kvjax/plotting/README.md", "kvjax/serving/README.md"]  # fmt: skip


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    t = re.sub(r"[^\w\- ]", "", heading.strip().lstrip("#").strip().lower())
    return t.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    lines = path.read_text().splitlines()
    return {_slug(line) for line in lines if re.match(r"^#{1,6} ", line)}


def test_readme_is_a_first_screen_and_a_map():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 350
    assert "python3 -m pip install -e . && python3 -m kvjax run" in text
    assert "bash .ci/run" in text
    linked = set(re.findall(r"\]\(([^)#]+)", text))
    assert set(DOCS[1:]) <= linked


@pytest.mark.parametrize("doc", DOCS)
def test_links_land(doc):
    path = ROOT / doc
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"^(https?:|mailto:)", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            missing.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            missing.append(target)
    assert not missing, missing


def test_readme_deepseek_placements_are_the_frontiers_output(capsys):
    """The README's TP8 vs DP8 + EP8 table (issue 40) is what `kvjax frontier` prints now: the
    largest batch's point of each placement, KV per device = its sequences' latents."""
    import json

    from kvjax.cli import main

    text = (ROOT / "README.md").read_text()
    base = ["frontier", "--model", "deepseek-v3", "--weight-dtype", "fp8", "--attention-kernel",
            "flash", "--chip", "h200", "--context", "32768", "--json"]  # fmt: skip
    rows = {}
    placements = {"TP8": ["--tp", "8"], "DP8 + EP8": ["--dp-attention", "8", "--ep", "8"]}
    for name, flags in placements.items():
        assert main(base + flags) == 0
        curve = json.loads(capsys.readouterr().out)["variants"][0]
        last = curve["points"][-1]
        assert main(["calc", *base[1:], *flags, "--batch", str(curve["max_batch"])]) == 0
        per = json.loads(capsys.readouterr().out)["per_device"]
        rows[name] = (
            f"| {name} | {per['weight_bytes'] / 2**30:.2f} GiB | "
            f"{per['kv_cache_bytes'] / 2**30:.2f} GiB | {curve['max_batch']} | "
            f"{last['tokens_per_s']:.0f} | {last['ms_per_token']:.1f} |"
        )
        assert rows[name] in text, rows[name]
        # the KV a device holds at that batch: 70,272 bytes a token per sequence it holds
        held = curve["max_batch"] // (8 if "EP" in name else 1)
        assert per["kv_cache_bytes"] == 70272 * 32768 * held


@pytest.mark.parametrize("which", ["bound", "predicted"])
def test_readme_goodput_table_is_the_committed_run(which):
    """The README's goodput table is `goodput_results.markdown` of the committed CSV (the
    predicted knees, and the bound's at 512-token chunks, `knees` of theirs), and one of its
    knees is reproduced from scratch: GQA-8 bf16 meets the SLO for 90% at its knee rate, with
    the committed attainment, and not 2% above it."""
    import pandas as pd

    from experiments.benchmarks.goodput_results import OUT, PREDICTED, knees, markdown
    from experiments.serving_goodput import STEP_TIMES, _runner
    from kvjax import get_model_config
    from kvjax.hardware import get_chip

    readme = (ROOT / "README.md").read_text()
    df = pd.read_csv(OUT if which == "bound" else PREDICTED)
    if which == "bound":
        assert markdown(df) in readme
    else:
        for step_time in STEP_TIMES:
            assert knees(df, STEP_TIMES[step_time][1]) in readme.replace("\n", " ")
        df = df[df.source == STEP_TIMES["predicted"][1]]
    knee = df[df.knee & (df.variant == "GQA") & (df.kv_dtype == "bf16")].iloc[0]
    cfg = get_model_config("llama-3-8b", attention_kernel="flash")
    run = _runner(cfg, get_chip("h100-sxm"), {
        "requests": 200, "prompt_len": 8192, "output_len": 256, "page_size": 16,
        "token_budget": int(knee.token_budget) if which != "bound" else 2048, "max_batch": 256,
        "seed": 0, "slo_ttft_s": 2.0, "slo_itl_s": 0.05, "price_per_chip_hour": 2.0,
        "step_time": which})  # fmt: skip
    got = run(float(knee.rate_requests_per_s))
    assert got["attainment"] == knee.attainment >= 0.9
    assert got["cost_per_million_output_tokens"] == pytest.approx(
        knee.cost_per_million_output_tokens
    )
    assert run(float(knee.rate_requests_per_s) * 1.02)["attainment"] < 0.9


def test_readme_engine_section_is_the_committed_benchmark_runs():
    """The README's engine-vs-simulator section: the table is the latest run's, and every count
    it leads with (out of sample, per load over the runs and over their rounds, saturation, the
    in-sample spread) is recounted from the committed runs of the protocol."""
    import glob
    import json

    from experiments.benchmarks.serving_engine_vs_sim import markdown

    readme = " ".join((ROOT / "README.md").read_text().split())
    result = json.loads((ROOT / "experiments/results/serving_engine_vs_sim.json").read_text())
    folder = ROOT / "experiments/results/serving_engine_vs_sim_runs"
    runs = [json.loads(Path(f).read_text()) for f in sorted(glob.glob(f"{folder}/*.json"))]
    assert result == runs[-1] and result["criterion"] == "around"
    assert " ".join(markdown(result).split()) in readme
    assert all(r["engine"]["compilations_after_warmup"] == 0 for r in runs)
    n = len(runs)
    assert f"in {n} runs of the protocol today" in readme

    def p50(c):
        return all(c[k]["within"] for k in ("ttft_p50", "itl_p50"))

    loads = {0.3: "30% load", 0.6: "60%", 0.9: "90%"}
    held = {load: [p50(p["comparison_around_speed"]) for r in runs for p in r["points"]
                   if p["load"] == load] for load in loads}  # fmt: skip
    rounds = {load: [p50(c) for r in runs for p in r["points"] if p["load"] == load
                     for c in p["rounds_out_of_sample"]] for load in loads}  # fmt: skip
    for load, name in loads.items():
        assert f"at {name} in {sum(held[load])} of {n}" in readme.replace("runs, ", ", "), load
        assert f"{sum(rounds[load])} of {len(rounds[load])} at {name.split()[0]}" in readme, load
    every = sum(all(p50(p["comparison_around_speed"]) for p in r["points"]) for r in runs)
    assert f"at all three loads in {every} of {n}" in readme
    sat = [r["saturation"]["relative_error"] for r in runs]
    assert (
        f"held within 15% in {sum(abs(e) <= 0.15 for e in sat)} of {n} runs ("
        + ", ".join(f"{e:+.0%}" for e in sat)
        + ")"
    ) in readme
    in_sample = max(abs(c[k]["relative_error"]) for r in runs for p in r["points"]
                    for w in ("own", "trace") for c in [p[f"comparison_{w}_speed"]]
                    for k in ("ttft_p50", "itl_p50"))  # fmt: skip
    assert in_sample <= 0.10 and "P50 within 10% in every run" in readme


def test_readme_predicted_step_of_a_chunk_and_16_decodes():
    """The README's 'a step holding a 2,048-token chunk and 16 decodes takes 43 ms' is what
    `kvjax simulate --step-time predicted` gives that step (llama-3-8b, H100), under the 50 ms
    ITL SLO."""
    from types import SimpleNamespace

    from kvjax import get_model_config
    from kvjax.hardware import get_chip
    from kvjax.serving.step_time import PredictedStepTime

    step = PredictedStepTime(get_model_config("llama-3-8b"), get_chip("h100-sxm"))
    batch = [SimpleNamespace(tokens=2048, context=4096)]
    batch += [SimpleNamespace(tokens=1, context=8192)] * 16
    ms = step(batch) * 1e3
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (
        f"a 2,048-token chunk and 16 decodes takes {ms:.0f} ms, under the 50 ms ITL SLO" in readme
    )
    assert ms < 50


def test_readmes_mha2mla_numbers_are_the_committed_exports():
    """The MHA -> MLA paragraphs (README, experiments/README) quote the committed paired
    differences and the conversion's step costs (experiments/benchmarks/mla_conversion.py)."""
    import pandas as pd

    from experiments.benchmarks.mla_conversion import step_costs

    readme = " ".join((ROOT / "README.md").read_text().split())
    runs = " ".join((ROOT / "experiments" / "README.md").read_text().split())
    d = pd.read_csv(ROOT / "experiments" / "results" / "quality_differences.csv")
    twins = d[(d.comparison == "mha2mla - mean") & (d.metric == "val_loss")]
    for width in (124, 60, 28):
        r = twins[twins.condition.str.startswith(f"MLA-{width} ")].iloc[0]
        quoted = f"{r['mean']:+.3f} [{r.low:+.3f}, {r.high:+.3f}]"
        assert quoted in readme and quoted in runs and bool(r.excludes_zero), width
    costs = step_costs(pd.read_csv(ROOT / "experiments" / "results" / "mla_conversion.csv"))
    for _, c in costs.iterrows():
        assert f"{c['mean']:+.3f} [{c.low:+.3f}, {c.high:+.3f}]" in runs, c.stage
    partial, shared = costs["mean"].iloc[:2]
    assert f"(+{partial:.2f} and +{shared:.2f} nats before the fine-tune)" in readme
