"""The model's fused attention (kvjax.nn.flash) equals XLA's unfused form: prefill through
jax.nn.dot_product_attention, decode through kvjax's Pallas flash-decoding kernel (interpret
mode on CPU), for MHA/GQA/MQA, sliding windows and MLA (its latent kernel), one and several
splits of the cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kvjax import kernels
from kvjax.errors import KvjaxError
from kvjax.model.config import get_model_config
from kvjax.nn import flash
from kvjax.nn.transformer import Transformer


def _logits(cfg, ids, prefix, max_len, splits=1, prefill=None):
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    # jitted: each step traced once, inside the context
    with flash.lowering_for("cpu", splits=splits, prefill=prefill, block_q=4, block_k=2):
        prefill = jax.jit(lambda m, t, c: m.prefill(t, c))
        decode = jax.jit(lambda m, t, c: m.decode(t, c))
        cache = model.init_cache(ids.shape[0], max_len)
        logits, cache = prefill(model, ids[:, :prefix], cache)
        out = [logits]
        for t in range(prefix, ids.shape[1]):
            step, cache = decode(model, ids[:, t], cache)
            out.append(step[:, None])
    return np.asarray(jnp.concatenate(out, 1)), model


@pytest.mark.parametrize(
    "kv_heads,window,pattern,splits,prefill",
    [(1, 0, "G", 4, None), (2, 4, "LG", 4, "pallas"), (4, 0, "G", 1, None), (2, 3, "LG", 2, None)],
    ids=["mqa", "gqa-window-pallas-prefill", "mha", "gqa-window"],
)  # fmt: skip
def test_flash_equals_xla(kv_heads, window, pattern, splits, prefill):
    base = get_model_config(
        "tiny-gqa", num_layers=2, num_heads=4, num_kv_heads=kv_heads, weight_dtype="f32",
        kv_dtype="f32", sliding_window=window, layer_pattern=pattern,
    )  # fmt: skip
    ids = jax.random.randint(jax.random.key(1), (2, 8), 0, base.vocab_size)
    want, model = _logits(base, ids, 5, 8)
    got, fused = _logits(base.replace(attention_kernel="flash"), ids, 5, 8, splits, prefill)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    forward = np.asarray(jax.jit(lambda m, t: m(t))(fused, ids))  # fused causal forward
    np.testing.assert_allclose(forward, np.asarray(model(ids)), atol=1e-5, rtol=1e-5)


def test_flash_decode_kernel_alone_with_partial_positions():
    B, K, G, H, S = 3, 2, 3, 8, 32
    keys = jax.random.split(jax.random.key(0), 5)
    q = jax.random.normal(keys[0], (B, K, G, H))
    k_new, v_new = (jax.random.normal(k, (B, K, H)) for k in keys[1:3])
    k_cache = jax.random.normal(keys[3], (B, K, H, S))
    v_cache = jax.random.normal(keys[4], (B, K, S, H))
    pos = jnp.array([0, 9, 32])  # an empty cache, a partial one, a full one
    from kvjax.nn.attend import attend_cache

    want = attend_cache(q, k_new, v_new, k_cache, v_cache, pos)
    for splits in (1, 8):
        got = flash.flash_decode(q, k_new, v_new, k_cache, v_cache, pos, splits=splits)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "B,T,K,G,H,window,bq,bk",
    [(2, 32, 2, 3, 8, 0, 8, 8), (1, 30, 1, 4, 8, 0, 8, 16), (2, 32, 2, 2, 8, 5, 8, 8),
     (1, 48, 3, 1, 16, 20, 16, 8)],
    ids=["gqa", "mqa-padded", "gqa-window", "mha-window-rect"],
)  # fmt: skip
def test_pallas_prefill_kernel_equals_xla_and_counts_the_closed_form_blocks(
    B, T, K, G, H, window, bq, bk
):
    """kvjax's FlashAttention-2 prefill (interpret mode) equals the unfused causal attention;
    the cost it supplies (counted from its own loop bounds) equals the closed form's block
    count with the same tiles (`kvjax.analytic.flash`), and exceeds the exact causal pairs."""
    from kvjax.analytic import flash as closed
    from kvjax.nn.attend import attend_causal
    from kvjax.nn.flash_prefill import flash_prefill, kernel_cost

    keys = jax.random.split(jax.random.key(3), 3)
    q = jax.random.normal(keys[0], (B, T, K, G, H))
    k, v = (jax.random.normal(x, (B, T, K, H)) for x in keys[1:])
    got = flash_prefill(q, k, v, window=window, block_q=bq, block_k=bk, interpret=True)
    want = attend_causal(q, k, v, window=window)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    if T % bq == 0 and T % bk == 0:
        flops, moved = kernel_cost(B, K * G, K, T, H, 4, bq, bk, window)
        pairs, loaded = closed.block_pairs(T, T, bq, bk, window)
        assert flops == 4 * H * B * K * G * pairs
        assert moved == 4 * (2 * B * T * K * G * H + 2 * B * K * G * loaded * H)
        assert pairs > closed.exact_pairs(T, T, window)


def test_flash_decode_is_one_named_kernel_in_the_module():
    cfg = get_model_config("tiny-gqa", num_layers=1, attention_kernel="flash")
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    cache = model.init_cache(1, 16)
    text = jax.jit(lambda m, t, c: m.decode(t, c)).lower(model, jnp.zeros((1,), jnp.int32), cache)
    hlo = text.as_text(debug_info=True)
    assert f"/{kernels.ATTENTION}/" in hlo and f"/{kernels.ATTN_COMBINE}/" in hlo
    assert f"/{kernels.SCORES}/" not in hlo


def test_unsupported_flash_models_are_refused_by_name():
    with pytest.raises(KvjaxError, match="kv_dtype='int8'"):
        Transformer(get_model_config("tiny-gqa", attention_kernel="flash", kv_dtype="int8"),
                    rngs=nnx.Rngs(0))  # fmt: skip
    with pytest.raises(KvjaxError, match="mla_decode='naive' is not supported"):
        Transformer(get_model_config("tiny-mla", attention_kernel="flash", mla_decode="naive"),
                    rngs=nnx.Rngs(0))  # fmt: skip


@pytest.mark.parametrize("preset,splits", [("tiny-mla", 4), ("tiny-mla-q", 1)])
def test_flash_mla_equals_xla(preset, splits):
    """MLA fused: prefill over the up-projected keys (values padded), decode by the latent
    kernel reading the cache once for all heads; logits equal the unfused absorbed form."""
    base = get_model_config(preset, num_layers=2, weight_dtype="f32", kv_dtype="f32",
                            mla_decode="absorbed")  # fmt: skip
    ids = jax.random.randint(jax.random.key(2), (2, 8), 0, base.vocab_size)
    want, model = _logits(base, ids, 5, 8)
    got, fused = _logits(base.replace(attention_kernel="flash"), ids, 5, 8, splits)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    forward = np.asarray(jax.jit(lambda m, t: m(t))(fused, ids))
    np.testing.assert_allclose(forward, np.asarray(model(ids)), atol=1e-5, rtol=1e-5)
