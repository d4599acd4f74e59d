"""Parity with Hugging Face's Gemma 3 (text), Gemma 2, Gemma and Qwen3 on tiny random checkpoints
the tests build and save (nothing downloaded): (1 + w) norms, the sqrt(D) embedding scale,
sandwich norms, q/k norms, query_pre_attn_scalar, local layers' own RoPE base, linear RoPE
scaling of the global layers, attention and final logit soft-capping, sliding windows."""

import jax.numpy as jnp
import numpy as np
import pytest
from support import check_hf_parity as check_parity
from support import require_module

torch = require_module("torch")
transformers = require_module("transformers")

from kvjax.nn import load_hf_llama  # noqa: E402

SIZES = dict(vocab_size=97, hidden_size=48, intermediate_size=56, num_hidden_layers=3,
             num_attention_heads=12, num_key_value_heads=3, head_dim=8, rms_norm_eps=1e-6,
             max_position_embeddings=64)  # fmt: skip


def save(folder, family: str, **changes):
    torch.manual_seed(0)
    kwargs = {**SIZES, **changes}
    if family == "gemma3":
        config = transformers.Gemma3TextConfig(**kwargs)
        model = transformers.Gemma3ForCausalLM(config)
    elif family == "gemma2":
        config = transformers.Gemma2Config(**kwargs)
        model = transformers.Gemma2ForCausalLM(config)
    elif family == "gemma":
        config = transformers.GemmaConfig(**kwargs)
        model = transformers.GemmaForCausalLM(config)
    else:
        config = transformers.Qwen3Config(**kwargs)
        model = transformers.Qwen3ForCausalLM(config)
    model = model.float().eval()
    with torch.no_grad():  # norms away from their identity so a misplaced one shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((0.0 if family.startswith("gemma") else 1.0) + 0.3 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    return model


GEMMA3_ROPE = {
    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 50000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
}


def test_gemma3_text_matches_transformers(tmp_path):
    """Two local layers (window 4 < 13 tokens) then a global one; every Gemma 3 detail on."""
    ref = save(tmp_path, "gemma3", sliding_window=4, query_pre_attn_scalar=6,
               layer_types=["sliding_attention", "sliding_attention", "full_attention"],
               rope_parameters=GEMMA3_ROPE)  # fmt: skip
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    cfg = model.cfg
    assert (cfg.layer_pattern, cfg.sliding_window, cfg.query_pre_attn_scalar) == ("LLG", 4, 6.0)
    assert cfg.norm_plus_one and cfg.scale_embeddings and cfg.sandwich_norms and cfg.qk_norm
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.rope_linear_factor) == (5e4, 100.0, 4.0)
    toks = np.random.default_rng(0).integers(0, 97, size=(2, 13))
    want = check_parity(model, ref, toks)
    # each detail matters: switching one off moves the logits
    changes = [
        {"rope_local_theta": 0.0},
        {"rope_linear_factor": 1.0},
        {"query_pre_attn_scalar": 0.0},
        {"sliding_window": 0, "layer_pattern": "G"},
    ]
    for change in changes:
        other = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32", **change)
        assert np.abs(np.asarray(other(jnp.asarray(toks))) - want).max() > 1e-3, change


def test_gemma2_softcapping_matches_transformers(tmp_path):
    """Gemma 2: alternating local (first) / global layers, attention and final soft-caps; caps
    small enough here to bind."""
    ref = save(tmp_path, "gemma2", sliding_window=5, query_pre_attn_scalar=10,
               attn_logit_softcapping=0.05, final_logit_softcapping=0.2,
               attn_implementation="eager")  # fmt: skip
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    cfg = model.cfg
    assert (cfg.layer_pattern, cfg.attn_softcap, cfg.final_softcap) == ("LG", 0.05, 0.2)
    assert cfg.sandwich_norms and not cfg.qk_norm
    toks = np.random.default_rng(1).integers(0, 97, size=(2, 11))
    want = check_parity(model, ref, toks)
    assert np.abs(want).max() <= 0.2  # the final cap bounds the logits
    uncapped = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32", attn_softcap=0.0)
    assert np.abs(np.asarray(uncapped(jnp.asarray(toks))) - want).max() > 1e-4


def test_gemma_and_qwen3_match_transformers(tmp_path):
    """Gemma (1): (1 + w) norms and the embedding scale, no sandwich; Qwen3: q/k norms (Llama
    style) and its own head_dim (8, while 48 / 12 = 4)."""
    ref = save(tmp_path / "gemma", "gemma")
    model = load_hf_llama(tmp_path / "gemma", weight_dtype="f32", kv_dtype="f32")
    assert model.cfg.norm_plus_one and model.cfg.scale_embeddings and not model.cfg.sandwich_norms
    toks = np.random.default_rng(2).integers(0, 97, size=(2, 9))
    check_parity(model, ref, toks, prefixes=(4,))
    ref = save(tmp_path / "qwen3", "qwen3")
    model = load_hf_llama(tmp_path / "qwen3", weight_dtype="f32", kv_dtype="f32")
    assert model.cfg.qk_norm and not model.cfg.norm_plus_one and model.cfg.head_dim == 8
    check_parity(model, ref, toks, prefixes=(4,))


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_unimplemented_rope_scaling_is_refused_by_name(tmp_path, kind):
    save(tmp_path, "qwen3")
    import json

    path = tmp_path / "config.json"
    data = json.loads(path.read_text())
    data["rope_parameters"] = {"rope_type": kind, "factor": 4.0, "rope_theta": 10000.0,
                               "original_max_position_embeddings": 32}  # fmt: skip
    path.write_text(json.dumps(data))
    from kvjax import KvjaxError

    with pytest.raises(KvjaxError, match=f"rope scaling type '{kind}' is not implemented"):
        load_hf_llama(tmp_path)
