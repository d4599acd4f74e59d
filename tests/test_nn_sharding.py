"""The tensor-parallel model on 8 simulated CPU devices (tests/conftest.py): same logits as the
unsharded model, per-device KV cache and weights of the real arrays equal to the closed form of
kvjax.analytic.parallel, traced per-device FLOPs and collectives equal to it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kvjax import KvjaxError, get_model_config
from kvjax.analytic.parallel import (
    kv_cache_bytes_per_device,
    kv_heads_per_device,
    weight_bytes_per_device,
)
from kvjax.nn import CompiledSteps, Transformer
from kvjax.nn import sharding as sh

# every dimension its own size, and divisible by 8: N=16, H=6, D=40, F=56, V=104, L=2
VARIANTS = {"mha": 16, "gqa": 4, "mqa": 1}
TPS = (1, 2, 4, 8)


def tiny(num_kv_heads: int, **changes):
    base = dict(num_heads=16, num_kv_heads=num_kv_heads, head_dim=6, d_ff=56, vocab_size=104)
    return get_model_config("tiny-gqa", **(base | changes)).replace(name=f"tp-k{num_kv_heads}")


def run_both(cfg, tp, dp=1, B=4, T=5, steps=3, max_len=11, expert_parallel=False):
    """Prefill and greedy decode steps, unsharded and sharded: logits of both, sharded cache."""
    model = Transformer(cfg, rngs=nnx.Rngs(7))
    toks = jax.random.randint(jax.random.key(3), (B, T), 0, cfg.vocab_size)
    lengths = jnp.array(([T, T - 2, T, 1] * 2)[:B], jnp.int32)
    ref_steps = CompiledSteps(model)
    cache = model.init_cache(B, max_len)
    ref, cache = ref_steps.prefill(ref_steps.state, toks, cache, lengths)
    ref_logits = [ref]
    mesh = sh.make_mesh(cfg, tp, dp)
    sharded = sh.shard_model(model, mesh, expert_parallel=expert_parallel)
    with jax.set_mesh(mesh):
        s_steps = CompiledSteps(sharded)
        s_cache = sh.init_cache(sharded, B, max_len, mesh)
        out, s_cache = s_steps.prefill(s_steps.state, toks, s_cache, lengths)
        got_logits = [out]
        nxt = jnp.argmax(ref[jnp.arange(B), lengths - 1], -1).astype(jnp.int32)
        for _ in range(steps):
            r, cache = ref_steps.decode(nxt, cache)
            g, s_cache = s_steps.decode(nxt, s_cache)
            ref_logits.append(r)
            got_logits.append(g)
            nxt = jnp.argmax(r, -1).astype(jnp.int32)
    return ref_logits, got_logits, s_cache, sharded


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_sharded_logits_equal_unsharded(devices, variant, tp):
    cfg = tiny(VARIANTS[variant])
    ref, got, cache, sharded = run_both(cfg, tp)
    for r, g in zip(ref, got, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=2e-5, rtol=1e-5)
    # the real arrays hold the closed form's bytes on every device, replication included
    B, S = cache.batch_size, cache.max_len
    kv = bytes_per_device((cache.k, cache.v))
    assert len(kv) == tp
    assert set(kv.values()) == {kv_cache_bytes_per_device(cfg, tp, S, B)}
    w = bytes_per_device(nnx.state(sharded, nnx.Param))
    assert set(w.values()) == {weight_bytes_per_device(cfg, tp)}
    # each KV head sits on tp / K devices when tp > K, on one device otherwise
    K = cfg.num_kv_heads
    heads = [range(*s.index[1].indices(K)) for s in cache.k[0].addressable_shards]
    assert all(len(h) == kv_heads_per_device(cfg, tp) for h in heads)
    copies = [sum(k in h for h in heads) for k in range(K)]
    assert copies == [max(1, tp // K)] * K


def test_other_architectures_shard_too(devices):
    # plain (ungated) GELU MLP, q/k/v biases, tied embeddings: the other parameter specs
    cfg = tiny(4, gated_mlp=False, mlp_activation="gelu", qkv_bias=True, tied_embeddings=True)
    ref, got, _, _ = run_both(cfg, 8, steps=2)
    for r, g in zip(ref, got, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=2e-5, rtol=1e-5)


def test_data_and_tensor_parallel(devices):
    cfg = tiny(4)
    ref, got, cache, _ = run_both(cfg, tp=4, dp=2)
    for r, g in zip(ref, got, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=2e-5, rtol=1e-5)
    kv = bytes_per_device((cache.k, cache.v))
    assert set(kv.values()) == {kv_cache_bytes_per_device(cfg, 4, cache.max_len, 4 // 2)}


def bytes_per_device(tree) -> dict:
    """Bytes of every addressable shard of every array in `tree`, summed per device."""
    out: dict = {}
    for leaf in jax.tree_util.tree_leaves(tree):
        for shard in leaf.addressable_shards:
            out[shard.device] = out.get(shard.device, 0) + shard.data.nbytes
    return out


def unshard_gate_up(w_EF: np.ndarray | jax.Array, blocks: int) -> jax.Array:
    """The inverse of the row reordering: [gate; up] again."""
    two_f, d = w_EF.shape
    f = two_f // 2
    return (
        jnp.asarray(w_EF).reshape(blocks, 2, f // blocks, d).transpose(1, 0, 2, 3).reshape(two_f, d)
    )


def test_gate_up_row_order_round_trips():
    w = jnp.arange(2 * 8 * 3.0).reshape(16, 3)
    for blocks in (1, 2, 4, 8):
        mixed = sh._interleave_gate_up(w, blocks)
        np.testing.assert_array_equal(unshard_gate_up(mixed, blocks), w)
    # 2 blocks of F=8: [gate rows 0-3; up rows 8-11; gate rows 4-7; up rows 12-15]
    order = sh._interleave_gate_up(jnp.arange(16.0)[:, None], 2)[:, 0]
    np.testing.assert_array_equal(order, [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15])


def test_mesh_shapes():
    cfg = get_model_config("llama-2-70b")  # N=64, K=8
    assert sh.mesh_shape(cfg, 4) == (1, 4, 1)
    assert sh.mesh_shape(cfg, 8) == (1, 8, 1)
    assert sh.mesh_shape(cfg, 32, dp=2) == (2, 8, 4)  # each KV head on 4 devices


@pytest.mark.parametrize(
    "changes,tp,message",
    [
        ({}, 3, "tp=3 does not divide num_heads=16"),
        ({"num_kv_heads": 4, "num_heads": 24}, 6, "num_kv_heads=4 do not divide one another"),
        ({"vocab_size": 97}, 8, "tp=8 does not divide vocab_size=97; the sharded model allows"),
        ({}, 0, "tp=0 must be a positive integer"),
    ],
)
def test_mesh_errors_name_field_and_allowed(changes, tp, message):
    cfg = tiny(changes.pop("num_kv_heads", 4), **changes)
    with pytest.raises(KvjaxError, match=message):
        sh.make_mesh(cfg, tp)


def test_too_few_devices_says_how_many_and_how(devices):
    with pytest.raises(KvjaxError, match="needs 8 devices; jax sees 2.*device_count=8"):
        sh.make_mesh(tiny(4), 4, dp=2, devices=devices[:2])


def test_cache_batch_must_divide_over_data_axis(devices):
    cfg = tiny(4)
    mesh = sh.make_mesh(cfg, 4, dp=2)
    model = sh.shard_model(Transformer(cfg, rngs=nnx.Rngs(0)), mesh)
    with pytest.raises(KvjaxError, match="batch_size=3 is not divisible by dp=2"):
        sh.init_cache(model, 3, 8, mesh)


def test_shard_model_leaves_the_callers_model_alone(devices):
    cfg = tiny(4)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    before = np.asarray(model.layers[0].mlp.gate_up[...])
    sharded = sh.shard_model(model, sh.make_mesh(cfg, 4))
    np.testing.assert_array_equal(np.asarray(model.layers[0].mlp.gate_up[...]), before)
    assert model.layers[0].mlp.gate_up_blocks == 1 and sharded.layers[0].mlp.gate_up_blocks == 4
    np.testing.assert_array_equal(
        unshard_gate_up(np.asarray(sharded.layers[0].mlp.gate_up[...]), 4), before
    )


def test_generate_with_a_sharded_model(devices):
    from kvjax.nn import generate

    cfg = tiny(4)
    model = Transformer(cfg, rngs=nnx.Rngs(5))
    prompt = jax.random.randint(jax.random.key(2), (2, 6), 0, cfg.vocab_size)
    lengths = jnp.array([6, 3], jnp.int32)
    want = generate(model, prompt, 5, lengths_B=lengths)
    sharded = sh.shard_model(model, sh.make_mesh(cfg, 8))
    assert sh.model_mesh(sharded) is not None and sh.model_mesh(model) is None
    np.testing.assert_array_equal(generate(sharded, prompt, 5, lengths_B=lengths), want)
