"""The step measured in situ: events grouped per step, every executed op attributed, every kernel
of the registry in exactly one row, rows on the roofline with the above-the-roof flag. No
speeds are asserted (timings on shared machines are noisy)."""

import glob
import json
import subprocess
import sys

import pytest
from support import optimised_env

from kvjax import KvjaxError, analytic, get_model_config, kernels
from kvjax.analytic import Workload
from kvjax.cli import main
from kvjax.hardware import chip_from_numbers
from kvjax.measured.attribution import kernel_rows, profile_report
from kvjax.measured.profile import OpEvent, StepProfile, per_step_op_seconds, profile_step
from kvjax.traced.compiled import CompiledOp
from kvjax.traced.hlo import Cost

CEILINGS = chip_from_numbers(100e9, 10e9, dtype="f32")


def test_events_are_grouped_per_step_by_execution():
    ev = [
        OpEvent("dot.1", "jit_attend", run_id=7, start_us=100.0, duration_us=5.0),
        OpEvent("dot.1", "jit_attend", run_id=-3, start_us=10.0, duration_us=4.0),
        OpEvent("fusion", "jit_attend", run_id=-3, start_us=15.0, duration_us=1.0),
        OpEvent("fusion", "jit_attend", run_id=7, start_us=106.0, duration_us=2.0),
        OpEvent("scatter", "jit_append", run_id=1, start_us=20.0, duration_us=3.0),
        OpEvent("scatter", "jit_append", run_id=2, start_us=120.0, duration_us=6.0),
        OpEvent("exp", "jit_exp", run_id=5, start_us=50.0, duration_us=9.0),  # not ours
    ]
    seconds, outside = per_step_op_seconds(ev, {"jit_attend", "jit_append"}, steps=2)
    assert seconds[("jit_attend", "dot.1")] == pytest.approx([4e-6, 5e-6])  # by first event
    assert seconds[("jit_append", "scatter")] == pytest.approx([3e-6, 6e-6])
    assert outside == 1
    # a backend that records no run id: the k-th execution of an op belongs to step k
    no_ids = [OpEvent(e.op, e.module, -1, e.start_us, e.duration_us) for e in ev]
    by_order, _ = per_step_op_seconds(no_ids, {"jit_attend", "jit_append"}, steps=2)
    assert by_order == seconds
    with pytest.raises(KvjaxError, match="3 executions of jit_attend, expected 2"):
        extra = OpEvent("dot.1", "jit_attend", run_id=9, start_us=200.0, duration_us=1.0)
        per_step_op_seconds([*ev, extra], {"jit_attend", "jit_append"}, steps=2)


@pytest.fixture(scope="module")
def decode_profile(tmp_path_factory):
    cfg = get_model_config("tiny-gqa")
    trace = tmp_path_factory.mktemp("trace")
    return profile_step(cfg, Workload("decode", 2, 64), steps=4, trace_dir=str(trace)), trace


def test_every_kernel_of_the_step_is_in_exactly_one_row(decode_profile):
    prof, _ = decode_profile
    assert prof.unmatched_events == 0
    rows = kernel_rows(prof)
    members = [m for r in rows for m in r.members]
    assert len(members) == len(set(members))
    wanted = set(analytic.step_kernels(prof.cfg, prof.workload))
    assert wanted <= set(members), wanted - set(members)
    for r in rows:
        assert r.median_s > 0 and r.ops > 0
        if len(r.members) == 1 and kernels.get(r.members[0]).kind == kernels.MATMUL:
            if r.members[0] != kernels.SCORES:  # the self score's product joins the softmax
                assert r.compiled_bytes >= r.closed_bytes


def test_the_trace_is_kept_for_perfetto_and_xprof(decode_profile):
    prof, trace = decode_profile
    assert prof.trace_dir and glob.glob(f"{prof.trace_dir}/perfetto_trace.json.gz")
    assert glob.glob(f"{trace}/plugins/profile/*/*.xplane.pb")


def test_report_places_rows_and_counts_coverage(decode_profile):
    prof, _ = decode_profile
    rep = profile_report(prof, CEILINGS)
    rows = rep["rows"]
    assert sum(r["median_s"] for r in rows) == pytest.approx(
        rep["coverage"] * rep["step"]["median_s"]
    )
    assert rep["coverage"] > 0  # its ops' share of the step (two threads' ops may overlap)
    for r in rows:
        assert r["fraction_of_bound"] == pytest.approx(r["bound_s"] / r["median_s"])
    step = analytic.step_cost(prof.cfg, prof.workload)
    assert rep["step"]["closed_bytes"] == step.bytes
    json.dumps(rep)  # plain data


def _fake(times_s, closed_bytes, compiled_bytes):
    """A one-kernel profile with made-up times: the flag logic alone."""
    cfg = get_model_config("tiny-gqa")
    op = CompiledOp("dot.1", "dot", (kernels.LM_HEAD,), (), Cost(0.0, 0.0, compiled_bytes))
    prof = StepProfile(cfg, Workload("decode", 1, 16), "cpu:test", len(times_s), list(times_s),
                       {("jit_attend", "dot.1"): list(times_s)}, {("jit_attend", "dot.1"): op},
                       None)  # fmt: skip
    rep = profile_report(prof, CEILINGS)
    (row,) = rep["rows"]
    assert row["closed_bytes"] == analytic.step_kernels(cfg, prof.workload)[kernels.LM_HEAD].bytes
    del closed_bytes
    return row


def test_above_the_roof_is_flagged_with_its_reason():
    closed = analytic.step_kernels(get_model_config("tiny-gqa"), Workload("decode", 1, 16))
    b = closed[kernels.LM_HEAD].bytes
    bound = b / 10e9
    ok = _fake([2 * bound] * 3, b, b)
    assert ok["above_roof"] is None and ok["fraction_of_bound"] == pytest.approx(0.5)
    fused = _fake([0.5 * bound] * 3, b, 0.25 * b)  # the compiled op moves a quarter
    assert "fewer bytes" in fused["above_roof"]
    impossible = _fake([0.5 * bound] * 3, b, b)
    assert "ceiling is too low" in impossible["above_roof"]


def test_cli_profile_json_names_every_kernel(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # ceilings measured quick, cached here
    from kvjax.measured.ceilings import load_or_measure_ceilings

    load_or_measure_ceilings(quick=True)
    cfg = get_model_config("tiny-gqa")
    # the CLI's B=1 default; two h_kv in decode, one in prefill (each point is a profiled run)
    # the decode profile as a user runs it: a child process with the optimised flags (the timed
    # steps run the CPU's optimised code; tests/conftest.py compiles the rest unoptimised); the
    # prefill one in this process (the kernels it names do not depend on the flags)
    env = optimised_env() | {"XDG_CACHE_HOME": str(tmp_path)}
    for phase, context, heads in (("decode", 8192, [1, 3]), ("prefill", 32, [3])):
        argv = ["profile", "--model", "tiny-gqa", "--phase", phase, "--context", str(context),
                "--kv-heads", ",".join(map(str, heads)), "--steps", "3",
                "--trace-dir", str(tmp_path / phase), "--json"]  # fmt: skip
        if phase == "decode":
            done = subprocess.run([sys.executable, "-m", "kvjax", *argv], env=env,
                                  capture_output=True, text=True, timeout=1800)  # fmt: skip
            assert done.returncode == 0, done.stderr[-3000:]
            out = done.stdout
        else:
            capsys.readouterr()
            assert main(argv) == 0
            out = capsys.readouterr().out
        report = json.loads(out)
        assert [p["model"]["num_kv_heads"] for p in report["points"]] == heads
        wanted = set(analytic.step_kernels(cfg, Workload(phase, 1, context)))
        for point in report["points"]:
            named = {m for r in point["rows"] for m in r["members"]}
            assert wanted <= named, (phase, wanted - named)
    assert main(["profile", "--model", "tiny-gqa", "--steps", "0"]) == 2
