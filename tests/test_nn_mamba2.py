"""kvjax.nn.mamba2 (Falcon-H1's Mamba-2 mixer, layer kind "H"): parity with transformers'
FalconH1Mixer in f32 (prefill over whole and partial chunks, T = 1, right-padded batches: outputs,
conv cache and state), cached decode against the uncached forward, and the trace of every kernel
against the closed form (`kvjax.analytic.hybrid.mixer_kernels`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from support import require_module

from kvjax import kernels
from kvjax.analytic.costs import Workload
from kvjax.analytic.hybrid import conv_channels, mixer_kernels
from kvjax.model.config import ModelConfig
from kvjax.nn.layers import act_dtype
from kvjax.nn.mamba2 import Mamba2
from kvjax.traced.hlo import attribute

# every dimension distinct: D 20, J 4 heads in Y 2 groups, P 6, N 5, conv 4, chunks of 8
D, J, Y, P, N, W, Z = 20, 4, 2, 6, 5, 4, 8
# the output gate: y * silu(z); with state_norm (mamba_rms_norm) HF's FalconH1RMSNormGated after
# the gate (mamba_norm_before_gate=False, Falcon-H1's checkpoints) or before it (HF's default)
VARIANTS = {"gate": (False, False), "gate_then_norm": (True, False), "norm_then_gate": (True, True)}
variants = pytest.mark.parametrize("variant", list(VARIANTS))


@nnx.jit
def prefill(mixer, x, valid=None):
    return mixer(x, valid)


@nnx.jit
def step(mixer, x, conv, state):
    return mixer.step(x, conv, state)


def config(state_norm: bool, **change) -> ModelConfig:
    fields = dict(num_layers=1, d_model=D, num_heads=2, num_kv_heads=1, head_dim=8, d_ff=16,
                  vocab_size=32, weight_dtype="f32", kv_dtype="f32", layer_kinds="H",
                  state_heads=J, state_groups=Y, state_key_dim=N, state_value_dim=P,
                  conv_kernel=W, conv_bias=True, state_norm=state_norm, scan_chunk=Z,
                  norm_eps=1e-5)  # fmt: skip
    return ModelConfig(**{**fields, **change})


def hf_pair(variant: str, seed: int = 0):
    """HF's FalconH1Mixer (random weights, muP multipliers 1) and kvjax's Mamba2 holding them."""
    state_norm, before = VARIANTS[variant]
    torch = require_module("torch")
    transformers = require_module("transformers")
    from transformers.models.falcon_h1 import modeling_falcon_h1 as hf

    hf_cfg = transformers.FalconH1Config(
        hidden_size=D, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=8, intermediate_size=16, vocab_size=32, mamba_d_ssm=J * P, mamba_n_heads=J,
        mamba_d_head=P, mamba_n_groups=Y, mamba_d_state=N, mamba_d_conv=W, mamba_chunk_size=Z,
        mamba_rms_norm=state_norm, mamba_norm_before_gate=before, rms_norm_eps=1e-5,
        ssm_multipliers=[1.0] * 5, ssm_in_multiplier=1.0, ssm_out_multiplier=1.0,
    )  # fmt: skip
    assert hf_cfg.time_step_limit == (0.0, float("inf"))  # what kvjax's clamp assumes
    torch.manual_seed(seed)
    ref = hf.FalconH1Mixer(hf_cfg, 0).float().eval()
    mup = hf.compute_mup_vector(hf_cfg)  # FalconH1Model registers it; all ones here
    assert torch.equal(mup, torch.ones_like(mup))
    ref.register_buffer("mup_vector", mup, persistent=False)
    X = J * P + 2 * Y * N
    with torch.no_grad():
        ref.in_proj.weight.copy_(torch.randn(J * P + X + J, D) / D**0.5)
        ref.conv1d.weight.copy_(torch.randn(X, 1, W) * 0.5)
        ref.conv1d.bias.copy_(torch.randn(X) * 0.1)
        ref.dt_bias.copy_(torch.randn(J) - 1.0)
        ref.A_log.copy_(torch.log(torch.rand(J) * 2 + 0.5))
        ref.D.copy_(torch.randn(J))
        ref.out_proj.weight.copy_(torch.randn(D, J * P) / (J * P) ** 0.5)
        if state_norm:
            ref.norm.weight.copy_(1 + 0.1 * torch.randn(J * P))
    mixer = Mamba2(config(state_norm, state_norm_before_gate=before), rngs=nnx.Rngs(0))

    def put(p, t):
        p[...] = jnp.asarray(t.detach().numpy())

    put(mixer.ssm_in_proj, ref.in_proj.weight)
    put(mixer.ssm_conv, ref.conv1d.weight[:, 0])
    put(mixer.ssm_conv_bias, ref.conv1d.bias)
    put(mixer.ssm_dt_bias, ref.dt_bias)
    put(mixer.ssm_A_log, ref.A_log)
    put(mixer.ssm_D, ref.D)
    put(mixer.ssm_out_proj, ref.out_proj.weight)
    if state_norm:
        put(mixer.ssm_norm, ref.norm.weight)
    return torch, hf_cfg, ref, mixer


def hf_prefill(torch, hf_cfg, ref, x):
    """HF's output, conv cache (its last W - 1 rows, [B, W - 1, X]) and state after `x`."""
    cache = transformers_cache(hf_cfg)
    with torch.no_grad():
        y = ref(torch.tensor(x), cache=cache).numpy()
    conv = cache.get_conv_state(0).numpy()[:, :, 1:].transpose(0, 2, 1)
    return y, conv, cache.get_recurrent_state(0).numpy()


def transformers_cache(hf_cfg):
    from transformers import DynamicCache

    return DynamicCache(config=hf_cfg)


def close(got, want, atol=2e-5):
    np.testing.assert_allclose(np.asarray(got), want, atol=atol, rtol=0)


# Every prefill below is [3, T] with a validity mask (one compile a variant): T = 19, two whole
# chunks of 8 and 3 tokens
T = 19


def mask(lengths) -> np.ndarray:
    return np.arange(T)[None, :] < np.asarray(lengths)[:, None]


@variants
def test_prefill_matches_hf(variant):
    """T = 19 (all valid) and, for the plain gate, T = 1 (no mask): output, conv cache, state."""
    torch, hf_cfg, ref, mixer = hf_pair(variant)
    rng = np.random.default_rng(1)
    cases = [(T, jnp.asarray(mask((T,) * 3)))] + ([(1, None)] if variant == "gate" else [])
    for n, valid in cases:
        x = rng.standard_normal((3, n, D)).astype(np.float32)
        y, conv, state = prefill(mixer, jnp.asarray(x), valid)
        want_y, want_conv, want_state = hf_prefill(torch, hf_cfg, ref, x)
        assert 0.01 < np.abs(want_y).max() < 30  # values of a size where atol means something
        close(y, want_y)
        close(conv, want_conv)
        close(state, want_state)
        assert state.dtype == jnp.float32 and state.shape == (3, J, P, N)
        assert conv.shape == (3, W - 1, J * P + 2 * Y * N)


@variants
def test_padded_batch_matches_each_sequence(variant):
    """Right-padded lengths 19, 2 (shorter than the conv) and 8 (one whole chunk): each row's
    valid outputs, conv cache and state are HF's on that sequence alone."""
    torch, hf_cfg, ref, mixer = hf_pair(variant, seed=2)
    lengths = (19, 2, 8)
    x = np.random.default_rng(3).standard_normal((3, T, D)).astype(np.float32)
    valid = mask(lengths)
    padded = jnp.asarray(np.where(valid[..., None], x, 7.0))
    y, conv, state = prefill(mixer, padded, jnp.asarray(valid))
    for b, n in enumerate(lengths):
        want_y, want_conv, want_state = hf_prefill(torch, hf_cfg, ref, x[b : b + 1, :n])
        close(y[b : b + 1, :n], want_y)
        close(conv[b : b + 1], want_conv)
        close(state[b : b + 1], want_state)


@variants
def test_decode_step_matches_hf(variant):
    torch, hf_cfg, ref, mixer = hf_pair(variant, seed=4)
    x = np.random.default_rng(5).standard_normal((3, T + 3, D)).astype(np.float32)
    cache = transformers_cache(hf_cfg)
    with torch.no_grad():
        ref(torch.tensor(x[:, :T]), cache=cache)
        want = [ref(torch.tensor(x[:, t : t + 1]), cache=cache).numpy() for t in range(T, T + 3)]
    _, conv, state = prefill(mixer, jnp.asarray(x[:, :T]), jnp.asarray(mask((T,) * 3)))
    for t in range(T, T + 3):
        y, conv, state = step(mixer, jnp.asarray(x[:, t : t + 1]), conv, state)
        close(y, want[t - T])
    close(state, cache.get_recurrent_state(0).numpy())


@pytest.mark.parametrize("variant", ["gate", "gate_then_norm"])  # the order changes no caching
def test_cached_decode_equals_uncached_forward(variant):
    """A right-padded prefill (lengths 9, 3, 14) then 5 steps from each sequence's own length
    give the uncached forward's outputs over the whole sequences, to f32 rounding."""
    state_norm, before = VARIANTS[variant]
    mixer = Mamba2(config(state_norm, state_norm_before_gate=before), rngs=nnx.Rngs(6))
    lengths, steps = np.array([9, 3, 14]), 5
    x = np.random.default_rng(7).standard_normal((3, T, D)).astype(np.float32)
    everything = jnp.asarray(mask((T,) * 3))
    want, _, want_state = (np.asarray(a) for a in prefill(mixer, jnp.asarray(x), everything))
    _, conv, state = prefill(mixer, jnp.asarray(x), jnp.asarray(mask(lengths)))
    rows = np.arange(3)
    for i in range(steps):
        y, conv, state = step(mixer, jnp.asarray(x[rows, lengths + i][:, None]), conv, state)
        close(y[:, 0], want[rows, lengths + i], atol=1e-5)
    close(state[2], want_state[2], atol=1e-5)  # the longest row has now seen every token


def _traced(cfg, phase, B, length, masked=False):
    """Per-kernel costs of the mixer lowered alone inside layer0 (prefill of `length` tokens, a
    validity mask with `masked`; or a decode step)."""
    graph, params = nnx.split(Mamba2(cfg, rngs=nnx.Rngs(0)))
    a = act_dtype(cfg)
    if phase == "prefill":

        def f(params, x, valid):
            with jax.named_scope("layer0"):
                return nnx.merge(graph, params)(x, valid)

        args = (jnp.zeros((B, length, D), a), jnp.ones((B, length), bool) if masked else None)
    else:

        def f(params, x, conv, state):
            with jax.named_scope("layer0"):
                return nnx.merge(graph, params).step(x, conv, state)

        X = conv_channels(cfg, "H")
        args = (jnp.zeros((B, 1, D), a), jnp.zeros((B, W - 1, X), a), jnp.zeros((B, J, P, N)))
    text = jax.jit(f).lower(params, *args).as_text(dialect="hlo", debug_info=True)
    names = tuple(k.name for k in mixer_kernels(cfg, Workload(phase, B, length), "H"))
    per_kernel, _ = attribute(text, names)
    return per_kernel


@pytest.mark.parametrize(
    ("phase", "B", "T"),
    [("prefill", 2, 19), ("prefill", 3, 8), ("decode", 2, 30), ("decode", 3, 9)],
)
@pytest.mark.parametrize("state_norm", [False, True], ids=["gate", "gated_norm"])
def test_trace_matches_closed_form(phase, B, T, state_norm):
    cfg = config(state_norm)
    per_kernel = _traced(cfg, phase, B, T)
    closed = mixer_kernels(cfg, Workload(phase, B, T), "H")
    assert [k.name for k in closed] == [
        kernels.SSM_IN_PROJ, kernels.SSM_CONV, kernels.SSM_DT, kernels.SSM_SCAN,
        kernels.SSM_NORM, kernels.SSM_OUT_PROJ,
    ]  # fmt: skip
    for k in closed:
        traced = per_kernel[(0, k.name)]
        assert traced.flops == pytest.approx(k.flops, rel=0.01), k.name
        assert traced.transcendentals == pytest.approx(k.transcendentals, rel=0.01), k.name
    assert (
        per_kernel.get((0, kernels.OTHER), None) is None or not per_kernel[(0, kernels.OTHER)].flops
    )


def test_trace_with_a_mask_matches_closed_form():
    """The padding's bookkeeping (lengths, the clamp's bound, the conv cache's rows) lies outside
    the kernels; a masked prefill's kernels cost what an unmasked one's do."""
    cfg = config(False)
    per_kernel = _traced(cfg, "prefill", 2, 19, masked=True)
    for k in mixer_kernels(cfg, Workload("prefill", 2, 19), "H"):
        assert per_kernel[(0, k.name)].flops == k.flops, k.name
        assert per_kernel[(0, k.name)].transcendentals == k.transcendentals, k.name


def test_trace_bf16_counts_the_f32_conversions():
    """A 2-byte model: the dt, scan and gate run in f32, their conversions counted exactly."""
    cfg = config(True, weight_dtype="bf16", kv_dtype="bf16")
    for phase, B, T in (("prefill", 2, 19), ("decode", 2, 30)):
        per_kernel = _traced(cfg, phase, B, T)
        for k in mixer_kernels(cfg, Workload(phase, B, T), "H"):
            assert per_kernel[(0, k.name)].flops == k.flops, (phase, k.name)
