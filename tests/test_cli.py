import json
import subprocess
import sys

import pytest

from kvjax import analytic, get_model_config, kernels
from kvjax.analytic import Workload
from kvjax.cli import main

REQUIRED_KEYS = {
    "params",
    "weight_bytes",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "decode_flops",
    "decode_bytes",
    "decode_intensity",
    "attention_intensity",
    "ridge_flops_per_byte",
    "attainable_flops_per_s",
    "fraction_of_peak",
    "weight_floor_s_per_token",
    "step_floor_s",
    "kv_exceeds_weights_at_context",
    "kernels",
}


def run_json(capsys, *argv):
    assert main(["calc", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_calc_json_has_every_key_and_matches_analytic(capsys):
    out = run_json(capsys, "--model", "llama-3-8b", "--batch", "16", "--context", "32768")
    assert REQUIRED_KEYS <= out.keys()
    cfg = get_model_config("llama-3-8b")
    assert out["kv_cache_bytes"] == 2**36  # Check yourself 1
    assert out["params"] == analytic.num_params(cfg)
    assert out["decode_flops"] == analytic.step_cost(cfg, Workload("decode", 16, 32768)).flops
    for k in out["kernels"]:
        assert {"name", "flops", "bytes", "intensity", "bound_s", "bound"} <= k.keys()
        assert k["bound"] in ("memory", "compute")
    assert sum(k["flops"] for k in out["kernels"]) == pytest.approx(out["decode_flops"])


def test_calc_json_seed_defaults(capsys):
    out = run_json(capsys)
    assert out["model"]["name"] == "seed-70b" and out["chip"]["name"] == "h100-sxm"
    assert round(out["ridge_flops_per_byte"]) == 295
    assert round(out["weight_floor_s_per_token"] * 1e3) == 42
    assert out["kv_cache_bytes"] == 2.5 * 2**30  # GQA, 8k, one sequence
    assert out["attention_intensity"] == 8


def test_calc_explicit_sizes_override_preset(capsys):
    out = run_json(
        capsys, "--model", "llama-2-7b", "--kv-heads", "8", "--layers", "16", "--kv-dtype", "fp8"
    )
    assert out["model"]["num_kv_heads"] == 8 and out["model"]["num_layers"] == 16
    assert out["kv_bytes_per_token"] == 2 * 16 * 8 * 128 * 1


def test_calc_chip_by_numbers(capsys):
    out = run_json(capsys, "--peak-flops", "100e12", "--bandwidth", "1e12")
    assert out["ridge_flops_per_byte"] == 100 and out["chip"]["name"] == "custom"
    out = run_json(capsys, "--chip", "h200", "--bandwidth", "2e12")
    assert out["ridge_flops_per_byte"] == 989 / 2 and out["chip"]["memory_bytes"] == 141e9


def test_calc_context_suffix_and_variants(capsys):
    out = run_json(capsys, "--context", "128k", "--batch", "32", "--variants")
    assert out["workload"]["context"] == 131072
    assert [v["kv_bytes_per_token"] for v in out["variants"]] == [
        2560 * 1024,
        320 * 1024,
        40 * 1024,
        80 * (512 + 64) * 2,  # the MLA row: DeepSeek-V2's recipe for H=128 (A=4H, P=H/2)
    ]
    assert out["variants"][3]["variant"] == "MLA A=512 P=64"


def test_calc_config_json_path(capsys, tmp_path):
    cfg = {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    out = run_json(capsys, "--model", str(tmp_path / "config.json"))
    assert out["params"] == analytic.num_params(get_model_config("mistral-7b"))


def test_calc_table_output_names_units(capsys):
    assert main(["calc", "--variants"]) == 0
    text = capsys.readouterr().out
    for needle in (
        "2,560 KiB",
        "20.0 GiB",
        "10.0 TiB",
        "2.50 GiB",
        "1.25 TiB",
        "160 GiB",
        "ridge 295 FLOP/byte",
        "42.1 ms/token",
        "23.7 tokens/s",
        "3.35 TB/s",
    ):
        assert needle in text, needle


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--kv-heads", "6"], "num_heads=64 is not divisible by num_kv_heads=6"),
        (["--layers", "0"], "argument --layers: '0' must be a positive integer"),
        (["--batch", "-3"], "argument --batch: '-3' must be a positive integer"),
        (["--batch", "many"], "argument --batch: 'many' is not a positive integer"),
        (["--bandwidth", "fast"], "argument --bandwidth: 'fast' is not a number"),
        (["--model", "lama-3-8b"], "unknown model 'lama-3-8b'; did you mean: llama-3-8b"),
        (["--chip", "h300"], "unknown chip 'h300'"),
        (["--model", "/nonexistent/config.json"], "cannot read model config"),
        (["--kv-dtype", "int3"], "argument --kv-dtype: 'int3' is not a dtype"),
        (["--weight-dtype", "int4"], "argument --weight-dtype: 'int4' is not a dtype"),
        (["--phase", "train"], "argument --phase: invalid choice"),
        (["--chip", "tpu-v5e", "--weight-dtype", "f32"], "chip 'tpu-v5e' has no peak FLOP/s"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, message):
    proc = subprocess.run(
        [sys.executable, "-m", "kvjax", "calc", *argv], capture_output=True, text=True, timeout=1800
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert len([ln for ln in proc.stderr.splitlines() if "error" in ln]) == 1


def test_incomplete_config_json_exit_2(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}')
    proc = subprocess.run(
        [sys.executable, "-m", "kvjax", "calc", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 2 and "is incomplete: missing 'num_hidden_layers'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_trace_json(capsys):
    assert main(["trace", "--json", "--model", "tiny-gqa", "--batch", "2", "--context", "32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stage"] == "lowered" and out["backend"] == "cpu" and out["trace_seconds"] > 0
    names = [k["name"] for k in out["kernels"]]
    assert names[0] == kernels.EMBED and kernels.SCORES in names and names[-1] == kernels.OTHER
    for k in out["kernels"]:
        assert {
            "name",
            "closed_flops",
            "traced_flops",
            "closed_bytes",
            "traced_bytes",
            "intensity",
        } <= k.keys()
        if k["name"] != kernels.OTHER:
            assert k["flops_ratio"] == pytest.approx(1.0, abs=1e-9)
    assert out["total"]["traced_flops"] == out["xla_module"]["flops"]
    assert out["total"]["traced_bytes"] == out["xla_module"]["bytes accessed"]


def test_trace_compiled_and_one_layer(capsys):
    assert main(["trace", "--json", "--model", "tiny-mqa", "--stage", "compiled"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stage"] == "compiled" and out["kernels"] == [] and out["notes"]
    argv = ["trace", "--json", "--model", "llama-3-8b", "--trace-layers", "one", "--context", "256"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layers_traced"] == 1
    assert out["total"]["flops_ratio"] == pytest.approx(1.0, abs=1e-6)


def test_trace_bad_context_is_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "kvjax", "trace", "--model", "tiny-gqa", "--context", "1"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 2 and "needs context >= 2" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_model_given_by_dimensions_is_named_after_them():
    """`kvjax profile`/`trace` name their folders and records after the model traced: given by
    dimensions it is `custom-...` (or `<preset>-custom-<hash>` when a preset was reshaped),
    never the default preset's name; num_kv_heads alone keeps the preset's."""
    from types import SimpleNamespace

    from kvjax.cli.args import resolve_model

    def args(**kw):
        base = {"model": None, "layers": None, "d_model": None, "heads": None, "kv_heads": None,
                "head_dim": None, "d_ff": None, "vocab": None}  # fmt: skip
        return SimpleNamespace(**{**base, **kw})

    dims = resolve_model(args(layers=2, d_model=1024, heads=16, kv_heads=8, head_dim=64,
                              d_ff=2816, vocab=32000))  # fmt: skip
    assert dims.name == "custom-L2-D1024-N16-K8-H64-F2816-V32000"
    reshaped = resolve_model(args(model="tiny-gqa", layers=3))
    assert reshaped.name.startswith("tiny-gqa-custom-") and len(reshaped.name) == 24
    assert resolve_model(args(model="tiny-gqa", layers=4)).name != reshaped.name
    assert resolve_model(args(model="tiny-gqa", kv_heads=1)).name == "tiny-gqa"
    assert resolve_model(args()).name == "seed-70b"
