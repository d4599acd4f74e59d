"""kvjax's per-instruction HLO cost rules against XLA's own cost analysis, op by op."""

import jax
import jax.numpy as jnp
import pytest

from kvjax import kernels
from kvjax.traced.hlo import attribute, kernel_of

bf = jax.ShapeDtypeStruct((64, 32), jnp.bfloat16)
f32 = jax.ShapeDtypeStruct((64, 32), jnp.float32)
x5 = jax.ShapeDtypeStruct((2, 16, 3, 4, 8), jnp.float32)
ids = jax.ShapeDtypeStruct((2, 16), jnp.int32)

CASES = {
    "convert": (lambda x: x.astype(jnp.float32), (bf,)),
    "multiply": (lambda x: x * x, (bf,)),
    "dot f32 out": (
        lambda x: jnp.einsum("ij,kj->ik", x, x, preferred_element_type=jnp.float32),
        (bf,),
    ),
    "batched dot": (
        lambda p, v: jnp.einsum("BKGTS,BSKH->BKGTH", p, v),
        (
            jax.ShapeDtypeStruct((2, 3, 4, 16, 16), jnp.float32),
            jax.ShapeDtypeStruct((2, 16, 3, 8), jnp.float32),
        ),
    ),
    "exp": (jnp.exp, (bf,)),
    "reduce sum": (lambda x: jnp.sum(x, axis=-1), (bf,)),
    "softmax": (lambda x: jax.nn.softmax(x, axis=-1), (f32,)),
    "silu (call)": (jax.nn.silu, (bf,)),
    "gelu": (lambda x: jax.nn.gelu(x, approximate=True), (f32,)),
    "gather": (lambda t, i: jnp.take(t, i, axis=0), (f32, ids)),
    "where": (lambda x: jnp.where(x > 0, x, -1e30), (bf,)),
    "power": (lambda x: 10000.0**x, (f32,)),
    "transpose": (lambda x: jnp.transpose(x, (0, 2, 3, 1, 4)) * 2, (x5,)),
    "dynamic update slice": (
        lambda c, u: jax.lax.dynamic_update_slice(c, u, (0, 0)),
        (bf, jax.ShapeDtypeStruct((8, 32), jnp.bfloat16)),
    ),
    "scatter": (
        lambda c, u, p: c.at[jnp.arange(2), p].set(u),
        (
            jax.ShapeDtypeStruct((2, 32), jnp.float32),
            jax.ShapeDtypeStruct((2,), jnp.float32),
            jax.ShapeDtypeStruct((2,), jnp.int32),
        ),
    ),
    "tril + tuple": (lambda x: (jnp.tril(x), x.sum()), (f32,)),
    "slice": (lambda x: x[:, :16] * x[:, 16:], (f32,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rules_match_xla(name):
    fn, args = CASES[name]
    lowered = jax.jit(fn).lower(*args)
    xla = lowered.cost_analysis()
    _, total = attribute(lowered.as_text(dialect="hlo", debug_info=True), ())
    assert total.flops == pytest.approx(xla.get("flops", 0.0), abs=1e-9)
    assert total.transcendentals == pytest.approx(xla.get("transcendentals", 0.0), abs=1e-9)
    assert total.bytes == pytest.approx(xla.get("bytes accessed", 0.0), abs=1e-9)


def test_attribution_by_named_scope():
    def f(x):
        with jax.named_scope("layer3"):
            with jax.named_scope(kernels.Q_PROJ):
                y = x @ x.T
            with jax.named_scope(kernels.SOFTMAX):
                y = jax.nn.softmax(y)
        with jax.named_scope(kernels.LM_HEAD):
            return y @ x

    lowered = jax.jit(f).lower(f32)
    per, total = attribute(
        lowered.as_text(dialect="hlo", debug_info=True),
        (kernels.Q_PROJ, kernels.SOFTMAX, kernels.LM_HEAD),
    )
    assert per[(3, kernels.Q_PROJ)].flops == 2 * 64 * 64 * 32
    assert per[(None, kernels.LM_HEAD)].flops == 2 * 64 * 64 * 32
    assert per[(3, kernels.SOFTMAX)].transcendentals == 64 * 64
    assert total.flops == pytest.approx(lowered.cost_analysis()["flops"])


def test_kernel_of_paths():
    names = (kernels.Q_PROJ, kernels.NORM_ATTN, kernels.LM_HEAD)
    assert kernel_of("jit(step)/layer12/attn/q_proj/MI,OI->MO/dot_general", names) == (
        12,
        kernels.Q_PROJ,
    )
    assert kernel_of("jit(step)/lm_head/dot_general", names) == (None, kernels.LM_HEAD)
    assert kernel_of("jit(step)/layer0/squeeze", names) == (0, kernels.OTHER)
    assert kernel_of("", names) == (None, kernels.OTHER)
