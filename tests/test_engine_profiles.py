"""Engines as cited profiles: every default names the line it comes from and that line holds the
value; the chip-dependent rules by hand; `kvjax simulate --engine` runs one, flags over it."""

import json
import re

import pytest

from kvjax.errors import KvjaxError
from kvjax.hardware import get_chip
from kvjax.serving.engine_profiles import PROFILES, check_cited, get_profile, resolve

# defaults kvjax takes without a line of the engine's (said in the profile)
UNCITED = {
    ("trtllm-serve", "page_size"),
    ("trtllm-bench", "page_size"),
    ("trtllm-bench", "prefix_caching"),
}


def _numbers(line: str) -> set[float]:
    return {float(x) for x in re.findall(r"\d*\.?\d+", line)}


@pytest.mark.parametrize("key", sorted(PROFILES))
def test_every_default_cites_the_line_that_sets_it(key):
    """repo@commit-or-tag:path:line for each default (but the three kvjax states it takes
    itself), and a numeric default is a number on its quoted line (a commit is 40 hex digits,
    a tag is v-something)."""
    p = PROFILES[key]
    assert check_cited(p) == []
    for name, d in p.defaults.items():
        if (p.name, name) in UNCITED:
            assert d.cite == "" and d.line
            continue
        repo, rest = d.cite.split("@", 1)
        ref = rest.split(":")[0]
        assert "/" in repo and (re.fullmatch(r"[0-9a-f]{40}", ref) or ref.startswith("v")), d
        if isinstance(d.value, int | float) and not isinstance(d.value, bool):
            if (p.name, name) != ("trtllm-bench", "token_budget"):  # 4096 x (1 + ISL / OSL)
                assert float(d.value) in _numbers(d.line) or (
                    d.value == 1.0 and name == "memory_utilization"  # TRT-LLM: of free memory
                ), (key, name, d)


def test_vllm_and_sglang_defaults_by_device_by_hand():
    """vLLM V1: 70 GiB or more and not an A100: 1024 sequences, 8192 tokens a step (vllm serve),
    16384 (the LLM class); else 256 and 2048 (8192). SGLang: an 8192-token chunk below 160 GiB,
    16384 above, and (memory - reserved) / memory with reserved = 512 + 1.5 chunk + 512 + 128
    MiB, 10 GiB at least."""
    h100, a100, b200 = (get_chip(c) for c in ("h100-sxm", "a100-80gb", "b200"))
    serve = get_profile("vllm")
    assert (
        serve.settings(h100)[0].max_batch == 1024 and serve.settings(h100)[0].token_budget == 8192
    )
    assert (serve.settings(a100)[0].max_batch, serve.settings(a100)[0].token_budget) == (256, 2048)
    assert get_profile("vllm-llm").settings(b200)[0].token_budget == 16384
    sg = get_profile("sglang")
    mib = 80e9 / 2**20
    assert sg.settings(h100)[0].memory_utilization == round((mib - 13440) / mib, 3)
    big = 180e9 / 2**20
    e = sg.settings(b200)[0]
    assert (e.token_budget, e.memory_utilization) == (16384, round((big - 25728) / big, 3))
    assert get_profile("trtllm-serve").settings(h100)[0].reserve is True
    assert get_profile("vllm@0.6.3").settings(h100)[0].chunked_prefill is False
    with pytest.raises(KvjaxError, match="unknown engine 'tgi'"):
        get_profile("tgi")


def test_simulate_runs_an_engine_with_the_flags_over_it(capsys):
    """`kvjax simulate --engine vllm --concurrency 16`: vllm serve's settings, each with its
    line, in the JSON and in the table; --max-batch given wins and says so; without --engine none
    is printed."""
    from kvjax.cli.main import main

    args = [
        "simulate",
        "--model",
        "llama-3.1-8b",
        "--chip",
        "h100-sxm",
        "--concurrency",
        "16",
        "--requests",
        "32",
        "--prompt-len",
        "1024",
        "--output-len",
        "32",
        "--json",
    ]
    assert main([*args, "--engine", "vllm", "--max-batch", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    used = out["engine"]["settings"]
    assert out["engine"]["profile"] == "vllm@0.11.2" and out["token_budget"] == 8192
    assert used["max_batch"] == {"value": 8, "from": "given"}
    assert used["token_budget"]["line"] == "UsageContext.OPENAI_API_SERVER: 8192,"
    assert main(args) == 0
    assert "engine" not in json.loads(capsys.readouterr().out)
    text = [a for a in args if a != "--json"]  # the table prints each setting and its source
    assert main([*text, "--engine", "vllm", "--max-batch", "8"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "engine vllm@0.11.2 (vllm serve):" in printed and "max_batch = 8 (a flag)" in printed
    assert "token_budget = 8192 (vllm-project/vllm@275de34" in printed
    engine, _ = resolve(None, get_chip("h100-sxm"), {})
    assert (engine.max_batch, engine.token_budget, engine.page_size) == (256, 2048, 16)


def test_a_published_row_naming_only_its_engine_runs_that_engines_defaults():
    """A vLLM row with no stated settings: offline runs `vllm bench throughput`'s LLM-class
    defaults (1,024 requests and 16,384 tokens a step on an H100, as cited), a served row
    `vllm serve`'s (8,192 tokens), a row naming release 0.6.3 that release's V0 profile (256
    requests, 2,048 tokens, no chunking); SGLang's on an H100 its 8,192-token chunk; each said."""
    from kvjax.serving.engines import engine_of

    row = dict(source="mine", implementation="vLLM", scenario="offline", chip="h100-sxm")
    engine, said = engine_of(row)
    assert (engine["max_batch"], engine["token_budget"], engine["reserve"]) == (1024, 16384, False)
    assert "vllm-llm" in said and "the row states none" in said
    engine, said = engine_of({**row, "scenario": "concurrency"})
    assert engine["token_budget"] == 8192 and "(vllm, " in said
    engine, said = engine_of({**row, "scenario": "rate", "engine_version": "0.6.3"})
    assert (engine["max_batch"], engine["token_budget"], engine["chunked"]) == (256, 2048, False)
    assert "vllm@0.6.3" in said
    engine, _ = engine_of({**row, "implementation": "SGLang", "scenario": "rate"})
    assert engine["token_budget"] == 8192 and engine["page_size"] == 1


def test_a_published_rows_own_command_line_over_its_engines_defaults():
    """DataCrunch's BF16-labelled DeepSeek-V3 on 8 H200 (SGLang's repository) states
    --mem-fraction-static 0.8 over SGLang's defaults, its FP8 runs nothing; tpu-recipes'
    Llama-3.3-70B on a v6e-8 states --max-num-seqs 256, --max-num-batched-tokens 512 and
    --gpu-memory-utilization 0.98 over vllm serve's; each said."""
    from kvjax.serving.engines import engine_of
    from kvjax.serving.systems import read_systems

    rows = {r["source"]: r for r in read_systems()}
    dsv3 = rows["sglang-bench-dsv3:deepseek-v3:8xh200:bf16:in1024-out1024:rate1:output_tps"]
    engine, said = engine_of(dsv3)
    assert engine["util"] == 0.8 and engine["token_budget"] == 8192  # H200: SGLang's 8,192 chunk
    assert said.startswith("the row's stated util over SGLang's defaults")
    assert "--mem-fraction-static 0.8" in dsv3["convention"]
    fp8 = rows["sglang-bench-dsv3:deepseek-v3:8xh200:fp8:in1024-out1024:rate1:output_tps"]
    assert "--mem-fraction-static" not in fp8["convention"]
    assert engine_of(fp8)[0]["util"] != 0.8 and "the row states none" in engine_of(fp8)[1]
    tpu = rows["tpu-recipes:vllm-tpu:llama-3.3-70b:v6e-8:tp8:in1000-out1000:c64:output_tps"]
    engine, said = engine_of(tpu)
    assert (engine["max_batch"], engine["token_budget"], engine["util"]) == (256, 512, 0.98)
    assert tpu["implementation"] == "vLLM (TPU)" and "(vllm, " in said
    for flag in (
        "--max-num-seqs 256",
        "--max-num-batched-tokens 512",
        "--gpu-memory-utilization 0.98",
    ):
        assert flag in tpu["convention"]


def test_sglang_jax_runs_sglangs_scheduler_on_its_stated_flags():
    """sglang-jax's Qwen3-8B sweep on a v6e-4 states its memory fraction, chunk, running
    requests and page over SGLang's scheduler (which SGLang-JAX ports): each setting is the
    flag its command line, quoted in the row's convention, gives."""
    from kvjax.serving.engines import engine_of
    from kvjax.serving.systems import read_systems

    rows = [r for r in read_systems() if r["implementation"] == "SGLang-JAX"]
    assert len(rows) >= 18 and {r["chip"] for r in rows} == {"tpu-v6e"}
    for row in rows:
        engine, said = engine_of(row)
        flags = dict(re.findall(r"--([a-z-]+)[= ]([0-9.]+)", row["convention"]))
        assert engine["util"] == float(flags["mem-fraction-static"])
        assert engine["token_budget"] == int(flags["chunked-prefill-size"])
        assert engine["max_batch"] == int(flags["max-running-requests"])
        assert engine["page_size"] == int(flags["page-size"])
        assert engine["reserve"] is False and "over SGLang-JAX's defaults" in said
