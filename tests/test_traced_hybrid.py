"""The traced view of the hybrids (issue 31): every kernel of a tiny Qwen3-Next (Gated DeltaNet,
its chunked prefill a scan over 64-token chunks whose trip count the HLO cost model reads),
Falcon-H1 (Mamba-2 beside attention) and LFM2 (short convolutions) step has the closed form's
FLOPs and transcendentals in XLA's lowered module, prefill and decode; one layer per kind traced
equals every layer."""

import pytest
from test_traced_step import check_against_closed_form

from kvjax import get_model_config, kernels
from kvjax.traced.step import trace_step

TINY = ("tiny-qwen3-next", "tiny-falcon-h1", "tiny-lfm2")
STATE_KERNELS = {
    "tiny-qwen3-next": kernels.LINEAR_SCAN,
    "tiny-falcon-h1": kernels.SSM_SCAN,
    "tiny-lfm2": kernels.CONV_CONV,
}


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("phase,batch,context", [("prefill", 2, 9), ("prefill", 1, 70),
                                                 ("decode", 2, 9), ("decode", 1, 33)])  # fmt: skip
def test_hybrid_traces_match_closed_form(name, phase, batch, context):
    trace = trace_step(get_model_config(name), phase, batch, context)
    rows = check_against_closed_form(trace)
    assert STATE_KERNELS[name] in {r.name for r in rows}


@pytest.mark.parametrize("name", TINY)
def test_one_layer_per_kind_equals_all(name):
    cfg = get_model_config(name).replace(num_layers=4)
    full = trace_step(cfg, "decode", 2, 9)
    one = trace_step(cfg, "decode", 2, 9, layers="one")
    assert one.layers_traced < 4
    assert one.total.flops == pytest.approx(full.total.flops, rel=1e-9)
