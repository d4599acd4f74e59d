"""MHA/GQA -> MLA conversion (MHA2MLA: partial RoPE, joint SVD of keys and values)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kvjax import KvjaxError, get_model_config
from kvjax.nn import Transformer
from kvjax.nn.layers import apply_rope, rope_tables
from kvjax.quality.convert_mla import check_conversion, convert_to_mla, kept_dims, partial_rope

P = 4  # RoPE dims kept per head of 8


def source(preset, seed=0):
    model = Transformer(get_model_config(preset), rngs=nnx.Rngs(seed))
    state = nnx.state(model, nnx.Param)
    for i in range(model.cfg.num_layers):  # a non-trivial input norm scale
        key = jax.random.key(10 + i)
        scale = state["layers"][i]["attn_norm"]["scale"]
        scale[...] = 0.5 + jax.random.uniform(key, scale[...].shape)
    nnx.update(model, state)
    return model


def partial_rope_mha(model, x_BTD, pos_BT, rope_dim=P):
    """The source's scores [B, N, T, S] and values [B, S, N, H] with RoPE kept on the rope_dim
    highest frequencies only (the dropped frequencies set to 0: cos 1, sin 0)."""
    cfg, attn = model.cfg, model.layers[0].attn
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    B, T, _ = x_BTD.shape
    q = (x_BTD @ attn.q_proj[...].T).reshape(B, T, N, H)
    k = (x_BTD @ attn.k_proj[...].T).reshape(B, T, K, H)
    v = (x_BTD @ attn.v_proj[...].T).reshape(B, T, K, H)
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, H, 2) / H)
    inv[rope_dim // 2 :] = 0.0
    cos, sin = rope_tables(pos_BT, H, cfg.rope_theta, inv_freq=tuple(inv))
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k, v = jnp.repeat(k, N // K, axis=2), jnp.repeat(v, N // K, axis=2)
    return jnp.einsum("BTNH,BSNH->BNTS", q, k), v


@pytest.mark.parametrize("preset", ["tiny-mqa", "tiny-gqa"])
def test_full_rank_conversion_reproduces_partial_rope_attention(preset):
    model = source(preset)
    cfg = model.cfg
    K, H = cfg.num_kv_heads, cfg.head_dim
    if K > 1:  # one shared RoPE key is exact when every KV head's kept rows agree
        k = model.layers[0].attn.k_proj
        rows = np.array(k[...]).reshape(K, H, -1)
        rows[:, kept_dims(H, P)] = rows[0, kept_dims(H, P)]
        k[...] = jnp.asarray(rows.reshape(K * H, -1))
    full = K * (2 * H - P)  # the joint matrix's rows, under d_model = 40
    mla = convert_to_mla(model, full, P)
    x = jax.random.normal(jax.random.key(1), (2, 5, cfg.d_model))
    x = x * jnp.array([0.3, 1.0, 2.5, 0.7, 1.6])[None, :, None]  # tokens of unlike RMS
    pos = jnp.broadcast_to(jnp.arange(3, 8), (2, 5))
    scores, values = partial_rope_mha(model, x, pos)

    attn = mla.layers[0].attn
    proj = attn.project(x, pos)
    A = full
    c_raw = x @ attn.kv_a_proj[...][:A].T
    rms = jnp.sqrt(jnp.mean(c_raw**2, axis=-1, keepdims=True) + cfg.norm_eps)
    np.testing.assert_allclose(proj.c_BTA, c_raw / rms * attn.kv_a_norm[...], rtol=1e-5, atol=1e-6)
    k_nope = jnp.einsum("BSA,NUA->BSNU", c_raw, attn.k_up[...])
    got = jnp.einsum("BTNU,BSNU->BNTS", proj.q_nope_BTNU, k_nope) + jnp.einsum(
        "BTNP,BSP->BNTS", proj.q_rope_BTNP, proj.k_rope_BTP
    )
    np.testing.assert_allclose(got, scores, rtol=1e-4, atol=1e-4)
    got_v = jnp.einsum("BSA,NWA->BSNW", c_raw, attn.v_up[...])
    np.testing.assert_allclose(got_v, values, rtol=1e-4, atol=1e-4)


def test_low_rank_is_the_best_approximation_and_the_rest_is_copied():
    model = source("tiny-mha")
    cfg = model.cfg
    N, H, D, A = cfg.num_heads, cfg.head_dim, cfg.d_model, 20
    mla = convert_to_mla(model, A, P)
    assert mla.cfg.kv_lora_rank == A and mla.cfg.qk_rope_head_dim == P
    assert mla.cfg.v_head_dim == H and mla.cfg.attn_scale == cfg.attn_scale
    # the kept frequencies are the source's P/2 highest, theta^(-2i/H), i < P/2
    new_inv = mla.cfg.rope_theta ** (-np.arange(0, P, 2) / P)
    np.testing.assert_allclose(new_inv, cfg.rope_theta ** (-np.arange(0, P, 2) / H), rtol=1e-12)
    src, dst = model.layers[1].attn, mla.layers[1].attn
    k = np.asarray(src.k_proj[...]).reshape(N, H, D)
    v = np.asarray(src.v_proj[...]).reshape(N, H, D)
    nope = np.delete(k, kept_dims(H, P), axis=1)
    joint = np.concatenate([nope, v], axis=1).reshape(-1, D)
    down = np.asarray(dst.kv_a_proj[...][:A])
    up = np.concatenate([np.asarray(dst.k_up[...]), np.asarray(dst.v_up[...])], axis=1)
    err = np.linalg.norm(up.reshape(-1, A) @ down - joint)
    sigma2 = np.sort(np.linalg.eigvalsh(joint.T @ joint))  # Eckart-Young: the D - A smallest
    np.testing.assert_allclose(err, np.sqrt(sigma2[: D - A].sum()), rtol=1e-3)
    # the shared RoPE key is the mean of the heads' kept rows
    np.testing.assert_allclose(dst.kv_a_proj[...][A:], k[:, kept_dims(H, P)].mean(0), rtol=1e-5)
    q = np.asarray(src.q_proj[...]).reshape(N, H, D)
    np.testing.assert_array_equal(np.asarray(dst.q_proj[...]).reshape(N, H, D)[:, H - P :],
                                  q[:, kept_dims(H, P)])  # fmt: skip
    np.testing.assert_array_equal(dst.o_proj[...], src.o_proj[...])
    np.testing.assert_array_equal(mla.layers[0].mlp.down[...], model.layers[0].mlp.down[...])
    tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, 97, jnp.int32)
    assert np.isfinite(np.asarray(mla(tokens))).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kv_lora_rank": 20, "rope_dim": 3}, "rope_dim=3 must be an even integer"),
        ({"kv_lora_rank": 20, "rope_dim": 8}, "rope_dim=8 must be an even integer in 2 .. "),
        ({"kv_lora_rank": 0, "rope_dim": 4}, "kv_lora_rank=0 must be in 1 .. 40"),
        ({"kv_lora_rank": 41, "rope_dim": 4}, r"kv_lora_rank=41 must be in 1 .. 40 .*d_model=40"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(KvjaxError, match=match):
        convert_to_mla(source("tiny-mha"), **kwargs)


def test_unsupported_sources_are_refused_by_name():
    mla = Transformer(get_model_config("tiny-mla"), rngs=nnx.Rngs(0))
    with pytest.raises(KvjaxError, match="already MLA"):
        convert_to_mla(mla, 8, 4)
    cfg = get_model_config("tiny-mha", qkv_bias=True)
    with pytest.raises(KvjaxError, match="qkv_bias=True is not supported by the MHA -> MLA"):
        convert_to_mla(Transformer(cfg, rngs=nnx.Rngs(0)), 8, 4)
    hybrid = get_model_config("tiny-qwen3-next")  # linear-attention layers beside attention
    with pytest.raises(KvjaxError, match="layer_kinds=.* is not supported by the MHA -> MLA"):
        check_conversion(hybrid, 8, 4)


def test_partial_rope_steps_are_the_conversions_first():
    model = source("tiny-gqa")
    tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, 97, jnp.int32)
    before = np.asarray(model(tokens))
    # RoPE kept on 6 of 8 dims (3 of 4 frequencies): a copy that attends differently
    partial = partial_rope(model, 6)
    np.testing.assert_array_equal(np.asarray(model(tokens)), before)  # the source unchanged
    assert not np.allclose(np.asarray(partial(tokens)), before, atol=1e-4)
    # the partial-RoPE scores are the reference's (dropped frequencies at 0)
    x = jax.random.normal(jax.random.key(1), (1, 4, 40))
    pos = jnp.arange(4)[None]
    attn = partial.layers[0].attn
    q = (x @ attn.q_proj[...].T).reshape(1, 4, 12, 8)
    k = jnp.repeat((x @ attn.k_proj[...].T).reshape(1, 4, 3, 8), 4, axis=2)
    cos, sin = rope_tables(pos, 8, **attn.rope)
    want, _ = partial_rope_mha(model, x, pos, rope_dim=6)
    got = jnp.einsum("BTNH,BSNH->BNTS", apply_rope(q, cos, sin), apply_rope(k, cos, sin))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the shared key: each KV head's kept rows their mean; the other rows unchanged
    shared = partial_rope(model, 4, shared_key=True).layers[1].attn.k_proj[...].reshape(3, 8, 40)
    k = model.layers[1].attn.k_proj[...].reshape(3, 8, 40)
    kept = kept_dims(8, 4)
    np.testing.assert_allclose(shared[:, kept], np.broadcast_to(k[:, kept].mean(0), (3, 4, 40)),
                               rtol=1e-6)  # fmt: skip
    others = np.setdiff1d(np.arange(8), kept)
    np.testing.assert_array_equal(shared[:, others], k[:, others])


def test_conversion_stages_benchmark_runs_small(tmp_path):
    from experiments.benchmarks.mla_conversion import stages

    config = tmp_path / "c.yaml"
    config.write_text("""experiment: gqa_uptrain
model: {preset: tiny-gqa, num_layers: 1, d_model: 32, num_heads: 4, num_kv_heads: 4,
        head_dim: 8, d_ff: 48, vocab_size: 256}
options: {task: stdlib, steps: 2, batch_size: 2, seq_len: 16, eval_every: 2, eval_batches: 1,
          warmup_steps: 1, max_bytes: 65536, kv_heads: [2], mla_ranks: [30], mla_rope_dim: 2}
sweep: {options.seed: [0, 1]}
""")
    rows = stages(1, config)
    assert [r["stage"] for r in rows] == [
        "MHA", "partial RoPE (2 dims)", "+ one shared RoPE key", "+ latent norm, MLA-32",
        "+ latent norm, MLA-30", "GQA-2 (mean-pooled)",
    ]  # fmt: skip
    by = {r["stage"]: r for r in rows}
    assert by["+ latent norm, MLA-30"]["kv_bytes_per_token"] == by["GQA-2 (mean-pooled)"][
        "kv_bytes_per_token"] == 1 * 32 * 4  # fmt: skip
    assert all(r["seed"] == 1 and np.isfinite(r["val_loss"]) for r in rows)
