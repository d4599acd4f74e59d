"""Parity with Hugging Face transformers' LlamaForCausalLM on a tiny random GQA checkpoint that
the test builds and saves itself (nothing is downloaded)."""

import jax.numpy as jnp
import numpy as np
import pytest
from support import require_module

torch = require_module("torch")
transformers = require_module("transformers")

from kvjax import KvjaxError  # noqa: E402
from kvjax.nn import load_hf_llama  # noqa: E402


def save_tiny_llama(folder, tie=False, family="llama", **changes):
    torch.manual_seed(0)
    kwargs = dict(
        vocab_size=97,
        hidden_size=48,  # 48 / 12 heads = 4, while head_dim = 8
        intermediate_size=56,
        num_hidden_layers=2,
        num_attention_heads=12,
        num_key_value_heads=3,
        head_dim=8,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    kwargs.update(changes)
    if family == "mistral":
        config = transformers.MistralConfig(**kwargs)
        model = transformers.MistralForCausalLM(config).float().eval()
    elif family == "qwen2":  # biases on q, k, v; no head_dim key
        kwargs.pop("head_dim")
        config = transformers.Qwen2Config(**kwargs)
        model = transformers.Qwen2ForCausalLM(config).float().eval()
    else:
        config = transformers.LlamaConfig(attention_bias=False, **kwargs)
        model = transformers.LlamaForCausalLM(config).float().eval()
    with torch.no_grad():  # norms away from 1 so a misplaced norm weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    return model


@pytest.mark.parametrize("tie", [False, True])
def test_logits_match_transformers(tmp_path, tie):
    ref = save_tiny_llama(tmp_path, tie=tie)
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    assert model.cfg.num_kv_heads == 3 and model.cfg.head_dim == 8
    toks = np.random.default_rng(0).integers(0, 97, size=(2, 11))
    with torch.no_grad():
        want = ref(torch.tensor(toks)).logits.numpy()
    got = np.asarray(model(toks.astype(np.int32)))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_missing_tensor_is_named(tmp_path):
    save_tiny_llama(tmp_path)
    from safetensors.numpy import load_file, save_file

    path = next(tmp_path.glob("*.safetensors"))
    tensors = load_file(str(path))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(path))
    with pytest.raises(KvjaxError, match="missing tensor 'model.layers.1.mlp.down_proj.weight'"):
        load_hf_llama(tmp_path)


def test_qwen2_with_qkv_bias_matches_transformers(tmp_path):
    ref = save_tiny_llama(tmp_path, family="qwen2")
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    assert model.cfg.qkv_bias and model.cfg.head_dim == 4
    toks = np.random.default_rng(1).integers(0, 97, size=(2, 9))
    with torch.no_grad():
        want = ref(torch.tensor(toks)).logits.numpy()
    np.testing.assert_allclose(model(toks.astype(np.int32)), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("window", [4, 6])
def test_mistral_sliding_window_matches_transformers(tmp_path, window):
    """A window shorter than the sequence: the banded prefill, the rolling cache in decode (and a
    prefill longer than the window, which fills the rolling buffer) all match Hugging Face."""
    ref = save_tiny_llama(tmp_path, family="mistral", sliding_window=window)
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    assert model.cfg.sliding_window == window and model.cfg.layer_pattern == "L"
    toks = np.random.default_rng(1).integers(0, 97, size=(2, 13))
    with torch.no_grad():
        want = ref(torch.tensor(toks)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(toks))), want, atol=2e-4)
    for prefix in (3, 8):  # shorter and longer than the window
        cache = model.init_cache(2, 16)
        logits, cache = model.prefill(jnp.asarray(toks[:, :prefix]), cache)
        got = [np.asarray(logits)]
        for t in range(prefix, 13):
            step, cache = model.decode(jnp.asarray(toks[:, t]), cache)
            got.append(np.asarray(step)[:, None])
        np.testing.assert_allclose(np.concatenate(got, axis=1), want, atol=2e-4)
        assert {x.shape[-1] for x in cache.k} == {window}  # a rolling buffer of the window
    # and the window matters: the same weights attending everything differ
    full = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32", sliding_window=0,
                         layer_pattern="G")  # fmt: skip
    assert np.abs(np.asarray(full(jnp.asarray(toks))) - want).max() > 1e-2


@pytest.mark.parametrize("window,sinks", [(4, 2), (3, 1)])
def test_sink_tokens_beside_a_window_match_a_masked_transformers_forward(tmp_path, window, sinks):
    """StreamingLLM's eviction (sinks + recent window, positions as the original tokens'): the
    banded forward, and prefill + decode through the rolling cache of s + W slots, against
    Hugging Face's LlamaForCausalLM given the same mask as a custom 4D attention mask
    (query i sees key j <= i when i - j < W or j < s)."""
    ref = save_tiny_llama(tmp_path)
    ref.config._attn_implementation = "eager"
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32", sliding_window=window,
                          layer_pattern="L", sink_tokens=sinks)  # fmt: skip
    toks = np.random.default_rng(2).integers(0, 97, size=(2, 13))
    i, j = np.arange(13)[:, None], np.arange(13)[None, :]
    allowed = (j <= i) & ((i - j < window) | (j < sinks))
    mask = torch.where(torch.tensor(allowed), 0.0, torch.finfo(torch.float32).min)
    with torch.no_grad():
        want = ref(torch.tensor(toks), attention_mask=mask[None, None].expand(2, 1, 13, 13)).logits
    want = want.numpy()
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(toks))), want, atol=2e-4)
    for prefix in (2, 9):  # inside the sinks + window, and past it (the gathered ring)
        cache = model.init_cache(2, 16)
        logits, cache = model.prefill(jnp.asarray(toks[:, :prefix]), cache)
        got = [np.asarray(logits)]
        for t in range(prefix, 13):
            step, cache = model.decode(jnp.asarray(toks[:, t]), cache)
            got.append(np.asarray(step)[:, None])
        np.testing.assert_allclose(np.concatenate(got, axis=1), want, atol=2e-4)
        assert {x.shape[-1] for x in cache.k} == {window + sinks}
    plain = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32", sliding_window=window,
                          layer_pattern="L")  # fmt: skip
    assert np.abs(np.asarray(plain(jnp.asarray(toks))) - want).max() > 1e-2  # the sinks matter
