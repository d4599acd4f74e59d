"""Issue 48: every reader of a dtype name (CLI flags, experiment configs and options, the corpus
CSVs, a config.json) takes the aliases people write and stores the canonical name."""

import contextlib
import csv
import io
import json

import pytest

from kvjax.cli.main import main
from kvjax.dtypes import canonical_dtype
from kvjax.errors import KvjaxError
from kvjax.hardware import get_chip
from kvjax.model.hf import from_hf_config
from kvjax.predict.corpus import CORPUS_DIR, read_csv
from kvjax.runs import options as o
from kvjax.runs.config import expand, load_config, point_key, resolve, to_dict
from kvjax.runs.launcher import validated

ALIASES = [
    ("fp16", "f16"), ("float16", "f16"), ("half", "f16"), ("torch.float16", "f16"),
    ("bfloat16", "bf16"), ("BF16", "bf16"), ("jnp.bfloat16", "bf16"), ("torch.bfloat16", "bf16"),
    ("float32", "f32"), ("fp32", "f32"), ("np.float32", "f32"),
    ("float8_e4m3fn", "fp8"), ("e4m3", "fp8"), ("fp8_e4m3", "fp8"), ("float8_e5m2", "fp8"),
    ("e5m2", "fp8"), ("fp8_e5m2", "fp8"), (" int8 ", "int8"),
]  # fmt: skip


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's refusals
            code = exc.code
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(("alias", "name"), ALIASES)
def test_aliases_map_to_the_canonical_names(alias, name):
    assert canonical_dtype(alias) == name


def test_unknown_name_lists_the_names_and_the_aliases():
    with pytest.raises(KvjaxError) as exc:
        canonical_dtype("fp17", "kv_dtype", packed=True)
    msg = str(exc.value)
    assert msg.startswith("kv_dtype='fp17' is not supported; allowed: f32, bf16, f16, fp8, int8, ")
    assert "int4, int2 (aliases: " in msg
    assert "float16/fp16/half -> f16" in msg and "bfloat16 -> bf16" in msg
    with pytest.raises(KvjaxError, match=r"weight_dtype='int2' is not supported \(int4/int2 are"):
        canonical_dtype("int2", "weight_dtype")


# ---- the corpus CSVs and `kvjax validate` ------------------------------------------------------
def _rows(name, wanted):
    """The header and the first row of each dtype in `wanted`, from a committed corpus file."""
    with (CORPUS_DIR / name).open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = {}
        for row in reader:
            rows.setdefault(row["dtype"], row)
        return reader.fieldnames, [rows[d] for d in wanted]


def _write(path, header, rows, respell):
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, header)
        w.writeheader()
        for row in rows:
            w.writerow({k: respell.get((k, v), v) for k, v in row.items()})
    return path


def _validate(path):
    code, out, err = _run(["validate", str(path), "--json"])
    assert code == 0, err
    return json.loads(out)["rows"]


@pytest.mark.parametrize(("f16", "bf16"), [("fp16", "bfloat16"), ("float16", "BF16"),
                                           ("half", "torch.bfloat16")])  # fmt: skip
def test_validate_takes_respelled_dtypes_with_the_same_bound(tmp_path, f16, bf16):
    header, rows = _rows("attention_prefill.csv", ["f16", "bf16"])
    canonical = _validate(_write(tmp_path / "canonical.csv", header, rows, {}))
    respell = {("dtype", "f16"): f16, ("dtype", "bf16"): bf16}
    aliased = _validate(_write(tmp_path / "aliased.csv", header, rows, respell))
    assert [r["dtype"] for r in aliased] == ["f16", "bf16"]  # stored by the canonical name
    for a, c in zip(aliased, canonical, strict=True):
        for key in ("closed_flops", "closed_bytes", "bound_s", "fraction_of_bound",
                    "predicted_s", "predicted_lo_s", "predicted_hi_s"):  # fmt: skip
            assert a[key] == c[key]


def test_step_rows_take_respelled_dtype_and_kv_dtype(tmp_path):
    header, rows = _rows("steps.csv", ["fp8", "int4"])
    rows[0] = {**rows[0], "kv_dtype": "fp8"}
    canonical = _validate(_write(tmp_path / "canonical.csv", header, rows, {}))
    respell = {("dtype", "fp8"): "float8_e4m3fn", ("kv_dtype", "fp8"): "e4m3"}
    aliased = _validate(_write(tmp_path / "aliased.csv", header, rows, respell))
    assert [(r["dtype"], r["kv_dtype"]) for r in aliased] == [("fp8", "fp8"), ("int4", None)]
    assert [r["bound_s"] for r in aliased] == [r["bound_s"] for r in canonical]


def test_unknown_dtype_in_a_csv_is_refused_with_the_list(tmp_path):
    header, rows = _rows("matmul.csv", ["bf16"])
    bad = _write(tmp_path / "bad.csv", header, rows, {("dtype", "bf16"): "fp17"})
    code, _, err = _run(["validate", str(bad)])
    assert code == 2
    allowed = "f32, bf16, f16, fp8, int8, int4, fp4"
    assert f"{bad}:2: column 'dtype': 'fp17'; allowed: {allowed} (" in err
    assert "aliases: " in err and "float16/fp16/half -> f16" in err


def test_fp4_is_a_gemms_dtype_only_in_the_corpus(tmp_path):
    """fp4 (NVFP4, MXFP4) is a block-scaled GEMM's input at the chip's fp4 peak; no kernel of
    another kind runs on it in kvjax's closed forms, so a step row in fp4 is refused by name."""
    header, rows = _rows("steps.csv", ["bf16"])
    bad = _write(tmp_path / "bad.csv", header, rows, {("dtype", "bf16"): "nvfp4"})
    with pytest.raises(KvjaxError, match=r"column 'dtype': 'fp4' is a GEMM's dtype; a "
                                         r"decode_step row takes one of f32, bf16, f16, fp8, int8, "
                                         r"int4"):  # fmt: skip
        read_csv(bad)


def test_int2_is_a_kv_dtype_only_in_the_corpus(tmp_path):
    """int4 weights are modelled (weight-only, half of int8's bytes); int2 weights are not, so the
    dtype column refuses int2, while a step's int2 cache is sized as `ModelConfig` sizes it."""
    header, rows = _rows("steps.csv", ["bf16"])
    bad = _write(tmp_path / "bad.csv", header, rows, {("dtype", "bf16"): "int2"})
    with pytest.raises(KvjaxError, match=r"column 'dtype': 'int2' \(int2 is a KV-cache dtype"):
        read_csv(bad)
    cache = {k: _write(tmp_path / f"{k}.csv", header, [{**rows[0], "kv_dtype": k}], {})
             for k in ("bf16", "int4", "int2")}  # fmt: skip
    bytes_ = {k: _validate(p)[0]["closed_bytes"] for k, p in cache.items()}
    assert bytes_["int2"] < bytes_["int4"] < bytes_["bf16"]


# ---- CLI flags, experiment configs and options, config.json, chips -----------------------------
def test_cli_dtype_flags_take_aliases(capsys):
    def calc(*flags):
        assert main(["calc", "--model", "llama-3-8b", "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out)

    aliased = calc("--kv-dtype", "fp16", "--weight-dtype", "torch.bfloat16")
    canonical = calc("--kv-dtype", "f16", "--weight-dtype", "bf16")
    assert aliased == canonical
    with pytest.raises(SystemExit):
        main(["calc", "--kv-dtype", "fp17"])
    err = capsys.readouterr().err
    assert "argument --kv-dtype: 'fp17' is not a dtype; allowed: f32, bf16, f16" in err
    assert "(aliases: " in err and "bfloat16 -> bf16" in err


def test_experiment_config_stores_canonical_dtypes(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("experiment: roofline\nmodel:\n  preset: tiny-gqa\n  weight_dtype: float32\n"
                    "  kv_group_size: 8\n"
                    "sweep:\n  model.kv_dtype: [fp16, e4m3, int4]\n")  # fmt: skip
    cfg = load_config(path, ["model.state_dtype=fp32"])
    assert to_dict(cfg)["model"]["weight_dtype"] == "f32"
    assert to_dict(cfg)["model"]["state_dtype"] == "f32"
    assert to_dict(cfg)["sweep"]["model.kv_dtype"] == ["f16", "fp8", "int4"]
    points = expand(cfg)
    assert [point_key(cfg, p) for p in points] == [f"model.kv_dtype={k}" for k in
                                                   ("f16", "fp8", "int4")]  # fmt: skip
    assert [resolve(p)[0].kv_dtype for p in points] == ["f16", "fp8", "int4"]
    with pytest.raises(KvjaxError) as exc:
        load_config(path, ["sweep.model.kv_dtype=[bf16, fp17]"])
    assert f"{path}: sweep.model.kv_dtype='fp17' is not supported; allowed: f32" in str(exc.value)
    assert "(aliases: " in str(exc.value)
    with pytest.raises(KvjaxError, match=r"model.weight_dtype='int4' is not supported \(int4"):
        load_config(path, ["model.weight_dtype=int4"])


def test_experiment_dtype_options_take_aliases(tmp_path):
    opt = o.dtype_of("int8", "fp8", "int4", "int2")
    assert opt.check("e4m3") and opt.check("INT4") and not opt.check("f16")
    assert "aliases: " in opt.want
    path = tmp_path / "q.yaml"
    path.write_text("experiment: hkv_quality\nmodel:\n  preset: tiny-gqa\n"
                    "options:\n  eval_kv_dtypes: [int8, float8_e4m3fn]\n")  # fmt: skip
    validated(path, [])
    path.write_text("experiment: tensor_parallel\noptions:\n  trace_dtype: float32\n")
    validated(path, [])
    path.write_text("experiment: tensor_parallel\noptions:\n  trace_dtype: fp17\n")
    with pytest.raises(KvjaxError, match=r"options.trace_dtype='fp17' must be one of: f32, bf16"):
        validated(path, [])


HF = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160,
      "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
      "vocab_size": 96}  # fmt: skip


@pytest.mark.parametrize(("key", "value", "name"), [
    ("torch_dtype", "float16", "f16"), ("torch_dtype", "torch.bfloat16", "bf16"),
    ("dtype", "float32", "f32"), ("torch_dtype", "bf16", "bf16"),
])  # fmt: skip
def test_config_json_dtype_aliases(tmp_path, key, value, name):
    (tmp_path / "config.json").write_text(json.dumps({**HF, key: value}))
    cfg = from_hf_config(tmp_path / "config.json")
    assert (cfg.weight_dtype, cfg.kv_dtype) == (name, name)


def test_config_json_unknown_dtype_is_refused_naming_its_key(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF, "torch_dtype": "float64"}))
    with pytest.raises(KvjaxError) as exc:
        from_hf_config(path)
    assert "torch_dtype='float64' is not supported; allowed: f32, bf16" in str(exc.value)
    assert "(aliases: " in str(exc.value)
    # both dtypes given: the file's is not read
    assert from_hf_config(path, weight_dtype="f32", kv_dtype="fp16").kv_dtype == "f16"


def test_chip_peaks_take_aliases():
    chip = get_chip("h100-sxm")
    assert chip.peak("bfloat16") == chip.peak("bf16")
    assert chip.peak("float8_e4m3fn") == chip.peak("fp8")
