"""MLA in the Flax decoder: cached == uncached, naive == absorbed, the latent cache's size equals
the closed form, generate, and the config's one-line errors. (Parity with Hugging Face's
DeepseekV3: tests/test_nn_hf_mla.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kvjax import KvjaxError, analytic, get_model_config
from kvjax.nn import Transformer, generate

MLA = ["tiny-mla", "tiny-mla-q"]


def make(name, seed=0, **changes):
    return Transformer(get_model_config(name, **changes), rngs=nnx.Rngs(seed))


def toks(cfg, shape, seed=1):
    return jax.random.randint(jax.random.key(seed), shape, 0, cfg.vocab_size, jnp.int32)


def stepwise(model, ids, prefix):
    cache = model.init_cache(ids.shape[0], ids.shape[1] + 2)
    logits, cache = model.prefill(ids[:, :prefix], cache)
    out = [logits]
    for t in range(prefix, ids.shape[1]):
        step, cache = model.decode(ids[:, t], cache)
        out.append(step[:, None])
    return jnp.concatenate(out, axis=1), cache


@pytest.mark.parametrize("name", MLA)
@pytest.mark.parametrize("form", ["absorbed", "naive"])
def test_cached_decoding_equals_the_full_forward(name, form):
    model = make(name, mla_decode=form)
    ids = toks(model.cfg, (3, 10))
    full = model(ids)
    assert float(jnp.abs(full).max()) > 0.1  # not a degenerate all-zero model
    got, cache = stepwise(model, ids, 4)
    np.testing.assert_allclose(np.asarray(got), np.asarray(full), atol=2e-5)
    np.testing.assert_array_equal(np.asarray(cache.pos), [10, 10, 10])


@pytest.mark.parametrize("name", MLA)
def test_naive_and_absorbed_decode_agree_step_by_step(name):
    naive, absorbed = make(name, mla_decode="naive"), make(name, mla_decode="absorbed")
    ids = toks(naive.cfg, (2, 8), seed=3)
    a, ca = stepwise(naive, ids, 3)
    b, cb = stepwise(absorbed, ids, 3)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
    for x, y in zip(ca.latent + ca.k_rope, cb.latent + cb.k_rope, strict=True):
        # the same cache up to f32 rounding: the two forms compile to different programs, whose
        # matmuls XLA:CPU may block and sum in another order (1.05e-6 seen on a busy machine)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


def test_bf16_forms_agree_to_bf16_precision():
    ids = toks(get_model_config("tiny-mla"), (2, 8))
    outs = []
    for form in ("naive", "absorbed"):
        model = make("tiny-mla", mla_decode=form, weight_dtype="bf16", kv_dtype="bf16")
        outs.append(np.asarray(stepwise(model, ids, 3)[0], np.float32))
    np.testing.assert_allclose(outs[0], outs[1], atol=0.05)


@pytest.mark.parametrize("kv_dtype", ["f32", "bf16"])
def test_latent_cache_holds_what_the_closed_form_sizes(kv_dtype):
    model = make("tiny-mla-q", kv_dtype=kv_dtype)
    cfg = model.cfg
    cache = model.init_cache(3, 11)
    assert cache.latent[0].shape == (3, 11, cfg.kv_lora_rank)
    assert cache.k_rope[0].shape == (3, 11, cfg.qk_rope_head_dim)
    assert cache.nbytes == analytic.kv_cache_bytes(cfg, 11, 3)
    # the same cache is independent of the number of heads
    wide = make("tiny-mla-q", kv_dtype=kv_dtype, num_heads=6, num_kv_heads=6)
    assert wide.init_cache(3, 11).nbytes == cache.nbytes


def test_generate_with_padded_prompts():
    model = make("tiny-mla", seed=2)
    a, b = toks(model.cfg, (6,), seed=1), toks(model.cfg, (3,), seed=2)
    prompt = jnp.stack([a, jnp.concatenate([b, jnp.zeros(3, jnp.int32)])])
    out = generate(model, prompt, 4, lengths_B=jnp.asarray([6, 3]))
    np.testing.assert_array_equal(out[0], generate(model, a[None], 4)[0])
    np.testing.assert_array_equal(out[1], generate(model, b[None], 4, use_cache=False)[0])


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"num_kv_heads": 3}, "num_kv_heads=3 must equal num_heads=12 for MLA"),
        ({"qk_rope_head_dim": 3}, "qk_rope_head_dim=3 must be even and in 2 .. head_dim-1=9"),
        ({"qk_rope_head_dim": 10}, "qk_rope_head_dim=10 must be even"),
        ({"v_head_dim": 0}, "v_head_dim=0 must be a positive integer for MLA"),
        ({"kv_lora_rank": -1}, "kv_lora_rank=-1 must be a non-negative integer"),
        ({"mla_decode": "fast"}, "mla_decode='fast' is not supported; allowed: absorbed, naive"),
        ({"qkv_bias": True}, "qkv_bias=True is not supported with MLA"),
        ({"kv_lora_rank": 0}, "q_lora_rank=24 is an MLA field, but kv_lora_rank=0"),
    ],
)
def test_bad_mla_configs_name_the_field(changes, message):
    with pytest.raises(KvjaxError, match=message.replace("(", r"\(").replace(".", r"\.")):
        get_model_config("tiny-mla-q", **changes)


def test_mla_reports_itself_and_its_widths():
    cfg = get_model_config("tiny-mla-q")
    assert cfg.attention_variant == "MLA" and cfg.kv_head_choices() == [12]
    assert (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.o_head_dim) == (6, 4, 7)
    assert get_model_config("tiny-gqa").o_head_dim == 8


def test_mla_data_parallel_generates_the_same(devices):
    """(Tensor parallelism of MLA: tests/test_nn_sharding_moe.py.)"""
    from kvjax.nn.sharding import make_mesh, shard_model

    model = make("tiny-mla", seed=4)
    prompt = toks(model.cfg, (4, 5), seed=5)
    mesh = make_mesh(model.cfg, 1, dp=2)
    np.testing.assert_array_equal(
        generate(shard_model(model, mesh), prompt, 4), generate(model, prompt, 4)
    )
    with pytest.raises(KvjaxError, match="tp=2 does not divide vocab_size=97"):
        make_mesh(model.cfg, 2)  # MLA itself shards; this tiny vocabulary does not
