"""Issue 39: extend (chunked prefill, speculative verify) on the hybrids. T new tokens on a cached
state equal the uncached forward, and a rejected draft rolls back to the snapshot exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from support import jitted

from kvjax import get_model_config
from kvjax.errors import KvjaxError
from kvjax.nn.transformer import Transformer

# tiny-falcon-h1 scans in chunks of 8, the others 64: 13 + 11 tokens cross a chunk end in both
PRESETS = ["tiny-qwen3-next", "tiny-falcon-h1", "tiny-lfm2"]


@pytest.fixture(scope="module", params=PRESETS)
def model(request):
    """The model and its jitted forward, prefill, decode and extend (one compile a shape)."""
    m = Transformer(get_model_config(request.param), rngs=nnx.Rngs(0))
    return m, *jitted(m)


def _tokens(cfg, n, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(2, n)))


def test_extend_on_a_cached_state_equals_the_uncached_forward(model):
    model, forward, prefill, decode, extend = model
    cfg = model.cfg
    toks = _tokens(cfg, 13 + 11 + 3)
    want = forward(toks)  # uncached, from a zero state
    cache = model.init_cache(2, 32)
    got0, cache = prefill(toks[:, :13], cache)
    got1, cache = extend(toks[:, 13:24], cache)  # a chunk of a chunked prefill
    got2, cache = extend(toks[:, 24:], cache)  # a verify step of k + 1 = 3
    got = jnp.concatenate([got0, got1, got2], axis=1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    assert np.asarray(cache.pos).tolist() == [27, 27]
    logits, cache = decode(toks[:, -1], cache)  # decode goes on from the extended state
    longer = forward(jnp.concatenate([toks, toks[:, -1:]], axis=1))
    np.testing.assert_allclose(np.asarray(logits), np.asarray(longer[:, -1]), atol=1e-5)


def test_rejected_draft_rolls_back_exactly(model):
    model, forward, prefill, _, extend = model
    cfg = model.cfg
    toks = _tokens(cfg, 10 + 4, seed=1)
    _, cache = prefill(toks[:, :10], model.init_cache(2, 24))
    snap = cache.snapshot()
    draft = _tokens(cfg, 4, seed=2)  # a draft the verifier rejects after its first token
    _, drafted = extend(draft, cache)
    assert any(not np.array_equal(a, b) for a, b in zip(drafted.conv, cache.conv, strict=True))
    back = drafted.restore(snap)
    for a, b in zip((*back.conv, *back.state), (*cache.conv, *cache.state), strict=True):
        assert (a is None and b is None) or np.array_equal(np.asarray(a), np.asarray(b))
    assert np.array_equal(np.asarray(back.pos), np.asarray(cache.pos))
    # accept one draft token, then the true continuation: as if the draft never ran
    accepted = jnp.concatenate([draft[:, :1], toks[:, 10:]], axis=1)
    got, _ = extend(accepted, back)
    want = forward(jnp.concatenate([toks[:, :10], accepted], axis=1))[:, 10:]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_closed_form_still_refuses_extend_of_state_layers():
    from kvjax.analytic import Workload, step_cost

    with pytest.raises(KvjaxError, match="closed form of their extend step is not written"):
        step_cost(get_model_config("tiny-lfm2"), Workload("extend", 1, 16, new_tokens=4))


def test_extend_is_eager_and_jitted_alike_without_recompiling_per_state():
    model = Transformer(get_model_config("tiny-lfm2"), rngs=nnx.Rngs(0))
    g, state = nnx.split(model)

    @jax.jit
    def extend(state, toks, cache):
        return nnx.merge(g, state).extend(toks, cache)

    toks = _tokens(model.cfg, 8)
    _, cache = model.prefill(toks[:, :4], model.init_cache(2, 16))  # eager
    a, cache = extend(state, toks[:, 4:6], cache)
    b, cache = extend(state, toks[:, 6:8], cache)
    eager, _ = model.extend(toks[:, 6:8], model.prefill(toks[:, :6], model.init_cache(2, 16))[1])
    want = jitted(model)[0](toks)
    np.testing.assert_allclose(np.asarray(b), np.asarray(want[:, 6:8]), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(b), atol=1e-5, rtol=1e-5)
    assert extend._cache_size() == 1
