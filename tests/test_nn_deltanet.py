"""Gated DeltaNet (kvjax.nn.deltanet, Qwen3-Next's D layers): parity with transformers'
Qwen3NextGatedDeltaNet in f32 (prompts shorter than, and not a multiple of, the 64-token chunk; a
right-padded batch; its cached decode), cached decode == the uncached forward, and the trace of
every kernel against the closed form `kvjax.analytic.hybrid.mixer_kernels(cfg, wl, "D")`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from support import require_module

from kvjax import ModelConfig
from kvjax.analytic import Workload
from kvjax.analytic.hybrid import mixer_kernels
from kvjax.model.hybrid import conv_channels
from kvjax.nn import delta_rule
from kvjax.nn.deltanet import GatedDeltaNet
from kvjax.traced.hlo import attribute

# every dimension distinct: D 44, J 6 value heads, K 2 q/k heads (G 3), d_k 8, d_v 5, w 4
CFG = ModelConfig(
    num_layers=4, d_model=44, num_heads=4, num_kv_heads=2, head_dim=8, d_ff=56, vocab_size=97,
    weight_dtype="f32", kv_dtype="f32", norm_eps=1e-6, layer_kinds="DDDA", state_heads=6,
    state_groups=2, state_key_dim=8, state_value_dim=5, conv_kernel=4,
)  # fmt: skip
X = conv_channels(CFG, "D")


def _x(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def pair():
    """HF's layer with random weights (the decay's A_log and dt_bias spread as in training) and
    kvjax's with the same weights, copied as the loader will: conv1d's [X, 1, w] squeezed."""
    torch = require_module("torch")
    require_module("transformers")
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    hf_cfg = Qwen3NextConfig(
        hidden_size=44, num_hidden_layers=4, linear_num_value_heads=6, linear_num_key_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=5, linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
    )  # fmt: skip
    torch.manual_seed(0)
    ref = Qwen3NextGatedDeltaNet(hf_cfg, layer_idx=0).float().eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        ref.A_log.copy_(torch.log(torch.linspace(0.5, 8.0, 6)))
        ref.dt_bias.copy_(torch.linspace(-2.0, 1.0, 6))
    model = GatedDeltaNet(CFG, rngs=nnx.Rngs(0))
    weights = {
        "in_proj_qkvz": ref.in_proj_qkvz.weight, "in_proj_ba": ref.in_proj_ba.weight,
        "linear_conv": ref.conv1d.weight[:, 0], "dt_bias": ref.dt_bias, "A_log": ref.A_log,
        "linear_norm": ref.norm.weight, "linear_out_proj": ref.out_proj.weight,
    }  # fmt: skip
    for name, w in weights.items():
        getattr(model, name)[...] = jnp.asarray(w.detach().numpy())
    return ref, hf_cfg, Jitted(model)


class Jitted:
    """The module's forward and step under jit (one compile a shape, the tests reuse them)."""

    def __init__(self, model):
        graph, self.params = nnx.split(model)
        self._call = jax.jit(lambda p, x, valid: nnx.merge(graph, p)(x, valid))
        self._step = jax.jit(lambda p, x, conv, state: nnx.merge(graph, p).step(x, conv, state))

    def __call__(self, x_BTD, valid_BT=None):
        return self._call(self.params, x_BTD, valid_BT)

    def step(self, x_B1D, conv_BCX, state_BJHW):
        return self._step(self.params, x_B1D, conv_BCX, state_BJHW)


def _hf(pair, x, steps=()):
    """HF's outputs on prompt x with a cache, then one token at a time: (outputs, conv [B, w-1,
    X] as kvjax keeps it, state)."""
    import torch
    from transformers import DynamicCache

    ref, hf_cfg, _ = pair
    cache = DynamicCache(config=hf_cfg)
    with torch.no_grad():
        outs = [ref(torch.tensor(x), cache=cache).numpy()]
        for s in steps:
            outs.append(ref(torch.tensor(s), cache=cache).numpy())
    conv = cache.get_conv_state(0)[:, :, 1:].transpose(1, 2).numpy()
    return outs, conv, cache.get_recurrent_state(0).numpy()


@pytest.mark.parametrize("T", [1, 70])
def test_prefill_matches_transformers(pair, T):
    x = _x((2, T, 44), T)
    (want,), conv_want, state_want = _hf(pair, x)
    y, conv, state = pair[2](jnp.asarray(x))
    assert np.abs(want).max() > 0.5  # not a degenerate layer
    np.testing.assert_allclose(np.asarray(y), want, atol=1e-4)
    np.testing.assert_allclose(np.asarray(conv), conv_want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(state), state_want, atol=1e-5)
    assert conv.shape == (2, 3, X) and state.dtype == jnp.float32


def test_right_padded_batch_keeps_each_sequences_state(pair):
    lengths, T = (66, 2), 70  # 66: padding in the second chunk; 2: the conv cache half zeros
    x = _x((2, T, 44), 7)
    valid = np.arange(T)[None] < np.array(lengths)[:, None]
    y, conv, state = pair[2](jnp.asarray(x), jnp.asarray(valid))
    for b, n in enumerate(lengths):
        (want,), conv_want, state_want = _hf(pair, x[b : b + 1, :n])
        np.testing.assert_allclose(np.asarray(y[b, :n]), want[0], atol=1e-4)
        np.testing.assert_allclose(np.asarray(conv[b]), conv_want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(state[b]), state_want[0], atol=1e-5)
    assert not np.asarray(conv[1, 0]).any()  # before a 2-token sequence's start: zeros


def test_decode_steps_match_transformers(pair):
    x = _x((2, 1, 44), 11)
    steps = [_x((2, 1, 44), 20 + i) for i in range(3)]
    outs, conv_want, state_want = _hf(pair, x, steps)
    model = pair[2]
    _, conv, state = model(jnp.asarray(x))
    for s, want in zip(steps, outs[1:], strict=True):
        y, conv, state = model.step(jnp.asarray(s), conv, state)
        np.testing.assert_allclose(np.asarray(y), want, atol=1e-4)
    np.testing.assert_allclose(np.asarray(conv), conv_want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(state), state_want, atol=1e-5)


def test_cached_decode_equals_the_uncached_forward(pair):
    """Prefill 66 tokens, then step 4 more (in the second chunk): the forward over all 70."""
    model = pair[2]
    x = jnp.asarray(_x((2, 70, 44), 5))
    full, conv_full, state_full = model(x)
    y, conv, state = model(x[:, :66])
    got = [y]
    for t in range(66, 70):
        y, conv, state = model.step(x[:, t : t + 1], conv, state)
        got.append(y)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(got, 1)), np.asarray(full), atol=2e-5)
    np.testing.assert_allclose(np.asarray(conv), np.asarray(conv_full), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(state), np.asarray(state_full), atol=2e-5)


def test_unit_lower_inverse_by_doubling():
    n = np.random.default_rng(0).standard_normal((3, 64, 64)).astype(np.float32) * 0.3
    inv = np.asarray(jax.jit(delta_rule.unit_lower_inverse)(jnp.asarray(n)))
    unit = np.eye(64, dtype=np.float32) - np.tril(n, -1)
    np.testing.assert_allclose(inv @ unit, np.broadcast_to(np.eye(64), (3, 64, 64)), atol=1e-4)
    assert not np.triu(inv, 1).any()


@pytest.mark.parametrize(
    ("dtype", "phase", "B", "T"),
    [
        ("f32", "prefill", 2, 70),
        ("f32", "prefill", 1, 130),
        ("f32", "decode", 3, 50),
        ("f32", "decode", 1, 9),
        ("bf16", "prefill", 1, 100),
        ("bf16", "decode", 2, 20),
    ],
)
def test_trace_matches_the_closed_form(dtype, phase, B, T):
    """Every kernel's FLOPs and transcendentals, attributed by named scope in the lowered HLO
    (the chunk scan as trip count x body), against mixer_kernels(cfg, wl, "D")."""
    cfg = CFG.replace(weight_dtype=dtype)
    graph, params = nnx.split(GatedDeltaNet(cfg, rngs=nnx.Rngs(0)))
    act = jnp.float32 if dtype == "f32" else jnp.bfloat16
    J, K, V = cfg.state_heads, cfg.state_key_dim, cfg.state_value_dim

    def run(params, *args):
        with jax.named_scope("layer0"):
            module = nnx.merge(graph, params)
            return module(*args) if phase == "prefill" else module.step(*args)

    if phase == "prefill":
        args = (jax.ShapeDtypeStruct((B, T, 44), act),)
    else:
        args = (
            jax.ShapeDtypeStruct((B, 1, 44), act),
            jax.ShapeDtypeStruct((B, 3, X), act),
            jax.ShapeDtypeStruct((B, J, K, V), jnp.float32),
        )
    closed = mixer_kernels(cfg, Workload(phase, B, T), "D")
    names = tuple(k.name for k in closed)
    lowered = jax.jit(run).lower(params, *args)
    per, _ = attribute(lowered.as_text(dialect="hlo", debug_info=True), names)
    for k in closed:
        got = per[(0, k.name)]
        assert got.flops == pytest.approx(k.flops, rel=1e-3), k.name
        assert got.transcendentals == pytest.approx(k.transcendentals, rel=1e-3), k.name
