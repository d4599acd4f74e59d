"""Traced (XLA, lowered) costs of the real model per kernel against the closed forms."""

import pytest

from kvjax import KvjaxError, analytic, get_model_config, kernels
from kvjax.traced.step import compare, trace_step

MATMULS = {
    kernels.Q_PROJ,
    kernels.K_PROJ,
    kernels.V_PROJ,
    kernels.SCORES,
    kernels.AV,
    kernels.O_PROJ,
    kernels.GATE_UP,
    kernels.UP,
    kernels.DOWN,
    kernels.LM_HEAD,
    kernels.Q_A_PROJ,
    kernels.Q_B_PROJ,
    kernels.KV_A_PROJ,
    kernels.KV_B_PROJ,
    kernels.Q_ABSORB,
    kernels.V_UP,
    kernels.MOE_ROUTER,
    kernels.MOE_SHARED_GATE,  # its bytes counted as lowered: exact
    kernels.LINEAR_IN_PROJ,  # the hybrids' state layers (issue 31)
    kernels.LINEAR_OUT_PROJ,
    kernels.SSM_IN_PROJ,
    kernels.SSM_OUT_PROJ,
    kernels.CONV_IN_PROJ,
    kernels.CONV_OUT_PROJ,
}
STRICT_BYTES = MATMULS | {kernels.RESIDUAL_ATTN, kernels.RESIDUAL_MLP}


def check_against_closed_form(trace, step_rel=0.02):
    rows = compare(trace)
    for r in rows:
        if r.name == kernels.OTHER:
            assert r.explanation and r.traced_flops <= 1e-3 * trace.total.flops + 64
            continue
        # Every kernel's FLOPs and transcendentals: the closed form mirrors the model exactly.
        assert r.traced_flops == pytest.approx(r.closed_flops, rel=0.01), r.name
        assert r.traced_transcendentals == pytest.approx(r.closed_transcendentals, rel=0.01), r.name
        if r.name in STRICT_BYTES:
            assert r.traced_bytes == pytest.approx(r.closed_bytes, rel=0.05), r.name
        else:  # unfused elementwise / gather / scatter: a named explanation, more bytes traced
            assert r.explanation, r.name
            assert r.traced_bytes >= r.closed_bytes, r.name
    closed = analytic.step_cost(trace.cfg, trace.workload)
    assert trace.total.flops == pytest.approx(closed.flops, rel=step_rel)
    return rows


@pytest.mark.parametrize(
    "name", ["tiny-mha", "tiny-gqa", "tiny-mqa", "tiny-mla", "tiny-mla-q", "tiny-mla-naive"]
)
@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "bf16+fp8"])
@pytest.mark.parametrize("batch,context", [(1, 7), (3, 12)])
def test_tiny_traces_match_closed_form(name, phase, dtype, batch, context):
    weights, kv = dtype.split("+") if "+" in dtype else (dtype, dtype)
    naive = name.endswith("-naive")
    cfg = get_model_config(name.removesuffix("-naive"), weight_dtype=weights, kv_dtype=kv)
    if naive:
        cfg = cfg.replace(mla_decode="naive")
    trace = trace_step(cfg, phase, batch, context)
    assert trace.stage == "lowered" and trace.backend == "cpu"
    # the per-kernel records sum to XLA's whole-module figure
    assert trace.total.flops == pytest.approx(trace.xla["flops"], rel=1e-6)
    assert trace.total.bytes == pytest.approx(trace.xla["bytes accessed"], rel=1e-6)
    assert trace.total.transcendentals == pytest.approx(trace.xla["transcendentals"], rel=1e-6)
    assert {k.layer for k in trace.kernels} == {None, 0, 1}
    check_against_closed_form(trace)


@pytest.mark.parametrize(
    "name,changes",
    [
        ("gemma-7b", {}),  # GeGLU, tied embeddings, head_dim 256
        ("qwen2.5-7b", {}),  # q/k/v biases
        ("llama-3-8b", {"num_kv_heads": 1}),
        ("llama-3-8b", {"gated_mlp": False}),
    ],
)
@pytest.mark.parametrize("phase,batch,context", [("decode", 4, 4096), ("prefill", 1, 512)])
def test_medium_presets_one_layer_traced(name, changes, phase, batch, context):
    cfg = get_model_config(name, **changes)
    trace = trace_step(cfg, phase, batch, context, layers="one")
    assert trace.layers_traced == 1
    check_against_closed_form(trace)


def test_one_layer_times_L_equals_full_unrolled_trace():
    cfg = get_model_config("tiny-gqa", num_layers=3, weight_dtype="bf16", kv_dtype="bf16")
    for phase in ("prefill", "decode"):
        full = trace_step(cfg, phase, 2, 9).by_kernel()
        one = trace_step(cfg, phase, 2, 9, layers="one").by_kernel()
        assert full.keys() == one.keys()
        for name in full:
            assert one[name].flops == full[name].flops, name
            assert one[name].transcendentals == full[name].transcendentals, name
            if name == kernels.OTHER:
                # Unnamed glue differs: the output tuple (8 bytes per array, 2 cache arrays a
                # layer) and constant broadcasts that jax hoists out of the layers unnamed.
                total = sum(c.bytes for c in full.values())
                assert abs(full[name].bytes - one[name].bytes) < 0.01 * total
            elif name in STRICT_BYTES:
                assert one[name].bytes == full[name].bytes, name
            else:  # a constant broadcast jax hoists (unnamed) once there are several layers
                assert one[name].bytes == pytest.approx(full[name].bytes, rel=0.05), name


def test_seed_claims_on_the_real_70b_graph():
    # decode FLOPs ~ 2N per token: 2 (N - V*D) for the matmuls over the weights (the embedding
    # is a gather) plus attention over the cache.
    cfg = get_model_config("seed-70b")
    n = analytic.num_params(cfg)
    short = trace_step(cfg, "decode", 1, 2, layers="one")
    ratio = short.total.flops / n
    assert 1.96 < ratio < 2.0
    for batch in (1, 8, 64):  # decode intensity ~ B while the KV cache is small (S = 2)
        t = trace_step(cfg, "decode", batch, 2, layers="one")
        # unfused activations (lowered stage) grow with B: 57.6 at B = 64
        assert t.total.flops / t.total.bytes == pytest.approx(
            batch, rel=0.1 if batch < 64 else 0.15
        )
    for k in (1, 8, 64):  # attention intensity ~ h/h_kv, from the traced matmul kernels
        t = trace_step(cfg.replace(num_kv_heads=k), "decode", 1, 8192, layers="one")
        by = t.by_kernel()
        closed = analytic.step_kernels(t.cfg, t.workload)
        kv_bytes = closed[kernels.SCORES].kv_bytes + closed[kernels.AV].kv_bytes
        traced = (by[kernels.SCORES].flops + by[kernels.AV].flops) / kv_bytes
        assert traced == pytest.approx(64 / k, rel=0.01)


def test_compiled_stage_is_reported_apart():
    cfg = get_model_config("tiny-gqa")
    trace = trace_step(cfg, "decode", 2, 16, stage="compiled")
    assert trace.stage == "compiled" and trace.kernels == []
    assert trace.total.flops > 0 and trace.notes
    with pytest.raises(KvjaxError, match="per-kernel comparison needs stage='lowered'"):
        compare(trace)


def test_roofline_third_opinion_agrees_on_flops():
    cfg = get_model_config("tiny-gqa")
    trace = trace_step(cfg, "decode", 2, 16, roofline=True)
    # jax 0.10's experimental roofline runs on this model; an error here is a regression
    assert trace.roofline is not None and "error" not in trace.roofline, trace.roofline
    # it counts matmul FLOPs from the jaxpr; elementwise rules differ from XLA's
    matmul = sum(c.flops for n, c in trace.by_kernel().items() if n in MATMULS)
    assert matmul <= trace.roofline["flops"] <= 1.1 * trace.total.flops


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(phase="decode", batch=1, context=1), "needs context >= 2"),
        (dict(phase="decode", batch=1, context=8, stage="optimized"), "stage='optimized'"),
        (dict(phase="decode", batch=1, context=8, layers="two"), "layers='two'"),
        (dict(phase="train", batch=1, context=8), "phase='train'"),
    ],
)
def test_bad_trace_requests(kwargs, message):
    with pytest.raises(KvjaxError, match=message):
        trace_step(get_model_config("tiny-gqa"), **kwargs)


def test_fused_step_moves_what_the_closed_form_says():
    # The explanation of the elementwise kernels (unfused in the lowered module) checked: once
    # XLA fuses them (compiled, f32 on CPU), a decode step moves the closed form's bytes.
    cfg = get_model_config("llama-3-8b", num_layers=2, weight_dtype="f32", kv_dtype="f32")
    compiled = trace_step(cfg, "decode", 1, 1024, stage="compiled")
    closed = analytic.step_cost(cfg, compiled.workload)
    assert compiled.total.bytes == pytest.approx(closed.bytes, rel=0.05)
    assert compiled.total.flops == pytest.approx(closed.flops, rel=0.01)
