"""Quantized KV caches (int8 with per-token-per-head scales, fp8 per tensor) in the three views:
their sizes by hand (scales included), the trace against the closed form per kernel (quantize on
write, dequantize on read), the model's cache against a bf16 cache and the rounding bound."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kvjax import KvjaxError, analytic, get_model_config, kernels
from kvjax.nn import Transformer
from kvjax.nn.kv_cache import dequantize, quantize
from kvjax.traced.step import trace_step


def test_int8_cache_with_f32_scales_is_1_plus_4_over_h_of_half_bf16():
    bf16 = get_model_config("llama-3-8b")
    int8 = bf16.replace(kv_dtype="int8")
    assert int8.kv_scale_kind == "token_head"
    H = bf16.head_dim
    assert analytic.kv_bytes_per_token(int8) == analytic.kv_bytes_per_token(bf16) / 2 * (1 + 4 / H)
    assert analytic.kv_bytes_per_token(int8) == 66 * 1024  # 64 KiB of int8 + 2 KiB of scales
    fp8 = bf16.replace(kv_dtype="fp8")  # one f32 scale per layer for K and for V
    assert fp8.kv_scale_kind == "tensor"
    assert analytic.kv_cache_bytes(fp8, 32768) == analytic.kv_cache_bytes(bf16, 32768) // 2 + 32 * 8


@pytest.mark.parametrize("kv,scales", [("int8", "auto"), ("fp8", "auto"), ("fp8", "token_head"),
                                       ("fp8", "none")])  # fmt: skip
@pytest.mark.parametrize("weights", ["f32", "bf16"])
@pytest.mark.parametrize("phase,batch,context", [("prefill", 1, 7), ("prefill", 3, 12),
                                                 ("decode", 1, 7), ("decode", 3, 12)])  # fmt: skip
@pytest.mark.parametrize("pattern,window", [("G", 0), ("LG", 5)])
def test_quantized_traces_match_the_closed_form(kv, scales, weights, phase, batch, context,
                                                pattern, window):  # fmt: skip
    from test_traced_step import check_against_closed_form

    cfg = get_model_config("tiny-gqa", weight_dtype=weights, kv_dtype=kv, kv_scales=scales,
                           sliding_window=window, layer_pattern=pattern)  # fmt: skip
    check_against_closed_form(trace_step(cfg, phase, batch, context))


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_quantized_cache_decodes_close_to_a_bf16_cache(kv):
    ref = get_model_config("tiny-gqa", weight_dtype="bf16", kv_dtype="bf16")
    models = [Transformer(c, rngs=nnx.Rngs(0)) for c in (ref, ref.replace(kv_dtype=kv))]
    ids = jax.random.randint(jax.random.key(1), (2, 12), 0, 97)
    outs, caches = [], []
    for model in models:
        cache = model.init_cache(2, 16)
        logits, cache = model.prefill(ids[:, :7], cache)
        steps = [logits]
        for t in range(7, 12):
            step, cache = model.decode(ids[:, t], cache)
            steps.append(step[:, None])
        outs.append(np.asarray(jnp.concatenate(steps, 1), np.float32))
        caches.append(cache)
    scale = np.abs(outs[0]).max()
    err = np.abs(outs[1] - outs[0]).max()
    assert err < 0.05 * scale, (err, scale)  # int8 ~1%, fp8 ~2% of the largest logit here
    assert caches[1].k[0].dtype == (jnp.int8 if kv == "int8" else jnp.float8_e4m3fn)
    assert caches[1].nbytes == analytic.kv_cache_bytes(models[1].cfg, 16, 2)
    if kv == "int8":
        assert (
            caches[1].k_scale[0].shape == (2, 3, 16) and caches[1].k_scale[0].dtype == jnp.float32
        )


def test_int8_rounding_is_within_half_a_step():
    x = jax.random.normal(jax.random.key(0), (4, 3, 5, 8), jnp.float32) * 3
    q, scale = quantize(x, jnp.int8, "token_head", axis=3)
    assert q.dtype == jnp.int8 and scale.shape == (4, 3, 5)
    back = dequantize(q, scale, jnp.float32, axis=3)
    assert np.all(np.abs(np.asarray(back - x)) <= np.asarray(scale)[..., None] / 2 + 1e-6)
    assert int(jnp.abs(q.astype(jnp.int32)).max()) == 127  # each row's absmax maps to 127
    zero, s0 = quantize(jnp.zeros((2, 8)), jnp.int8, "token_head")
    assert not np.any(np.asarray(zero)) and not np.any(np.asarray(s0))  # no NaN from 0 / 0


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"kv_scales": "tensor"}, "kv_scales='tensor' applies to a 1-byte cache"),
        ({"kv_dtype": "int8", "kv_scales": "tensor"}, "kv_dtype='int8' needs per-token scales"),
        ({"kv_dtype": "int8", "kv_scales": "none"}, "kv_dtype='int8' needs per-token scales"),
        ({"kv_scales": "per_block"}, "kv_scales='per_block' is not supported; allowed: auto"),
    ],
)
def test_bad_scale_configs_name_the_field(changes, message):
    with pytest.raises(KvjaxError, match=message):
        get_model_config("tiny-gqa", **changes)


def test_mla_latent_scales_are_refused_by_name():
    with pytest.raises(KvjaxError, match="scales for MLA's latent cache are not implemented"):
        get_model_config("tiny-mla", kv_dtype="int8")
    assert get_model_config("tiny-mla", kv_dtype="fp8").kv_scale_kind == "none"


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_the_forward_with_a_quantized_cache_matches_decoding_from_one(kv):
    """The quality switch: `model(tokens, kv_dtype)` attends K and V as the cache holds them and
    each query's own row fresh, as a decode step does: it equals decoding token by token from a
    quantized cache (to float rounding), and differs from the plain forward."""
    cfg = get_model_config("tiny-gqa")
    plain = Transformer(cfg, rngs=nnx.Rngs(0))
    cached = Transformer(cfg.replace(kv_dtype=kv), rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(1), (2, 12), 0, 97)
    cache = cached.init_cache(2, 12)
    logits, cache = cached.prefill(ids[:, :1], cache)
    steps = [logits]
    for t in range(1, 12):
        step, cache = cached.decode(ids[:, t], cache)
        steps.append(step[:, None])
    decoded = np.asarray(jnp.concatenate(steps, 1))
    switched, full = np.asarray(plain(ids, kv)), np.asarray(plain(ids))
    assert np.abs(decoded - full).max() > 1e-3  # the quantization shows
    np.testing.assert_allclose(switched, decoded, atol=1e-5)
    with pytest.raises(KvjaxError, match="kv_dtype='bf16': the forward quantizes a GQA cache"):
        plain(ids, "bf16")


def _group_reference(x, levels):
    """One group by hand: levels + 1 values evenly from min to max, each element the nearest."""
    lo, hi = float(np.float16(x.min())), x.max()
    step = float(np.float16((hi - lo) / levels))
    return np.clip(np.round((x - lo) / step), 0, levels) * step + lo


@pytest.mark.parametrize(("levels", "axis"), [(15, 0), (3, 0), (15, 1)])
def test_group_roundtrip_against_a_hand_quantizer(levels, axis):
    from kvjax.nn.fake_quant import group_roundtrip

    x = np.asarray(jax.random.normal(jax.random.key(3), (10, 8)), np.float32)
    y = np.asarray(group_roundtrip(jnp.asarray(x), levels, 4, axis))
    xs, ys = np.moveaxis(x, axis, 0), np.moveaxis(y, axis, 0)
    n = xs.shape[0] // 4 * 4
    for g in range(0, n, 4):
        for c in range(xs.shape[1]):
            np.testing.assert_allclose(ys[g : g + 4, c], _group_reference(xs[g : g + 4, c], levels),
                                       atol=1e-6)  # fmt: skip
            assert len(np.unique(ys[g : g + 4, c])) <= levels + 1
    np.testing.assert_array_equal(ys[n:], xs[n:])  # a group not yet full stays as it is
    assert np.abs(ys[:n] - xs[:n]).max() > 0
    exact = np.array([[0.0], [1.0], [2.0], [15.0]], np.float32)  # on the grid: returned exactly
    np.testing.assert_array_equal(np.asarray(group_roundtrip(jnp.asarray(exact), 15, 4, 0)), exact)


def test_cached_attention_against_a_per_query_reference():
    """`attend_causal(cached=...)`: query t reads rows j // R < t // R from the quantized k, v and
    the rest at full precision; checked against building each query's keys by hand."""
    from kvjax.nn.attend import attend_causal

    B, T, K, G, H, R = 1, 7, 2, 2, 4, 3
    q, k, v, kq, vq = (np.asarray(jax.random.normal(jax.random.key(i), s), np.float32) for i, s in
                       enumerate([(B, T, K, G, H)] + [(B, T, K, H)] * 4))  # fmt: skip
    out = np.asarray(attend_causal(q, k, v, cached=(kq, vq, R)))
    for t in range(T):
        old = (np.arange(t + 1) // R < t // R)[:, None, None]
        kt = np.where(old, kq[0, : t + 1], k[0, : t + 1])  # [t+1, K, H]
        vt = np.where(old, vq[0, : t + 1], v[0, : t + 1])
        s = np.einsum("KGH,SKH->KGS", q[0, t], kt) / np.sqrt(H)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(out[0, t], np.einsum("KGS,SKH->KGH", p, vt), atol=1e-5)


def test_packed_cache_quality_switch():
    """int4 / int2 (KIVI): a query in the first group of G tokens reads only the residual (full
    precision: logits unchanged); later ones read quantized groups, int2 further off than int4,
    int4 than int8; no position's logits depend on later tokens (a group's min and max are taken
    only once it is full)."""
    cfg = get_model_config("tiny-gqa", kv_group_size=4)  # head_dim 8: two value groups a row
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(1), (2, 14), 0, 97)
    full = np.asarray(model(ids))
    err = {kv: np.abs(np.asarray(model(ids, kv)) - full) for kv in ("int8", "int4", "int2")}
    np.testing.assert_allclose(np.asarray(model(ids, "int4"))[:, :4], full[:, :4], atol=1e-5)
    assert err["int2"][:, 4:].mean() > err["int4"][:, 4:].mean() > err["int8"][:, 4:].mean() > 0
    later = ids.at[:, 9:].set((ids[:, 9:] + 1) % 97)
    np.testing.assert_allclose(np.asarray(model(later, "int4"))[:, :9],
                               np.asarray(model(ids, "int4"))[:, :9], atol=1e-5)  # fmt: skip
    with pytest.raises(KvjaxError, match="kv_group_size=32 must divide head_dim=8"):
        Transformer(get_model_config("tiny-gqa"), rngs=nnx.Rngs(0))(ids, "int4")


def test_evaluate_takes_the_cache_dtype():
    from kvjax.quality.train import eval_step

    model = Transformer(get_model_config("tiny-gqa"), rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(2), (2, 10), 0, 97)
    mask = jnp.ones(ids.shape, jnp.float32)
    base = float(eval_step(model, ids, jnp.roll(ids, -1, 1), mask)[0])
    int8 = float(eval_step(model, ids, jnp.roll(ids, -1, 1), mask, "int8")[0])
    assert int8 != base and abs(int8 - base) < 0.01 * base


def test_packed_4_and_2_bit_caches_by_hand():
    """KIVI-style int4 / int2 (closed form only): 0.5 or 0.25 bytes an element plus an f16 scale
    and an f16 zero point (4 B) per group of G elements."""
    bf16 = get_model_config("llama-3-8b")  # 32 layers, 8 KV heads of 128
    S = 32768
    full = analytic.kv_cache_bytes(bf16, S)
    assert full == 2 * 32 * 8 * 128 * S * 2  # 4 GiB
    int4 = bf16.replace(kv_dtype="int4")
    assert int4.kv_scale_kind == "group" and int4.kv_group_size == 32
    # per element 0.5 + 4/32 = 0.625 B: 1.25 GiB, 0.3125 of the bf16 cache
    assert analytic.kv_cache_bytes(int4, S) == 2 * 32 * 8 * 128 * S * 5 // 8 == 5 * 2**28
    assert analytic.kv_bytes_per_token_per_layer(int4) == 2 * 8 * (128 // 2 + 128 // 32 * 4)
    # int2 with groups of 128 (one per row): 0.25 + 4/128 = 0.28125 B an element
    int2 = bf16.replace(kv_dtype="int2", kv_group_size=128)
    assert analytic.kv_cache_bytes(int2, S) * 64 == full * 9
    # the decode step reads what is cached: the cache reads' bytes follow the packed size
    wl = analytic.Workload("decode", 1, S + 1)
    read = analytic.step_kernels(int4, wl)[kernels.SCORES].kv_bytes
    assert read == analytic.kv_cache_bytes(int4, S) / 2  # the keys' half (scores), V in av


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"weight_dtype": "int4"}, r"weight_dtype='int4' is not supported \(int4/int2 are KV"),
        ({"kv_dtype": "int4", "kv_scales": "token_head"}, "needs grouped scales"),
        ({"kv_dtype": "int4", "kv_group_size": 48}, "kv_group_size=48 must divide head_dim=128"),
        ({"kv_dtype": "int8", "kv_scales": "group"}, "kv_scales='group' applies to a packed"),
        ({"kv_group_size": 0}, "kv_group_size=0 must be a positive integer"),
    ],
)
def test_bad_packed_configs_name_the_field(changes, message):
    with pytest.raises(KvjaxError, match=message):
        get_model_config("llama-3-8b", **changes)


def test_packed_cache_is_closed_form_only():
    with pytest.raises(KvjaxError, match="modelled in the closed form only"):
        Transformer(
            get_model_config("tiny-gqa", kv_dtype="int4", kv_group_size=4), rngs=nnx.Rngs(0)
        )
    with pytest.raises(KvjaxError, match="not modelled for MLA"):
        get_model_config("tiny-mla", kv_dtype="int4", head_dim=8, qk_rope_head_dim=4,
                         kv_group_size=4)  # fmt: skip


def test_calc_prints_a_packed_cache(capsys):
    import json

    from kvjax.cli.main import main

    assert main(["calc", "--model", "llama-3-8b", "--context", "32k", "--kv-dtype", "int4",
                 "--kv-group-size", "64", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    # 0.5 + 4/64 = 0.5625 B an element
    assert out["kv_cache_bytes"] == 2 * 32 * 8 * 128 * 32768 * 9 // 16
    assert out["kv_scales"] == "group" and out["kv_scale_bytes_per_token_per_layer"] == 2 * 8 * 8
    with pytest.raises(SystemExit) as exit_:
        main(["calc", "--model", "llama-3-8b", "--kv-dtype", "int3"])
    assert exit_.value.code == 2 and "int8, int4, int2" in capsys.readouterr().err
