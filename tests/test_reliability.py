"""Bad input is one line and exit 2, never a traceback or a silently wrong answer; no record is
lost or computed twice; the fit check runs before anything is allocated. One test per class of
what a hostile-but-fair user tried, and a fuzz test over config.json fields and CLI numbers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvjax import KvjaxError
from kvjax.cli import main
from kvjax.model.hf import from_hf_config
from kvjax.runs.launcher import run_experiment
from kvjax.runs.records import RunDir, point_file_name

ROOT = Path(__file__).resolve().parents[1]
LLAMA = {
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 8,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100,
}  # fmt: skip


def _one_line_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        code = main(argv)
        raise SystemExit(code)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2, err
    assert "Traceback" not in "\n".join(err)
    return err[-1]


def _write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


# -- tracebacks that became one line --------------------------------------------------------
@pytest.mark.parametrize(
    "argv,message",
    [
        (["calc", "--batch", "1" + "0" * 400], "too large"),
        (["calc", "--bandwidth", "1e-300", "--json"], "outside the sane range"),
        (["calc", "--model", "llama-2-70b", "--tp", "8,8"], "lists 8 more than once"),
        (["trace", "--model", "tiny-gqa", "--context", "4294967296"], "int32 positions"),
        (["figures", "--runs", "no_such_dir"], "is not a folder"),
    ],
)
def test_bad_numbers_and_folders_are_one_line(argv, message, capsys):
    assert message in _one_line_exit_2(argv, capsys)


def test_binary_files_are_one_line(tmp_path, capsys):
    blob = tmp_path / "config.json"
    blob.write_bytes(bytes(range(256)))
    assert "is not text" in _one_line_exit_2(["calc", "--model", str(blob)], capsys)
    yml = tmp_path / "x.yaml"
    yml.write_bytes(b"\x83\xff\x00" * 10)
    assert "is not text" in _one_line_exit_2(["run", str(yml), "--runs", str(tmp_path)], capsys)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("rope_theta", "abc", "rope_theta='abc' must be a positive number"),
        ("rms_norm_eps", [1], "rms_norm_eps=[1] must be a positive number"),
        ("hidden_act", ["silu"], "hidden_act=['silu'] must be a string"),
        ("num_key_value_heads", 0, "num_key_value_heads=0 must be a positive integer"),
        ("num_key_value_heads", False, "num_key_value_heads=False must be a positive integer"),
        ("tie_word_embeddings", "yes", "tie_word_embeddings='yes' must be true or false"),
    ],
)
def test_hf_fields_are_typed_and_never_defaulted(tmp_path, field, value, message):
    with pytest.raises(KvjaxError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_hf_config(_write(tmp_path, {**LLAMA, field: value}))


def test_a_documented_override_applies_before_validation(tmp_path, capsys):
    path = _write(tmp_path, {**LLAMA, "num_key_value_heads": 3})  # 8 heads: 3 is invalid
    assert main(["calc", "--model", str(path), "--kv-heads", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["num_kv_heads"] == 4


@pytest.mark.parametrize(
    "content,override,message",
    [
        ("experiment: seed_table\n", "model.num_kv_heads=[1,2", "malformed value"),
        ("experiment: seed_table\n", "sweep=[1]", "replaces a whole section"),
        ("experiment: seed_table\nsweep: [1, 2]\n", None, "sweep: must be a mapping"),
        ("experiment: kv_vs_context\noptions:\n  contexts: [1024, -5]\n", None,
         "options.contexts=[1024, -5] must be a non-empty list, each a positive integer"),
        ("experiment: kv_vs_context\noptions:\n  context: [1024]\n", None,
         "options.context: unknown option for experiment kv_vs_context "
         "(allowed: contexts, hybrids, windowed)"),
        ("experiment: roofline\noptions:\n  traced: maybe\n", None,
         "options.traced='maybe' must be true or false"),
    ],
)  # fmt: skip
def test_configs_and_options_are_checked_before_anything_runs(tmp_path, content, override,
                                                              message, capsys):  # fmt: skip
    path = tmp_path / "exp.yaml"
    path.write_text(content)
    argv = ["run", str(path), *([override] if override else []), "--runs", str(tmp_path / "r")]
    assert message in _one_line_exit_2(argv, capsys)
    assert not (tmp_path / "r").exists()  # nothing was written


def test_run_ids_are_plain_names(tmp_path, capsys):
    argv = ["run", str(ROOT / "configs/seed_table.yaml"), "--run-id", "../../x", "--runs",
            str(tmp_path / "r")]  # fmt: skip
    assert "must be a plain name" in _one_line_exit_2(argv, capsys)


def test_file_system_refusals_name_the_path(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    line = _one_line_exit_2(["explore", "--out", str(blocker / "x.html")], capsys)
    assert "a_file' is not a folder" in line


def test_overriding_the_preset_drops_the_files_label(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("experiment: seed_table\nmodel:\n  preset: seed-70b\n  name: my-label\n")
    run = run_experiment(cfg, ["model.preset=llama-2-7b"], tmp_path)
    assert {r["model"] for r in run.records()} == {"llama-2-7b"}


def test_explore_takes_a_config_json_and_escapes_it(tmp_path, capsys):
    path = _write(tmp_path, {**LLAMA, "_name_or_path": "</script><b>x"})
    out = tmp_path / "e.html"
    assert main(["explore", "--model", str(path), "--out", str(out)]) == 0
    html = out.read_text()
    assert "</script><b>" not in html.split("<script>", 1)[1].rsplit("</script>", 1)[0]
    assert "\\u003c/script>\\u003cb>x" in html


# -- records ---------------------------------------------------------------------------------
def _seed_run(tmp_path):
    return run_experiment(ROOT / "configs/seed_table.yaml", ["sweep.model.preset=[tiny-gqa]"],
                          tmp_path)  # fmt: skip


def test_a_corrupt_point_is_set_aside_and_recomputed(tmp_path, capsys):
    run = _seed_run(tmp_path)
    (point,) = list(run.points_dir.glob("*.json"))
    good = json.loads(point.read_text())
    point.write_text('{"key": "model.preset=tiny-gqa", "records": [')  # a full disk's half file
    assert main(["figures", "--runs", str(tmp_path), "--out", str(tmp_path / "f")]) == 0
    assert "does not parse as a point: skipped" in capsys.readouterr().err
    again = _seed_run(tmp_path)
    assert json.loads(point.read_text()) == good  # recomputed, same records
    assert list(run.points_dir.glob("*.corrupt-*"))  # kept for inspection
    assert again.path == run.path


def test_a_running_run_is_locked_and_a_dead_lock_taken_over(tmp_path):
    run = RunDir(tmp_path, "seed_table", "abc")
    with run.lock():
        with pytest.raises(KvjaxError, match=f"another kvjax run \\(pid {os.getpid()}\\)"):
            with run.lock():
                pass
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    (run.path / ".lock").write_text(dead)
    with run.lock():  # its holder is gone: taken over
        assert (run.path / ".lock").read_text() == str(os.getpid())
    assert not (run.path / ".lock").exists()


def test_a_finished_run_resumes_without_writing_and_files_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        run = _seed_run(tmp_path)
    finally:
        os.umask(old)
    files = sorted(p for p in run.path.rglob("*") if p.is_file())
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in files), [
        oct(p.stat().st_mode) for p in files
    ]
    stamps = {p: p.stat().st_mtime_ns for p in files}
    _seed_run(tmp_path)
    assert sorted(p for p in run.path.rglob("*") if p.is_file()) == files  # nothing added
    assert {p: p.stat().st_mtime_ns for p in files} == stamps  # nothing rewritten
    assert point_file_name("model.preset=tiny-gqa") in {p.name for p in files}


# -- memory ---------------------------------------------------------------------------------
def test_bench_refuses_the_default_70b_before_allocating(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    line = _one_line_exit_2(["bench"], capsys)
    assert "needs" in line and "GiB" in line and "free" in line
    assert not list(tmp_path.rglob("ceilings-*.json"))  # not even the ceilings were measured


# -- fuzz -------------------------------------------------------------------------------------
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**20), st.floats(allow_nan=True),
                   st.text(max_size=8), st.lists(st.integers(0, 4), max_size=3))  # fmt: skip


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(field=st.sampled_from([*LLAMA, "head_dim", "rope_theta", "rms_norm_eps", "hidden_act",
                              "tie_word_embeddings", "torch_dtype", "attention_bias"]),
       value=VALUES)  # fmt: skip
def test_fuzz_config_json_fields(tmp_path, field, value):
    """Any value of any field: a valid config or one KvjaxError, nothing else."""
    try:
        cfg = from_hf_config(_write(tmp_path, {**LLAMA, field: value}))
    except KvjaxError as exc:
        assert "\n" not in str(exc)
    else:
        assert cfg.num_layers > 0 and cfg.num_heads % cfg.num_kv_heads == 0


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(flag=st.sampled_from(["--batch", "--context", "--bandwidth", "--peak-flops", "--memory",
                             "--kv-heads", "--tp"]),
       text=st.one_of(st.text(max_size=12), st.integers(-5, 10**30).map(str),
                      st.floats().map(repr)))  # fmt: skip
def test_fuzz_cli_numbers(flag, text, capsys):
    """Any text for a number: exit 2 and one line, or valid JSON."""
    try:
        code = main(["calc", "--model", "tiny-gqa", flag, text, "--json"])
    except SystemExit as exc:  # argparse's own exit for a bad flag value
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if code == 0:
        json.loads(out)  # strict: no Infinity, no NaN
    else:
        assert code == 2 and err.strip()
