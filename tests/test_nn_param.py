"""`kvjax.nn.layers.param`: weights drawn in power-of-two lengths are the per-shape draws."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kvjax.model.config import PRESETS
from kvjax.nn import layers


def per_shape(key, shape, fan_in, weight_dtype):
    """The draw as it was written before the buckets: one program per shape."""
    w = jax.random.normal(key, shape, jnp.float32) / math.sqrt(fan_in)
    if weight_dtype == "int8":
        w = jnp.clip(jnp.round(w * 127), -127, 127)
    return w.astype(layers.JNP_DTYPES[weight_dtype])


@pytest.mark.parametrize("weight_dtype", ["f32", "bf16", "int8", "fp8"])
def test_bucketed_weights_equal_the_per_shape_draw_bit_for_bit(weight_dtype):
    cfg = PRESETS["tiny-gqa"].replace(weight_dtype=weight_dtype)
    for shape, fan_in in [
        ((3,), 3),
        ((7, 5), 5),
        ((48, 64), 64),
        ((2, 3, 33), 33),
        ((1, 1), 1),
        ((300, 70), 70),
    ]:
        w = layers.param(nnx.Rngs(3), shape, fan_in, cfg)[...]
        want = per_shape(nnx.Rngs(3).params(), shape, fan_in, weight_dtype)
        assert w.shape == shape and w.dtype == want.dtype
        np.testing.assert_array_equal(
            np.asarray(w).view(np.uint8), np.asarray(want).view(np.uint8), err_msg=str(shape)
        )


def test_shapes_of_one_bucket_share_one_program_and_traces_stay_abstract():
    cfg = PRESETS["tiny-gqa"].replace(weight_dtype="bf16")
    layers.param(nnx.Rngs(0), (9, 7), 7, cfg)  # 63 -> 64
    compiled = layers._normal._cache_size()
    for shape in [(8, 8), (2, 31), (33,), (4, 4, 4)]:
        layers.param(nnx.Rngs(0), shape, 4, cfg)
    assert layers._normal._cache_size() == compiled
    abstract = jax.eval_shape(lambda: layers.param(nnx.Rngs(0), (5, 6), 6, cfg)[...])
    assert abstract.shape == (5, 6) and abstract.dtype == jnp.bfloat16


def test_an_abstract_model_has_the_shapes_and_a_jitted_constructor_draws_the_same_keys():
    from kvjax.nn import Transformer, abstract_model

    cfg = PRESETS["tiny-gqa"]
    abstract = nnx.state(abstract_model(cfg), nnx.Param)
    eager = nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    jitted = nnx.state(nnx.jit(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))(), nnx.Param)
    leaves = [jax.tree_util.tree_leaves(s) for s in (abstract, eager, jitted)]
    assert [(x.shape, x.dtype) for x in leaves[0]] == [(x.shape, x.dtype) for x in leaves[1]]
    for e, j in zip(leaves[1], leaves[2], strict=True):  # XLA fuses the scale into the draw
        np.testing.assert_allclose(np.asarray(e), np.asarray(j), rtol=1e-6, atol=1e-7)
    assert not layers._SHAPES_ONLY.get()


@pytest.mark.parametrize("weight_dtype", ["bf16", "int8"])
def test_weights_above_the_bucket_size_are_the_per_shape_draw(weight_dtype, monkeypatch):
    monkeypatch.setattr(layers, "BUCKETED_PARAM_SIZE", 8)  # (7, 5) drawn as its own shape
    cfg = PRESETS["tiny-gqa"].replace(weight_dtype=weight_dtype)
    w = layers.param(nnx.Rngs(3), (7, 5), 5, cfg)[...]
    want = per_shape(nnx.Rngs(3).params(), (7, 5), 5, weight_dtype)
    np.testing.assert_array_equal(np.asarray(w).view(np.uint8), np.asarray(want).view(np.uint8))
