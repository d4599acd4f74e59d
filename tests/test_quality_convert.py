"""MHA -> GQA/MQA conversion by pooling K/V heads."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kvjax import KvjaxError, get_model_config
from kvjax.nn import Transformer
from kvjax.quality.convert import convert_kv_heads


def mha(seed=0, **changes):
    return Transformer(get_model_config("tiny-mha", **changes), rngs=nnx.Rngs(seed))


def tokens(n=9):
    return jax.random.randint(jax.random.key(3), (2, n), 0, 97, jnp.int32)


def test_same_num_kv_heads_returns_the_same_model():
    model = mha()
    same = convert_kv_heads(model, 12, "mean")
    np.testing.assert_array_equal(same(tokens()), model(tokens()))


@pytest.mark.parametrize("k", [1, 3, 4])
@pytest.mark.parametrize("qkv_bias", [False, True])
def test_mean_pooling_is_exact_when_heads_are_equal_within_groups(k, qkv_bias):
    model = mha(qkv_bias=qkv_bias)
    cfg, G, H = model.cfg, 12 // k, model.cfg.head_dim
    for layer in model.layers:  # make every group's K/V heads identical (and biases non-zero)
        for name in ("k_proj", "v_proj"):
            w = getattr(layer.attn, name)[...].reshape(k, G, H, cfg.d_model)
            getattr(layer.attn, name)[...] = jnp.repeat(w[:, :1], G, axis=1).reshape(
                -1, cfg.d_model
            )
        if qkv_bias:
            for name in ("k_bias", "v_bias"):
                b = jax.random.normal(jax.random.key(7), (k, 1, H))
                getattr(layer.attn, name)[...] = jnp.repeat(b, G, axis=1).reshape(-1)
    for method in ("mean", "first"):
        gqa = convert_kv_heads(model, k, method)
        assert gqa.cfg.num_kv_heads == k and gqa.layers[0].attn.k_proj[...].shape == (k * H, 40)
        np.testing.assert_allclose(gqa(tokens()), model(tokens()), atol=1e-5)


def test_methods_differ_on_a_trained_like_model():
    model = mha()
    mean = convert_kv_heads(model, 3, "mean")
    first = convert_kv_heads(model, 3, "first")
    rand = convert_kv_heads(model, 3, "random", seed=1)
    w = model.layers[0].attn.k_proj[...].reshape(3, 4, 8, 40)
    np.testing.assert_allclose(
        mean.layers[0].attn.k_proj[...], w.mean(1).reshape(24, 40), atol=1e-6
    )
    np.testing.assert_array_equal(first.layers[0].attn.k_proj[...], w[:, 0].reshape(24, 40))
    assert not np.allclose(rand.layers[0].attn.k_proj[...], mean.layers[0].attn.k_proj[...])
    # everything but K/V is copied
    np.testing.assert_array_equal(rand.layers[1].mlp.down[...], model.layers[1].mlp.down[...])
    np.testing.assert_array_equal(rand.embed[...], model.embed[...])


def test_bad_conversions():
    model = mha()
    with pytest.raises(KvjaxError, match="method='median' is not supported"):
        convert_kv_heads(model, 3, "median")
    with pytest.raises(KvjaxError, match="num_kv_heads=5 must divide the model's num_kv_heads=12"):
        convert_kv_heads(model, 5)
