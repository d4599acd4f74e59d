"""The executable an accelerator would run, compiled on this host (deviceless AOT): per-kernel
FLOPs and bytes of XLA:GPU and XLA:TPU modules, counted by kvjax and checked by hand."""

import json

import pytest

from kvjax import get_model_config, kernels
from kvjax.errors import KvjaxError
from kvjax.hardware import CHIPS
from kvjax.nn.transformer import param_kernel
from kvjax.traced.target_costs import module_kernel_costs
from kvjax.traced.targets import GPU_TARGETS, TARGETS, parse_target

NAMES = tuple(kernels.REGISTRY)

# A GPU module written by hand, every instruction known (4-byte elements): a cuBLASLt GEMM
# custom-call (q_proj, its workspace beside its result), a Triton GEMM with split-K 2 whose
# metadata XLA dropped (o_proj: named by the weight it reads), the reduction of its partials,
# and a loop fusion spanning two scopes of two layers.
GPU_MODULE = """HloModule jit_step, entry_computation_layout={(f32[4,8]{1,0}, f32[8,16]{1,0}, f32[16,8]{1,0})->f32[4,8]{1,0}}

%gemm_comp (p0: f32[4,2,8], p1: f32[2,8,4]) -> f32[2,4,4] {
  %p0 = f32[4,2,8]{2,1,0} parameter(0)
  %p1 = f32[2,8,4]{2,1,0} parameter(1)
  ROOT %dot.9 = f32[2,4,4]{2,1,0} dot(%p0, %p1), lhs_batch_dims={1}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}

%add_f32 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.0 = f32[] add(%a, %b)
}

%fused_reduce (r0: f32[2,4,4]) -> f32[4,4] {
  %r0 = f32[2,4,4]{2,1,0} parameter(0)
  %zero = f32[] constant(0)
  ROOT %reduce.1 = f32[4,4]{1,0} reduce(%r0, %zero), dimensions={0}, to_apply=%add_f32, metadata={op_name="jit(step)/layer0/attn/o_proj/dot_general"}
}

%res_norm (q0: f32[4,4], q1: f32[4,4]) -> f32[4,4] {
  %q0 = f32[4,4]{1,0} parameter(0)
  %q1 = f32[4,4]{1,0} parameter(1)
  %add.2 = f32[4,4]{1,0} add(%q0, %q1), metadata={op_name="jit(step)/layer0/residual/mlp/add"}
  ROOT %multiply.2 = f32[4,4]{1,0} multiply(%add.2, %add.2), metadata={op_name="jit(step)/layer1/norm/attn/mul"}
}

ENTRY %main (x: f32[4,8], w: f32[8,16], o: f32[16,4], y: f32[4,4]) -> f32[4,4] {
  %x = f32[4,8]{1,0} parameter(0), metadata={op_name="x"}
  %w = f32[8,16]{1,0} parameter(1), metadata={op_name="state['layers'][0]['attn']['q_proj'].value"}
  %y = f32[4,4]{1,0} parameter(3), metadata={op_name="y"}
  %o = f32[16,4]{1,0} parameter(2), metadata={op_name="state['layers'][0]['attn']['o_proj'].value"}
  %cublas-gemm.1 = (f32[4,16]{1,0}, s8[1024]{0}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}, metadata={op_name="jit(step)/layer0/attn/q_proj/dot_general"}
  %gte.1 = f32[4,16]{1,0} get-tuple-element(%cublas-gemm.1), index=0
  %bitcast.1 = f32[4,2,8]{2,1,0} bitcast(%gte.1)
  %bitcast.2 = f32[2,8,4]{2,1,0} bitcast(%o)
  %gemm_fusion_dot.1 = f32[2,4,4]{2,1,0} fusion(%bitcast.1, %bitcast.2), kind=kCustom, calls=%gemm_comp, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %loop_reduce_fusion = f32[4,4]{1,0} fusion(%gemm_fusion_dot.1), kind=kLoop, calls=%fused_reduce, metadata={op_name="jit(step)/layer0/attn/o_proj/dot_general"}
  ROOT %fusion.2 = f32[4,4]{1,0} fusion(%loop_reduce_fusion, %y), kind=kLoop, calls=%res_norm, metadata={op_name="jit(step)/layer1/norm/attn/mul"}
}
"""

# The same step before optimization: the products XLA's module computes, whole.
LOWERED = """HloModule jit_step

ENTRY main (x: f32[4,8], w: f32[8,16], o: f32[16,8]) -> f32[4,8] {
  x = f32[4,8]{1,0} parameter(0)
  w = f32[8,16]{1,0} parameter(1)
  o = f32[16,4]{1,0} parameter(2)
  dot.1 = f32[4,16]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/layer0/attn/q_proj/dot_general"}
  ROOT dot.2 = f32[4,4]{1,0} dot(dot.1, o), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/layer0/attn/o_proj/dot_general"}
}
"""


def test_hand_built_gpu_module_counts():
    costs = module_kernel_costs(GPU_MODULE, NAMES, param_kernel, LOWERED)
    rows = costs.by_kernel()
    q, o = rows[kernels.Q_PROJ], rows[kernels.O_PROJ]
    # cuBLAS: 2 x 4 x 16 x 8 FLOPs; x, w and the result (its s8 workspace is scratch)
    assert (q.flops, q.bytes) == (2 * 4 * 16 * 8, 4 * (32 + 128 + 64))
    # split-K 2: the same 2MNK; the partials f32[2,4,8] written, then read by the reduction,
    # whose adds (64 - 32) and output are o_proj's too
    assert o.flops == 2 * 4 * 4 * 16 + (32 - 16)
    assert o.bytes == 4 * (64 + 64 + 32) + 4 * (32 + 16)
    assert o.split_k_bytes == 2 * 4 * 32
    assert o.bytes - o.split_k_bytes == 4 * (64 + 64 + 16)  # the product's own in + w + out
    thunks = {t.name: t for t in costs.thunks}
    assert thunks["gemm_fusion_dot.1"].temporary == "split-K x2"
    assert thunks["gemm_fusion_dot.1"].kind == "kCustom __triton_nested_gemm_fusion"
    assert thunks["cublas-gemm.1"].kind == "__cublas$lt$matmul"
    # the fusion spanning two scopes: the add and its two reads are the residual's, the
    # multiply and the write the norm's
    res, norm = rows[kernels.RESIDUAL_MLP], rows[kernels.NORM_ATTN]
    assert (res.flops, res.bytes) == (16, 4 * 32)
    assert (norm.flops, norm.bytes) == (16, 4 * 16)
    assert thunks["fusion.2"].kernels == (kernels.RESIDUAL_MLP, kernels.NORM_ATTN)
    assert costs.total.flops == sum(r.flops for r in rows.values())
    assert costs.total.bytes == sum(r.bytes for r in rows.values())


def test_targets_parse_and_name_their_chip():
    assert parse_target("h100").name == "h100"
    assert parse_target("tpu-v5e").shape == (1, 1)
    assert parse_target("TPU-v5e:2x2").num_devices == 4
    assert parse_target("tpu-v5p:2x2x1").shape == (2, 2, 1)
    for bad, words in (("h300", "known: a100, b200, h100"), ("tpu-v5e:2x", "positive integers"),
                       ("h100:2x2", "one device"), ("tpu-v4:2x2", "3 positive")):  # fmt: skip
        with pytest.raises(KvjaxError, match=words):
            parse_target(bad)
    for spec in TARGETS.values():  # every target is a chip preset too (its roofline)
        assert spec.chip in CHIPS, spec.name
    text = GPU_TARGETS["h100"].target_config()
    assert "core_count: 132" in text and "major: 9 minor: 0" in text


def _trace(preset, phase, batch, context, target, **over):
    from kvjax.traced.target_step import trace_dict, trace_target_step

    cfg = get_model_config(preset).replace(**over)
    return trace_dict(trace_target_step(cfg, phase, batch, context, target), with_thunks=True)


@pytest.mark.slow
@pytest.mark.parametrize("target,device", [("h100", "NVIDIA H100 80GB HBM3"),
                                           ("tpu-v5e", "TPU v5 lite")])  # fmt: skip
def test_llama_decode_on_accelerators_matches_the_closed_form(target, device):
    """llama-3-8b's shapes (2 of its 32 layers), decode B=1 at S=8192: every kernel of the
    closed form has its row; each product's FLOPs within 1%; its bytes within 5% once the
    temporaries XLA added (split-K partials, padding copies) are set apart, or the row names
    the kernels it is fused with; the projections and the MLP within 5% on every target."""
    report = _trace("llama-3-8b", "decode", 1, 8192, target, num_layers=2)
    assert report["device"] == device
    rows = {r["name"]: r for r in report["kernels"]}
    from kvjax import analytic
    from kvjax.analytic import Workload

    cfg = get_model_config("llama-3-8b").replace(num_layers=2)
    assert set(analytic.step_kernels(cfg, Workload("decode", 1, 8192))) <= set(rows)
    for r in rows.values():
        if r["kind"] == kernels.MATMUL:
            assert r["flops_ratio"] == pytest.approx(1.0, rel=0.01), r
            within = r["bytes_ratio_without_temporaries"] == pytest.approx(1.0, rel=0.05)
            assert within or r["bytes_note"].startswith("fused with"), r
    for name in (kernels.Q_PROJ, kernels.K_PROJ, kernels.V_PROJ, kernels.O_PROJ,
                 kernels.GATE_UP, kernels.DOWN, kernels.LM_HEAD):  # fmt: skip
        assert rows[name]["bytes_ratio_without_temporaries"] == pytest.approx(1.0, rel=0.05)
    assert report["memory"]["fits"] and report["memory"]["step_bytes"] > 3e9
    executed = {t["kind"] for t in report["executed"]}
    if target.startswith("h"):
        assert "kCustom __triton_nested_gemm_fusion" in executed
        assert any(r["split_k_bytes"] for r in rows.values())
    else:
        assert "kOutput fusion" in executed and "copy-start" in executed
        # XLA:TPU's own cost analysis works: kvjax's count of the same module agrees
        xla = report["xla_cost_analysis"]["flops"]
        assert report["total"]["compiled_flops"] == pytest.approx(xla, rel=1e-3)
        # the B=1 products are multiply + widen + reduce: the converts named apart
        assert rows[kernels.GATE_UP]["convert_flops"] > 0


@pytest.mark.slow
def test_tpu_refuses_a_step_larger_than_its_memory():
    with pytest.raises(KvjaxError, match="does not fit one TPU v5 lite.*RESOURCE_EXHAUSTED"):
        _trace("tiny-gqa", "decode", 4096, 1_048_576, "tpu-v5e")


@pytest.mark.slow
def test_gpu_reports_a_step_larger_than_its_memory():
    report = _trace("tiny-gqa", "decode", 4096, 1_048_576, "a100")
    mem = report["memory"]
    assert not mem["fits"] and mem["step_bytes"] > mem["device_memory_bytes"] == 85100068864


@pytest.mark.slow
def test_cli_trace_target_json(capsys):
    from kvjax.cli import main

    assert main(["trace", "--model", "tiny-gqa", "--target", "h100", "--phase", "prefill",
                 "--context", "64", "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == "cuda" and report["device"] == "NVIDIA H100 80GB HBM3"
    assert report["stage"] == "compiled"
    assert {r["name"] for r in report["target"]["kernels"]} >= {kernels.Q_PROJ, kernels.LM_HEAD}
    assert main(["trace", "--model", "tiny-gqa", "--target", "h300"]) == 2
    assert "unknown target 'h300'" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_profile_attribution_meets_an_xla_gpu_module():
    """The path gpu_check's profile takes (`kvjax.traced.compiled.compiled_ops` on the served
    step's compiled module), here on the XLA:GPU module of that step: every executed
    instruction that computes is attributed to a kernel, none left unnamed."""
    import jax

    from kvjax.measured.step import served_step
    from kvjax.traced.compiled import UNNAMED, compiled_ops
    from kvjax.traced.target_compile import compile_for_target
    from kvjax.traced.target_rules import TargetCostModel

    cfg = get_model_config("tiny-gqa").replace(weight_dtype="bf16")
    from kvjax.analytic import Workload

    served = served_step(cfg, Workload("decode", 2, 64))
    found = set()
    for fn, args in served.jits.values():
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
        lowered = fn.lower(*args).as_text(dialect="hlo", debug_info=True)
        compiled = compile_for_target(fn, abstract, parse_target("h100"))
        ops = compiled_ops(compiled.text, NAMES, param_kernel, lowered, TargetCostModel)
        assert ops and all(op.kernels != (UNNAMED,) for op in ops if op.cost.flops), ops
        found |= {k for op in ops for k in op.kernels}
    assert {kernels.Q_PROJ, kernels.SCORES, kernels.AV, kernels.LM_HEAD} <= found


@pytest.mark.slow
def test_tpu_slice_partitioned_step_and_collectives(capsys):
    """`--target tpu-v5e:2x2 --tp 4`: one device's partitioned module on the slice; its FLOPs
    and HBM bytes within 1% / 5% of the closed form per device, its all-reduces counted."""
    from kvjax.cli import main

    small = ["--model", "llama-3-8b", "--layers", "2", "--d-model", "512", "--heads", "8",
             "--kv-heads", "4", "--head-dim", "64", "--d-ff", "1024", "--vocab", "1024"]  # fmt: skip
    assert main(["trace", *small, "--target", "tpu-v5e:2x2", "--tp", "4", "--context", "512",
                 "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == "TPU v5 lite" and report["backend"] == "tpu"
    assert report["flops_ratio"] == pytest.approx(1.0, rel=0.01)
    assert report["bytes_ratio"] == pytest.approx(1.0, rel=0.05)
    assert report["collectives"]["all-reduce"]["count"] >= 2 * 2  # o_proj and down, per layer
    assert report["chip"]["name"] == "tpu-v5e"
    assert main(["trace", "--model", "tiny-gqa", "--target", "tpu-v5e:2x2", "--tp", "2"]) == 2
    assert "must be equal" in capsys.readouterr().err


@pytest.mark.slow
def test_roofline_compiled_for_a_target_runs_and_draws(tmp_path):
    """configs/roofline_compiled.yaml's experiment on a tiny model: each kernel in three views,
    the compiled products' FLOPs equal the closed form's per layer, and the figure is drawn
    from those records alone (the plain roofline figure skips them)."""
    from kvjax.plotting import make_figures
    from kvjax.runs.launcher import run_config

    config = tmp_path / "c.yaml"
    config.write_text(
        "experiment: roofline\nmodel:\n  preset: tiny-gqa\n  weight_dtype: bf16\n"
        "  kv_dtype: bf16\nworkload:\n  batch: 2\n  context: 64\nchip:\n  preset: h100-sxm\n"
        "options:\n  compiled_for: h100\n"
    )
    (run,) = run_config(config, runs_root=tmp_path / "runs", progress=False)
    import pandas as pd

    records = pd.DataFrame(run.records()).assign(experiment="roofline")
    assert set(records.target) == {"h100"} and set(records.batch) == {2}
    compiled = records[records.source == "compiled for h100"].set_index(["phase", "kernel"])
    closed = records[records.source == "closed form"].set_index(["phase", "kernel"])
    assert set(compiled.device) == {"NVIDIA H100 80GB HBM3"}
    for key in [(p, k) for p in ("decode", "prefill") for k in (kernels.Q_PROJ, kernels.DOWN)]:
        assert compiled.flops[key] == pytest.approx(closed.flops[key], rel=0.01), key
    written = {p.name for p in make_figures(records, tmp_path / "figs")}
    assert "roofline_compiled.png" in written and "roofline.png" not in written


@pytest.mark.slow
def test_tpu_prefill_flops_equal_xla_tpu_own_count():
    """A TPU prefill's row max becomes a reduce-window spanning the padded row: counted as one
    step an element (XLA's generic rule would count window - 1 an output, 1.27x the step's
    FLOPs at S = 2048); the module's total then equals XLA:TPU's own cost analysis."""
    report = _trace("llama-3-8b", "prefill", 1, 1024, "tpu-v5e", num_layers=1)
    assert report["total"]["compiled_flops"] == pytest.approx(
        report["xla_cost_analysis"]["flops"], rel=1e-3
    )
    executed = {t["kind"] for t in report["executed"]}
    assert "kOutput fusion" in executed


@pytest.mark.slow
def test_flash_decode_on_h100_is_one_row_with_the_closed_form_cost():
    """kvjax's Pallas flash-decoding kernel compiled for an H100 here: a Triton custom call XLA
    cannot count, attributed to `attention` with the cost its name carries (the closed form's),
    the cache read in place (no layout copy); the combine of the splits its own row."""
    report = _trace("llama-3-8b", "decode", 1, 2049, "h100", num_layers=1,
                    attention_kernel="flash")  # fmt: skip
    rows = {r["name"]: r for r in report["kernels"]}
    att = rows[kernels.ATTENTION]
    assert att["executed_as"] == {"__gpu$xla.gpu.triton": 1}
    # closed form: S = 2049 positions (the new one included); the kernel: the 2048 cached
    assert att["flops_ratio"] == pytest.approx(2048 / 2049, rel=1e-4)
    assert att["bytes_ratio"] == pytest.approx(1.0, rel=1e-3)
    assert not att["temporaries"] and att["copy_bytes"] == 0
    assert rows[kernels.ATTN_COMBINE]["bytes_ratio"] == pytest.approx(1.0, rel=0.05)


@pytest.mark.slow
def test_flash_prefill_on_h100_is_one_row_with_the_closed_form_cost():
    """The prefill compiled for an H100 here runs kvjax's Pallas FlashAttention-2 kernel (cuDNN's
    lowers only with a CUDA driver): one Triton call, its FLOPs the 128 x 128 tiles' block-causal
    pairs (36 of the 64 tiles at S = 1024: 4 * N * H * 36 * 128^2, 1.124x the exact causal
    count), its bytes Q + O once and K/V once per query block; no score tensor in the module."""
    report = _trace("llama-3-8b", "prefill", 1, 1024, "h100", num_layers=1,
                    attention_kernel="flash")  # fmt: skip
    rows = {r["name"]: r for r in report["kernels"]}
    att = rows[kernels.ATTENTION]
    assert att["executed_as"] == {"__gpu$xla.gpu.triton": 1}
    N, H = 32, 128
    assert att["compiled_flops"] == 4 * N * H * 36 * 128**2
    assert att["compiled_flops"] / (4 * N * H * 1024 * 1025 / 2) == pytest.approx(1.124, abs=1e-3)
    q_o = 2 * 1024 * N * H * 2
    assert att["compiled_bytes"] == q_o + N * 36 * 128 * 2 * H * 2
    assert att["flops_ratio"] == 1.0 and att["bytes_ratio"] == 1.0
    assert not any(r["compiled_bytes"] for n, r in rows.items() if n in kernels.ATTENTION_PARTS)
    with pytest.raises(KvjaxError, match="power-of-two head width; this attention's is 192"):
        _trace("deepseek-v2-lite", "prefill", 1, 256, "h100", num_layers=2,
               attention_kernel="flash")  # fmt: skip


@pytest.mark.slow
def test_flash_mla_decode_on_h100_reads_the_latent_cache_in_place():
    """MLA's fused absorbed decode compiled for an H100: one Triton call per layer with the
    closed form's FLOPs and bytes (the latent cache read once for all heads), and no copy of the
    cache around attention (the write is ordered after the kernels' reads; XLA:GPU copied the
    latent cache, 10.5 MB a step here, before the order was made explicit)."""
    report = _trace("deepseek-v2-lite", "decode", 1, 2049, "h100", num_layers=2,
                    attention_kernel="flash")  # fmt: skip
    rows = {r["name"]: r for r in report["kernels"]}
    att = rows[kernels.ATTENTION]
    assert att["executed_as"] == {"__gpu$xla.gpu.triton": 2}
    assert att["flops_ratio"] == pytest.approx(2048 / 2049, rel=1e-3)
    assert att["bytes_ratio"] == pytest.approx(1.0, rel=1e-3)
    near = [
        r for n, r in rows.items() if n.startswith(("attn", "kv_cache")) or n == kernels.ATTENTION
    ]
    assert sum(r["copy_bytes"] for r in near) < 1024  # the positions, not the cache
