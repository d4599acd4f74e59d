"""The Flax decoder: cached decoding equals the full forward, against an independent numpy
reference, GQA as tied MHA, causality, generate, parameter counts, errors, donation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from support import jitted

from kvjax import KvjaxError, analytic, get_model_config
from kvjax.model.config import PRESETS
from kvjax.nn import CompiledSteps, Transformer, abstract_model, generate, param_count

VARIANTS = ["tiny-mha", "tiny-gqa", "tiny-mqa"]


def make(name, seed=0, **changes):
    cfg = get_model_config(name, **changes)
    return Transformer(cfg, rngs=nnx.Rngs(seed))


def tokens(cfg, shape, seed=1):
    return jax.random.randint(jax.random.key(seed), shape, 0, cfg.vocab_size, jnp.int32)


# ---- an independent reference: plain numpy, K/V repeated to N heads, no group axis ------------
def numpy_forward(model: Transformer, toks: np.ndarray) -> np.ndarray:
    cfg = model.cfg
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    f = lambda p: np.asarray(p[...], np.float64)  # noqa: E731

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.norm_eps) * w

    def rope(x, pos):  # x [T, heads, H]
        inv = 1.0 / cfg.rope_theta ** (np.arange(0, H, 2) / H)
        ang = pos[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = x[..., : H // 2], x[..., H // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    out = []
    for seq in toks:
        T = len(seq)
        pos = np.arange(T, dtype=np.float64)
        x = f(model.embed)[seq]
        for layer in model.layers:
            a = layer.attn
            h = rms(x, f(layer.attn_norm.scale))
            q = (h @ f(a.q_proj).T).reshape(T, N, H)
            k = (h @ f(a.k_proj).T).reshape(T, K, H)
            v = (h @ f(a.v_proj).T).reshape(T, K, H)
            q, k = rope(q, pos), rope(k, pos)
            k = np.repeat(k, N // K, axis=1)  # query head n uses kv head n // G
            v = np.repeat(v, N // K, axis=1)
            s = np.einsum("tnh,snh->nts", q, k) / np.sqrt(H)
            s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            o = np.einsum("nts,snh->tnh", p, v)
            x = x + o.reshape(T, N * H) @ f(a.o_proj).T
            h = rms(x, f(layer.mlp_norm.scale))
            gu = h @ f(layer.mlp.gate_up).T
            g, u = gu[:, : cfg.d_ff], gu[:, cfg.d_ff :]
            x = x + (g / (1 + np.exp(-g)) * u) @ f(layer.mlp.down).T
        x = rms(x, f(model.final_norm.scale))
        out.append(x @ f(model.lm_head).T)
    return np.stack(out)


@pytest.mark.parametrize("name", VARIANTS)
def test_forward_equals_numpy_reference(name):
    model = make(name)
    toks = tokens(model.cfg, (3, 7))
    np.testing.assert_allclose(model(toks), numpy_forward(model, np.asarray(toks)), atol=2e-5)


def test_gqa_equals_mha_with_kv_heads_tied_in_groups():
    gqa = make("tiny-gqa", seed=3)
    mha = make("tiny-mha", seed=4)
    G = gqa.cfg.group_size
    for lg, lm in zip(gqa.layers, mha.layers, strict=True):
        lm.attn.q_proj[...] = lg.attn.q_proj[...]
        lm.attn.o_proj[...] = lg.attn.o_proj[...]
        H, D = gqa.cfg.head_dim, gqa.cfg.d_model
        for name in ("k_proj", "v_proj"):  # each kv head's (H, D) block repeated G times
            w_KHD = getattr(lg.attn, name)[...].reshape(-1, H, D)
            getattr(lm.attn, name)[...] = jnp.repeat(w_KHD, G, axis=0).reshape(-1, D)
        lm.mlp.gate_up[...] = lg.mlp.gate_up[...]
        lm.mlp.down[...] = lg.mlp.down[...]
    mha.embed[...] = gqa.embed[...]
    mha.lm_head[...] = gqa.lm_head[...]
    toks = tokens(gqa.cfg, (2, 9))
    np.testing.assert_allclose(gqa(toks), mha(toks), atol=1e-5)
    # and through the cache
    cache_g, cache_m = gqa.init_cache(2, 12), mha.init_cache(2, 12)
    _, cache_g = gqa.prefill(toks, cache_g)
    _, cache_m = mha.prefill(toks, cache_m)
    nxt = tokens(gqa.cfg, (2,), seed=9)
    np.testing.assert_allclose(gqa.decode(nxt, cache_g)[0], mha.decode(nxt, cache_m)[0], atol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("prompt_len,k", [(1, 6), (5, 1), (5, 4)])
def test_cached_decoding_equals_full_forward(name, prompt_len, k):
    model = make(name)
    B = 3
    toks = tokens(model.cfg, (B, prompt_len + k))
    full_BTV = model(toks)
    cache = model.init_cache(B, prompt_len + k + 2)
    logits, cache = model.prefill(toks[:, :prompt_len], cache)
    np.testing.assert_allclose(logits, full_BTV[:, :prompt_len], atol=1e-5)
    for t in range(prompt_len, prompt_len + k):
        logits, cache = model.decode(toks[:, t], cache)
        np.testing.assert_allclose(logits, full_BTV[:, t], atol=1e-5)
    np.testing.assert_array_equal(cache.pos, prompt_len + k)


@pytest.mark.parametrize("name", VARIANTS)
def test_padded_batch_of_different_lengths(name):
    model = make(name)
    lengths = [6, 2, 4]
    T, k = max(lengths), 3
    seqs = [tokens(model.cfg, (n + k,), seed=10 + i) for i, n in enumerate(lengths)]
    prompt = np.zeros((3, T), np.int32)
    for i, (s, n) in enumerate(zip(seqs, lengths, strict=True)):
        prompt[i, :n] = s[:n]
    forward, prefill, decode, _ = jitted(model)
    cache = model.init_cache(3, T + k)
    logits, cache = prefill(jnp.asarray(prompt), cache, jnp.asarray(lengths))
    for i, (s, n) in enumerate(zip(seqs, lengths, strict=True)):
        np.testing.assert_allclose(logits[i, :n], forward(s[None, :n])[0], atol=1e-5)
    for step in range(k):
        nxt = jnp.asarray([s[n + step] for s, n in zip(seqs, lengths, strict=True)])
        logits, cache = decode(nxt, cache)
        for i, (s, n) in enumerate(zip(seqs, lengths, strict=True)):
            ref = forward(s[None, : n + step + 1])[0, -1]
            np.testing.assert_allclose(logits[i], ref, atol=1e-5)


def test_causality():
    model = make("tiny-gqa")
    toks = tokens(model.cfg, (2, 10))
    base = model(toks)
    for t in (0, 4, 9):
        changed = toks.at[:, t].set((toks[:, t] + 1) % model.cfg.vocab_size)
        out = model(changed)
        np.testing.assert_array_equal(out[:, :t], base[:, :t])
        assert not np.allclose(out[:, t], base[:, t])


@pytest.mark.parametrize("name", VARIANTS)
def test_generate_same_tokens_with_and_without_cache(name):
    model = make(name, seed=5)
    prompt = tokens(model.cfg, (2, 5))
    cached = generate(model, prompt, 6)
    uncached = generate(model, prompt, 6, use_cache=False)
    np.testing.assert_array_equal(cached, uncached)
    assert cached.shape == (2, 6)
    key = jax.random.key(7)
    np.testing.assert_array_equal(
        generate(model, prompt, 4, temperature=0.8, rng=key),
        generate(model, prompt, 4, temperature=0.8, rng=key, use_cache=False),
    )


def test_generate_padded_prompts():
    model = make("tiny-gqa", seed=2)
    a, b = tokens(model.cfg, (6,), seed=1), tokens(model.cfg, (3,), seed=2)
    prompt = jnp.stack([a, jnp.concatenate([b, jnp.zeros(3, jnp.int32)])])
    out = generate(model, prompt, 4, lengths_B=jnp.asarray([6, 3]))
    np.testing.assert_array_equal(out[0], generate(model, a[None], 4)[0])
    np.testing.assert_array_equal(out[1], generate(model, b[None], 4)[0])


def _distinct_presets() -> list[str]:
    """One preset of each shape: RoPE's fields hold no parameter (llama-3.1-8b is llama-3-8b's
    shape, deepseek-r1 deepseek-v3's config)."""
    fields = ("rope_scaling", "rope_factor", "rope_original_context", "rope_theta")
    rope = {f: getattr(PRESETS["tiny-gqa"], f) for f in fields}
    seen: dict = {}
    for name in sorted(PRESETS):
        seen.setdefault(repr(PRESETS[name].replace(name="", **rope)), name)
    return sorted(seen.values())


def _uniform_tail(cfg) -> int:
    """Layers up to which a model's layers may differ (its first dense layers; the rest alike),
    or 0 when its patterns repeat with a longer period (then the whole model is built)."""
    patterns = (cfg.layer_pattern, cfg.rope_pattern, cfg.layer_kinds)
    if any(len(p) > 1 for p in patterns) or cfg.moe_layer_step > 1:
        return 0
    return cfg.first_dense_layers + 1


@pytest.mark.parametrize("name", _distinct_presets())
def test_parameter_count_equals_analytic_exactly(name):
    # gpt-oss's MXFP4 experts: the model holds them dequantized (the same elements)
    cfg = get_model_config(name).replace(expert_weight_dtype="")
    head = _uniform_tail(cfg)
    if not head or cfg.num_layers <= head + 1:
        count = param_count(abstract_model(cfg))
    else:  # alike layers past `head`: the count of L layers from those of head and head + 1
        short, longer = (param_count(abstract_model(cfg.replace(num_layers=n)))
                         for n in (head, head + 1))  # fmt: skip
        count = short + (cfg.num_layers - head) * (longer - short)
    assert count == analytic.num_params(get_model_config(name))


def test_abstract_model_allocates_nothing():
    model = abstract_model(get_model_config("llama-2-70b"))
    leaves = jax.tree_util.tree_leaves(nnx.state(model))
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert model.layers[0].attn.k_proj.shape == (8 * 128, 8192)  # (K*H, D): (out, in)


def test_cache_layout_and_dtype():
    cfg = get_model_config("tiny-gqa", kv_dtype="bf16")
    cache = Transformer(cfg, rngs=nnx.Rngs(0)).init_cache(5, 11)
    assert cache.k[0].shape == (5, 3, 8, 11)  # (B, K, H, S)
    assert cache.v[0].shape == (5, 3, 11, 8)  # (B, K, S, H)
    assert cache.max_len == 11
    assert cache.k[0].dtype == jnp.bfloat16 and len(cache.v) == cfg.num_layers
    assert cache.nbytes == analytic.kv_cache_bytes(cfg, 11, 5)


def test_cache_is_donated_and_written_in_place():
    model = make("tiny-gqa")
    steps = CompiledSteps(model)
    cache = model.init_cache(2, 16)
    logits, cache = steps.prefill(steps.state, tokens(model.cfg, (2, 4)), cache, jnp.array([4, 4]))
    _, new_k, new_v = steps.attend(steps.state, tokens(model.cfg, (2,)), cache)
    compiled = steps.append.lower(cache, new_k, new_v).compile()
    text = compiled.as_text()
    assert "input_output_alias" in text  # every cache buffer aliased to its output
    old = cache.k[0]
    cache = steps.append(cache, new_k, new_v)
    assert old.is_deleted()  # donated, not copied
    mem = compiled.memory_analysis()
    if mem is not None:
        assert mem.temp_size_in_bytes < cache.nbytes / 4


@pytest.mark.parametrize(
    "action,message",
    [
        ("past_max_len", "cannot decode past max_len=4: sequence 0 is at position 4"),
        ("batch", "tokens_B has batch 3 but the cache was made for batch_size=2"),
        ("long_prompt", "a prompt of T=6 tokens does not fit the cache's max_len=4"),
        ("vocab", "allowed: 0 .. vocab_size-1 = 96"),
        ("generate_len", "max_len=5 is too short"),
    ],
)
def test_bad_requests_fail_before_computation(action, message):
    model = make("tiny-gqa")
    cache = model.init_cache(2, 4)
    with pytest.raises(KvjaxError, match=message.replace("(", r"\(")):
        if action == "past_max_len":
            _, cache = model.prefill(tokens(model.cfg, (2, 4)), cache)
            model.decode(tokens(model.cfg, (2,)), cache)
        elif action == "batch":
            model.decode(tokens(model.cfg, (3,)), cache)
        elif action == "long_prompt":
            model.prefill(tokens(model.cfg, (2, 6)), cache)
        elif action == "vocab":
            model(jnp.full((1, 3), 97, jnp.int32))
        else:
            generate(model, tokens(model.cfg, (2, 3)), 4, max_len=5)


def test_kv_heads_must_divide_heads():
    with pytest.raises(KvjaxError, match="num_heads=12 is not divisible by num_kv_heads=5"):
        make("tiny-gqa", num_kv_heads=5)
