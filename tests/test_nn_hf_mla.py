"""Parity of kvjax's MLA decoder with Hugging Face transformers' DeepseekV3ForCausalLM (and V2) on
tiny random checkpoints with dense layers only, built and saved by the test (nothing downloaded):
logits of the uncached forward, and of prefill + decode in both decode forms."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from support import require_module

torch = require_module("torch")
transformers = require_module("transformers")

from kvjax import KvjaxError  # noqa: E402
from kvjax.model.hf import from_hf_config  # noqa: E402
from kvjax.nn import load_hf_llama  # noqa: E402

# Every width distinct: D 40, N 6 heads, U (nope) 10, P (rope) 6, W (value) 7, A (latent) 20,
# Q (query rank) 24, F 56, V 97.
TINY = dict(
    vocab_size=97, hidden_size=40, intermediate_size=56, moe_intermediate_size=8,
    num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=6, kv_lora_rank=20,
    q_lora_rank=24, qk_nope_head_dim=10, qk_rope_head_dim=6, v_head_dim=7, rms_norm_eps=1e-6,
    rope_theta=10000.0, max_position_embeddings=64, first_k_dense_replace=2, n_routed_experts=4,
    num_experts_per_tok=2, n_group=1, topk_group=1,
)  # fmt: skip


def save_tiny_deepseek(folder, family="deepseek_v3", **changes):
    torch.manual_seed(0)
    kwargs = dict(TINY, **changes)
    if family == "deepseek_v2":
        config = transformers.DeepseekV2Config(**kwargs)
        model = transformers.DeepseekV2ForCausalLM(config).float().eval()
    else:
        config = transformers.DeepseekV3Config(**kwargs)
        model = transformers.DeepseekV3ForCausalLM(config).float().eval()
    with torch.no_grad():  # norms away from 1 so a misplaced norm weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    return model


def _reference_logits(ref, toks):
    with torch.no_grad():
        return ref(torch.tensor(toks)).logits.numpy()


CASES = [
    ("deepseek_v3", {}),  # q low rank, interleaved RoPE (V3's default)
    ("deepseek_v3", {"q_lora_rank": None, "rope_interleave": False}),
    ("deepseek_v2", {"q_lora_rank": None, "hidden_size": 48}),  # V2-Lite-like: no q rank
]


@pytest.mark.parametrize("family,changes", CASES)
def test_mla_logits_match_transformers(tmp_path, family, changes):
    ref = save_tiny_deepseek(tmp_path, family, **changes)
    toks = np.random.default_rng(0).integers(0, 97, size=(2, 9))
    want = _reference_logits(ref, toks)
    for form in ("absorbed", "naive"):
        model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32", mla_decode=form)
        assert model.cfg.is_mla and model.cfg.head_dim == 16 and model.cfg.v_head_dim == 7
        assert model.cfg.q_lora_rank == (0 if changes.get("q_lora_rank", 24) is None else 24)
        np.testing.assert_allclose(np.asarray(model(jnp.asarray(toks))), want, atol=2e-4)
        # prefill 5 tokens, decode the other 4: the same logits as Hugging Face's forward
        cache = model.init_cache(2, 12)
        logits, cache = model.prefill(jnp.asarray(toks[:, :5]), cache)
        got = [np.asarray(logits)]
        for t in range(5, 9):
            step, cache = model.decode(jnp.asarray(toks[:, t]), cache)
            got.append(np.asarray(step)[:, None])
        np.testing.assert_allclose(np.concatenate(got, axis=1), want, atol=2e-4)


def test_mla_checkpoint_is_sized_by_the_closed_form(tmp_path):
    from kvjax import analytic

    ref = save_tiny_deepseek(tmp_path)
    cfg = from_hf_config(tmp_path)
    assert analytic.num_params(cfg) == sum(p.numel() for p in ref.parameters())


def test_moe_deepseek_config_imports_its_experts(tmp_path):
    """(MoE parity: tests/test_nn_hf_moe.py.) A layout kvjax does not model is refused by name."""
    ref = save_tiny_deepseek(tmp_path, first_k_dense_replace=1)
    cfg = from_hf_config(tmp_path)
    assert (cfg.num_experts, cfg.first_dense_layers) == (4, 1)
    from kvjax import analytic

    bias = sum(b.numel() for n, b in ref.named_buffers() if "e_score_correction" in n)
    assert analytic.num_params(cfg) == sum(p.numel() for p in ref.parameters()) + bias == 35780
    data = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**data, "moe_layer_freq": 2}))
    with pytest.raises(KvjaxError, match="moe_layer_freq=2: only 1 .every layer. is modelled"):
        from_hf_config(tmp_path)


def test_dynamic_rope_checkpoint_weights_are_refused_but_its_config_imports(tmp_path):
    save_tiny_deepseek(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["rope_scaling"] = {"type": "dynamic", "factor": 4.0}
    data.pop("rope_parameters", None)
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert from_hf_config(tmp_path).kv_lora_rank == 20
    with pytest.raises(KvjaxError, match="rope scaling type 'dynamic' is not implemented"):
        load_hf_llama(tmp_path, weight_dtype="f32")
