"""The explorer page: its JavaScript formulas against `kvjax calc --json`, in a real headless
Chromium (Debian's, driven by Playwright), opened from disk with the network cut off."""

import json
import os
import random
import re
import shutil

import pytest
from support import require, require_module

from kvjax.analytic import Workload, step_cost, step_kernels, weight_bytes
from kvjax.analytic.variants import mla_variant
from kvjax.cli import main
from kvjax.cli.args import finite_json
from kvjax.cli.calc_report import calc_report
from kvjax.hardware import CHIPS
from kvjax.model.config import PRESETS
from kvjax.plotting.explorer import explorer_data, render_explorer, write_explorer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_page_embeds_the_python_presets_and_fetches_nothing(tmp_path):
    html = render_explorer()
    data = json.loads(re.search(r"const DATA = (\{.*?\});\n", html).group(1))
    assert data["default_model"] == "seed-70b" and data["default_chip"] == "h100-sxm"
    # the hybrids' state layers (issue 31) included
    assert set(data["models"]) == {n for n in PRESETS if not n.startswith("tiny")}
    assert set(data["chips"]) == set(CHIPS)
    assert data["models"]["gemma-7b"]["head_dim"] == 256
    assert data == json.loads(
        json.dumps({**explorer_data(), "default_model": "seed-70b", "default_chip": "h100-sxm"})
    )
    assert not re.search(r"""(src|href)=["']?https?:""", html)  # nothing loaded at view time
    assert write_explorer(tmp_path / "x.html").read_text() == html


def _browser():
    require(CHROMIUM is not None, "no chromium on this machine (Debian's package; see .ci/run)")
    return require_module("playwright.sync_api")


def _number(text):
    return float(re.match(r"\s*([-+0-9.eE]+)", text).group(1))


def _calc(model, chip, batch, context, kv_heads, kv_dtype, capsys, attention_kernel="xla"):
    argv = [
        "calc",
        "--json",
        "--attention-kernel",
        attention_kernel,
        "--model",
        model,
        "--chip",
        chip,
        "--batch",
        str(batch),
        "--context",
        str(context),
        "--kv-heads",
        str(kv_heads),
        "--kv-dtype",
        kv_dtype,
    ]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _calc_json(argv, capsys):
    assert main(["calc", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def _placed(cfg, chip, batch, context, tp, dp, ep):
    """What the page shows per device and for serving on a placement, from kvjax.analytic (None
    where the placement does not divide the model or the batch)."""
    from kvjax.analytic import parallel, placement_point, serving
    from kvjax.errors import KvjaxError

    pl = parallel.Placement(tp, ep, dp)
    spec = CHIPS[chip]
    wl = Workload("decode", batch, context)
    try:
        point = placement_point.placement_point(cfg, pl, wl, spec)
    except KvjaxError:
        return None
    out = {"weights": point.weight_bytes_per_device, "kv": point.kv_cache_bytes_per_device,
           "collectives": point.collective_bytes_per_step,
           "memory": point.weight_bytes_per_device + point.kv_cache_bytes_per_device
           + point.activation_bytes_per_device}  # fmt: skip
    if pl.devices > 1 and not spec.interconnect_bytes_per_s:
        return out
    curve = serving.frontier(cfg, spec, context, tp=tp, ep=ep, dp_attention=dp)
    dev = parallel.device_config(cfg, tp) if tp > 1 else cfg
    step = serving.step_bound_s(dev, parallel.device_workload(cfg, pl, wl), spec)
    if pl.devices > 1:  # the collectives overlapped with compute: the larger (the bound)
        step = max(step, point.collective_bytes_per_step / spec.interconnect_bytes_per_s)
    out.update(max_batch=curve["max_batch"], serve_ms=1e3 * step,
               serve_tokens=batch / step / pl.devices)  # fmt: skip
    return out


SERVING = ("out-max_batch", "out-serve_ms", "out-serve_tokens")  # one chip's: calc's keys
OUTPUTS = {  # element id -> (calc --json key, scale to the displayed unit)
    "out-kv_cache": ("kv_cache_bytes", 2**-30),
    "out-state": ("state_bytes", 2**-30),  # a hybrid's state layers (issue 31), 0 otherwise
    "out-cache": ("cache_bytes", 2**-30),
    "out-weights": ("weight_bytes", 2**-30),
    "out-decode_intensity": ("decode_intensity", 1),
    "out-attention_intensity": ("attention_intensity", 1),
    "out-ridge": ("ridge_flops_per_byte", 1),
    "out-attainable": ("attainable_flops_per_s", 1e-12),
    "out-fraction": ("fraction_of_peak", 100),
    "out-weight_floor": ("weight_floor_s_per_token", 1e3),
    "out-step_floor": ("step_floor_s", 1e3),
    "out-tokens": ("tokens_per_s", 1),
    "out-attn_xla": ("attention_kernel.xla.intensity", 1),
    "out-attn_flash": ("attention_kernel.flash.intensity", 1),
    "out-max_batch": ("max_serving_batch", 1),
    "out-serve_ms": ("kernel_sum_bound_s", 1e3),
    "out-serve_tokens": ("serving_tokens_per_s", 1),
}


def _key(report, dotted):
    for part in dotted.split("."):
        report = report[part]
    return report


def test_page_agrees_with_calc_at_random_points(tmp_path, capsys):
    sync_api = _browser()
    page_path = write_explorer(tmp_path / "explorer.html")
    rng = random.Random(0)
    models = [n for n in PRESETS if not n.startswith("tiny")]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        context = browser.new_context(offline=True, viewport={"width": 1150, "height": 900})
        page = context.new_page()
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(page_path.as_uri())

        def read():
            return {i: page.inner_text(f"#{i}") for i in [*OUTPUTS, "out-fits"]}

        # the seed's defaults: GQA, 8k, one sequence: 2.5 GiB; 42 ms/token for weights alone
        shown = read()
        assert shown["out-kv_cache"] == "2.500 GiB"
        assert round(_number(shown["out-weight_floor"])) == 42
        assert round(_number(shown["out-ridge"])) == 295
        # ... on 2 H100s, the fewest that hold it and a sequence of 8k (141 GB of weights), its
        # frontier drawn
        assert page.inner_text("#out-devices") == "2 (tp 2)"
        seed = PRESETS["seed-70b"].replace(attention_kernel="xla")
        opening = _placed(seed, "h100-sxm", 1, 8192, 2, 1, 1)
        assert int(page.inner_text("#out-max_batch")) == opening["max_batch"] > 0
        assert "max B" in page.inner_html("#frontier")
        page.screenshot(path=str(tmp_path / "explorer_default.png"), full_page=True)

        checked = []

        def check_point(model, chip, kv_heads, attention, latent_pick, kv_dtype, b_exp, s_exp,
                        fused, placed=(1, 1, 1)):  # fmt: skip
            """The page at one point against `kvjax calc` (or the MLA variant's report), and
            on the placement (tp, dp-attention, ep) against kvjax.analytic.parallel."""
            for sel, value in zip(("#tp", "#dp_attention", "#ep"), placed, strict=True):
                page.select_option(sel, str(value))
            page.select_option("#model", model)
            page.select_option("#chip", chip)
            page.select_option("#attention", attention)
            latent = None
            if attention == "gqa":
                page.select_option("#kv_heads", str(kv_heads))
            else:
                options = page.eval_on_selector_all("#latent option", "os => os.map(o => o.value)")
                latent = int(latent_pick(options))
                page.select_option("#latent", str(latent))
            page.select_option("#kv_dtype", kv_dtype)
            page.select_option("#attention_kernel", fused)
            for slider, value in (("batch", b_exp), ("context", s_exp)):
                page.eval_on_selector(
                    f"#{slider}",
                    "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }",
                    value,
                )
            shown = read()
            if latent is None:
                want = _calc(model, chip, 2**b_exp, 2**s_exp, kv_heads, kv_dtype, capsys, fused)
            else:  # the page's MLA: kvjax's MLA variant of the preset (`calc --variants`' row)
                mla = mla_variant(PRESETS[model]).replace(
                    kv_lora_rank=latent,
                    mla_decode=attention,
                    kv_dtype=kv_dtype,
                    attention_kernel=fused,
                )
                wl = Workload("decode", 2**b_exp, 2**s_exp)
                want = finite_json(calc_report(mla, wl, CHIPS[chip]))
            point = (model, chip, 2**b_exp, 2**s_exp, kv_heads, kv_dtype, attention, latent, fused,
                     placed)  # fmt: skip
            cfg = mla if latent is not None else PRESETS[model].replace(
                num_kv_heads=kv_heads, kv_dtype=kv_dtype, attention_kernel=fused)  # fmt: skip
            tp, dp, ep = placed
            ref = _placed(cfg, chip, 2**b_exp, 2**s_exp, tp, dp, ep)
            checked.append((placed, ref is not None and "serve_ms" in ref))
            if ref is None:
                assert page.inner_text("#out-weights_device") == "-", point
            else:
                for element, key, scale in (("out-weights_device", "weights", 2**-30),
                                            ("out-kv_device", "kv", 2**-30),
                                            ("out-collectives", "collectives", 1e-6),
                                            ("out-fits_device", "memory", 2**-30)):  # fmt: skip
                    assert _number(page.inner_text(f"#{element}")) == pytest.approx(
                        ref[key] * scale, rel=6e-4, abs=1e-9), (point, element)  # fmt: skip
                for element, key in zip(SERVING, ("max_batch", "serve_ms", "serve_tokens"),
                                        strict=True):  # fmt: skip
                    if key in ref:
                        assert _number(shown[element]) == pytest.approx(ref[key], rel=6e-4), (
                            point, element)  # fmt: skip
            for element, (key, scale) in OUTPUTS.items():
                if element in SERVING and placed != (1, 1, 1):
                    continue  # the placement's, checked above
                # shown to 4 significant digits: agree to half a unit in the last place
                assert _number(shown[element]) == pytest.approx(
                    _key(want, key) * scale, rel=6e-4
                ), (
                    point,
                    element,
                    shown[element],
                    _key(want, key) * scale,
                )
            fits = "does not fit" not in shown["out-fits"]
            assert fits == want["fits_in_memory"], point

        for i in range(30):
            model = rng.choice(models)
            chip = rng.choice(sorted(CHIPS))
            kv_heads = rng.choice(PRESETS[model].kv_head_choices())
            attention = ["gqa", "absorbed", "naive"][i % 3]  # a third each: GQA, MLA's two forms
            if PRESETS[model].is_mla and attention == "gqa":  # DeepSeek: MLA is its attention
                attention = "absorbed"
            if PRESETS[model].is_hybrid:  # state layers beside full attention only (no MLA)
                attention = "gqa"
            # int8 caches need per-token scales, not modelled for MLA's latent (the page's
            # int8 option is disabled there)
            per_row = ["int8", "int4", "int2"]  # per-row scales: GQA only
            if PRESETS[model].head_dim % PRESETS[model].kv_group_size or PRESETS[model].is_hybrid:
                per_row = ["int8"]  # no packed cache: disabled on the page
            kv_dtype = rng.choice(
                ["bf16", "f16", "f32", "fp8"] + (per_row if attention == "gqa" else [])
            )
            b_exp, s_exp = rng.randint(0, 10), rng.randint(7, 20)
            fused = ["xla", "flash"][(i // 3) % 2]  # the attention kernel, both for each form
            placements = [(1, 1, 1), (2, 1, 1), (8, 1, 1), (1, 4, 1), (2, 2, 1)]
            if PRESETS[model].is_moe:
                placements += [(1, 8, 8), (1, 4, 4)]
            placed = placements[0] if i % 2 else rng.choice(placements)
            check_point(model, chip, kv_heads, attention, rng.choice, kv_dtype, b_exp, s_exp,
                        fused, placed)  # fmt: skip
        # placements checked with their serving numbers (not refused, the chip has a link)
        assert sum(ok for p, ok in checked if p != (1, 1, 1)) >= 4, checked
        # every preset whose features the random draws may miss, decode at B = 8, S = 8k, both
        # attention kernels: gpt-oss (sinks, biased router and experts, MXFP4, YaRN), Apertus
        # (xIELU, llama3 RoPE), DeepSeek-V3 (YaRN on MLA), InternLM3, and the hybrids (issue 31:
        # Gated DeltaNet, Mamba-2 heads, LFM2's convolutions; their states beside the KV cache)
        hybrids = ("qwen3-next-80b-a3b", "falcon-h1-7b", "lfm2-1.2b")
        for model in ("gpt-oss-20b", "gpt-oss-120b", "apertus-8b", "deepseek-v3", "internlm3-8b",
                      *hybrids):  # fmt: skip
            attention = "absorbed" if PRESETS[model].is_mla else "gqa"
            for fused in ("xla", "flash"):
                widest = lambda options: max(map(int, options))  # noqa: E731
                check_point(model, "h100-sxm", PRESETS[model].num_kv_heads, attention, widest,
                            "bf16", 3, 13, fused)  # fmt: skip
        # a sliding-window model past its window: Mistral-7B-v0.1 at 32k holds 4096 positions
        page.select_option("#model", "mistral-7b")
        page.select_option("#attention", "gqa")
        page.select_option("#attention_kernel", "xla")
        page.select_option("#kv_heads", "8")
        page.select_option("#kv_dtype", "bf16")
        page.select_option("#chip", "h100-sxm")
        for slider, value in (("batch", 0), ("context", 15)):
            page.eval_on_selector(
                f"#{slider}",
                "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }",
                value,
            )
        shown = read()
        want = _calc("mistral-7b", "h100-sxm", 1, 2**15, 8, "bf16", capsys)
        assert shown["out-kv_cache"] == "0.5000 GiB" and want["kv_cache_bytes"] == 2**29
        assert page.inner_text("#out-window") == "32 of 32 hold 4096 (window 4096)"
        for kv_dtype in ("bf16", "int8", "fp8", "int4", "int2"):  # quantized, with their scales
            page.select_option("#kv_dtype", kv_dtype)
            shown = read()
            want = _calc("mistral-7b", "h100-sxm", 1, 2**15, 8, kv_dtype, capsys)
            js = (
                "decodeStep(Object.assign({}, DATA.models['mistral-7b'], "
                f"{{kv_dtype: '{kv_dtype}'}}), 1, 32768)"
            )
            closed = step_cost(
                PRESETS["mistral-7b"].replace(kv_dtype=kv_dtype), Workload("decode", 1, 32768)
            )
            assert page.evaluate(js)[:2] == [pytest.approx(closed.flops, rel=1e-12),
                                         pytest.approx(closed.bytes, rel=1e-12)]  # fmt: skip
            for element, (key, scale) in OUTPUTS.items():
                assert _number(shown[element]) == pytest.approx(
                    _key(want, key) * scale, rel=6e-4
                ), (
                    kv_dtype,
                    element,
                )
        # int2 with an f16 scale and zero point per 32 elements: (0.25 + 4/32) / 2 of the bf16 cache
        assert want["kv_cache_bytes"] == 2**29 * 3 // 16
        # Gemma 2 / Gemma 3 / Qwen3: sandwich and q/k norms, (1 + w), embedding scale, soft-caps,
        # local RoPE bases, past their windows (batch 4, 32k)
        models = [("gemma-2-9b", 8), ("gemma-3-27b", 16), ("qwen3-8b", 8), ("mixtral-8x7b", 8),
                  ("qwen3-30b-a3b", 4), ("llama-4-scout", 8)]  # fmt: skip
        for model, kv_heads in models:
            page.select_option("#model", model)
            page.select_option("#attention", "gqa")
            page.select_option("#kv_heads", str(kv_heads))
            page.select_option("#kv_dtype", "bf16")
            page.eval_on_selector(
                "#batch", "el => { el.value = 2; el.dispatchEvent(new Event('input')); }"
            )
            shown = read()
            # the page's decode step, kernel by kernel, is the closed form's exactly (these
            # models' extra norms and caps are too small to show in 4 digits)
            flops, nbytes, _ = page.evaluate(f"decodeStep(DATA.models['{model}'], 4, 32768)")
            closed = step_cost(PRESETS[model], Workload("decode", 4, 32768))
            assert (flops, nbytes) == (pytest.approx(closed.flops, rel=1e-12),
                                       pytest.approx(closed.bytes, rel=1e-12))  # fmt: skip
            want = _calc(model, "h100-sxm", 4, 2**15, kv_heads, "bf16", capsys)
            for element, (key, scale) in OUTPUTS.items():
                assert _number(shown[element]) == pytest.approx(
                    _key(want, key) * scale, rel=6e-4
                ), (
                    model,
                    element,
                )
        # MoE on the page: DeepSeek-V3 at B=64 touches 222.4 of 256 experts a layer
        page.select_option("#model", "deepseek-v3")
        page.select_option("#latent", "512")  # its own latent width (the select keeps the last)
        page.eval_on_selector(
            "#batch", "el => { el.value = 6; el.dispatchEvent(new Event('input')); }"
        )
        want = _calc_json(["--model", "deepseek-v3", "--batch", "64"], capsys)
        shown = page.inner_text("#out-experts")
        assert shown.startswith(f"{want['moe']['experts_touched_per_layer']:.1f} of 256"), shown
        assert f"active {want['active_params'] / 1e9:.4g} of 671.0 G" in shown, shown
        page.select_option("#model", "llama-3-8b")
        assert page.inner_text("#out-experts") == "dense"
        # MoE (with MLA for DeepSeek): the step and the weights a B-token decode reads, exactly
        for model in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "deepseek-v3"):
            for batch in (1, 64):
                wl = Workload("decode", batch, 4096)
                closed = step_cost(PRESETS[model], wl)
                js = f"decodeStep(DATA.models['{model}'], {batch}, 4096)"
                assert page.evaluate(js)[:2] == [pytest.approx(closed.flops, rel=1e-12),
                                             pytest.approx(closed.bytes, rel=1e-12)]  # fmt: skip
                read = sum(k.weight_bytes for k in step_kernels(PRESETS[model], wl).values())
                js = f"decodeWeightsRead(DATA.models['{model}'], {batch})"
                assert page.evaluate(js) == pytest.approx(read, rel=1e-12), (model, batch)
                js = f"weightBytes(DATA.models['{model}'])"
                assert page.evaluate(js) == weight_bytes(PRESETS[model])
        # Llama 4: chunked layers inside and past their chunk, L2 q/k norms, temperature tuning,
        # the input-scaling router; MoE every 2nd layer at k = 2; the fused decode
        for changes in ({}, {"moe_layer_step": 2, "experts_per_token": 2},
                        {"attention_kernel": "flash"}):  # fmt: skip
            cfg = PRESETS["llama-4-scout"].replace(**changes)
            model = f"Object.assign({{}}, DATA.models['llama-4-scout'], {json.dumps(changes)})"
            for batch, context in ((1, 4096), (4, 32768)):
                closed = step_cost(cfg, Workload("decode", batch, context))
                js = f"decodeStep({model}, {batch}, {context})"
                assert page.evaluate(js)[:2] == [
                    pytest.approx(closed.flops, rel=1e-12),
                    pytest.approx(closed.bytes, rel=1e-12),
                ], changes
            assert page.evaluate(f"weightBytes({model})") == weight_bytes(cfg)
        page.screenshot(path=str(tmp_path / "explorer_last.png"), full_page=True)
        if os.environ.get("KVJAX_SCREENSHOT"):
            shutil.copy(tmp_path / "explorer_default.png", os.environ["KVJAX_SCREENSHOT"])
        browser.close()
    assert all(u.startswith("file://") for u in requests), requests
