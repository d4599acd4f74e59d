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
    "dynamic slice, distinct starts": (
        lambda c, i, j: jax.lax.dynamic_slice(c, (i, j), (4, 8)) * 2,
        (f32, jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32)),
    ),
    "dynamic update slice, distinct starts": (
        lambda c, u, i: jax.lax.dynamic_update_slice(c, u, (i, 0)),
        (f32, jax.ShapeDtypeStruct((8, 32), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32)),
    ),
    "scan over xs (loops once)": (
        lambda s, xs: jax.lax.scan(lambda c, x: (c * 2.0 + jnp.exp(x), c.sum()), s, xs),
        (jax.ShapeDtypeStruct((32,), jnp.float32), f32),
    ),
    "fori_loop (loops once)": (
        lambda x: jax.lax.fori_loop(0, 5, lambda i, c: c @ x[:32], x[:32]),
        (f32,),
    ),
    "tril + tuple": (lambda x: (jnp.tril(x), x.sum()), (f32,)),
    "slice": (lambda x: x[:, :16] * x[:, 16:], (f32,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rules_match_xla(name):
    fn, args = CASES[name]
    lowered = jax.jit(fn).lower(*args)
    xla = lowered.cost_analysis()
    # XLA counts a loop once through (`trips=False`); kvjax's default counts its trips
    _, total = attribute(lowered.as_text(dialect="hlo", debug_info=True), (), trips=False)
    assert total.flops == pytest.approx(xla.get("flops", 0.0), abs=1e-9)
    assert total.transcendentals == pytest.approx(xla.get("transcendentals", 0.0), abs=1e-9)
    assert total.bytes == pytest.approx(xla.get("bytes accessed", 0.0), abs=1e-9)


@pytest.mark.parametrize("start,stop", [(0, 7), (3, 10), (2, 3)])
def test_loops_cost_their_trip_count(start, stop):
    """A fori_loop / scan of n trips: kvjax counts n x (condition + body), XLA once."""

    def fn(x):
        with jax.named_scope("loop"):
            return jax.lax.fori_loop(start, stop, lambda i, c: jnp.exp(c) * 2.0, x)

    lowered = jax.jit(fn).lower(f32)
    text = lowered.as_text(dialect="hlo", debug_info=True)
    per_kernel, total = attribute(text, ("loop",))
    _, once = attribute(text, ("loop",), trips=False)
    n = stop - start
    body = 64 * 32  # the multiply, and an exp (a transcendental) per element each trip
    assert total.transcendentals == n * body == n * once.transcendentals
    assert total.flops == n * once.flops and once.flops == body + 2  # + the counter, compare
    assert per_kernel[(None, "loop")].flops == total.flops


def test_uncounted_loop_raises():
    """A while whose trip count depends on data is not costed as if it ran once."""
    lowered = jax.jit(lambda x: jax.lax.while_loop(lambda c: c.sum() < 9.0, jnp.exp, x)).lower(f32)
    with pytest.raises(ValueError, match="not a counted loop"):
        attribute(lowered.as_text(dialect="hlo", debug_info=True), ())


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
