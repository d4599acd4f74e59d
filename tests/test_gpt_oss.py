"""gpt-oss beyond the family table (tests/test_families.py holds its parity): MXFP4 expert
weights dequantized as transformers' own `convert_moe_packed_tensors` does, an MXFP4 checkpoint
loaded to the same logits as the dequantized Hugging Face model, the closed form's 4.25 bits an
expert element by hand, and the trace of an MXFP4 config taken dequantized and saying so."""

import json

import numpy as np
import pytest
from support import check_hf_parity, require_module

from kvjax import KvjaxError, analytic, get_model_config
from kvjax.model.hf import from_hf_config
from kvjax.nn.mxfp4 import dequantize_mxfp4

torch = require_module("torch")
transformers = require_module("transformers")


def _random_mxfp4(rng, shape):
    """Blocks [..., G, 16] of random nibbles and exponents 2^-7 .. 2^-4 (scales 120 .. 123)."""
    blocks = rng.integers(0, 256, size=(*shape, 16), dtype=np.uint8)
    scales = rng.integers(120, 124, size=shape, dtype=np.uint8)
    return blocks, scales


def test_dequantize_matches_transformers():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks, scales = _random_mxfp4(np.random.default_rng(0), (3, 10, 2))  # E 3, out 10, in 64
    want = convert_moe_packed_tensors(
        torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32
    )  # [E, in, out]
    got = dequantize_mxfp4(blocks, scales)  # [E, out, in]
    np.testing.assert_array_equal(got, np.swapaxes(want.numpy(), 1, 2))
    # one block by hand: byte 0x21 = low nibble 1 (+0.5), high nibble 2 (+1.0); 0xF8 = -0.0, -6
    one = np.zeros((1, 16), np.uint8)
    one[0, :2] = [0x21, 0xF8]
    values = dequantize_mxfp4(one, np.array([128], np.uint8))  # x 2^(128 - 127)
    assert values[:4].tolist() == [1.0, 2.0, -0.0, -12.0] and not values[4:].any()
    with pytest.raises(KvjaxError, match=r"MXFP4 blocks \(1, 15\) and scales \(1,\) do not match"):
        dequantize_mxfp4(one[:, :15], np.array([128], np.uint8))


TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
            num_local_experts=4, num_experts_per_tok=2, sliding_window=4, rms_norm_eps=1e-5,
            pad_token_id=None, eos_token_id=None, bos_token_id=None)  # fmt: skip


def test_mxfp4_checkpoint_loads_to_the_dequantized_logits(tmp_path):
    """A checkpoint whose experts are `_blocks` / `_scales` (as the Hub's gpt-oss files): kvjax
    dequantizes them on load and matches the Hugging Face model holding the same values."""
    from safetensors.numpy import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from kvjax.nn import load_hf_llama

    torch.manual_seed(0)
    config = transformers.GptOssConfig(**TINY)
    ref = transformers.GptOssForCausalLM(config).float().eval()
    rng = np.random.default_rng(1)
    tensors = {k: v.detach().numpy().copy() for k, v in ref.state_dict().items()}
    E, D, F = 4, 64, 64
    for i in range(2):
        ex = f"model.layers.{i}.mlp.experts."
        for name, out, inp in (("gate_up_proj", 2 * F, D), ("down_proj", D, F)):
            blocks, scales = _random_mxfp4(rng, (E, out, inp // 32))
            dense = convert_moe_packed_tensors(
                torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32
            )
            with torch.no_grad():  # the reference holds exactly the dequantized values
                getattr(ref.model.layers[i].mlp.experts, name).copy_(dense)
            tensors.pop(ex + name)
            tensors[ex + name + "_blocks"] = blocks
            tensors[ex + name + "_scales"] = scales
    save_file(tensors, str(tmp_path / "model.safetensors"))
    data = {**config.to_dict(), "quantization_config": {"quant_method": "mxfp4"}}
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert from_hf_config(tmp_path).expert_weight_dtype == "mxfp4"
    model = load_hf_llama(tmp_path, weight_dtype="f32", kv_dtype="f32")
    assert model.cfg.expert_weight_dtype == ""  # held dequantized
    check_hf_parity(model, ref, np.random.default_rng(0).integers(0, 97, size=(2, 9)))


def test_mxfp4_weight_bytes_by_hand():
    """gpt-oss-20b: its 24 x 32 experts of 3 x 2880 x 2880 elements at 17 bytes a block of 32,
    everything else in bf16 (the Hub checkpoint's layout)."""
    cfg = get_model_config("gpt-oss-20b")
    experts = 24 * 32 * 3 * 2880 * 2880
    assert analytic.num_params(cfg) == 20_914_757_184
    want = (20_914_757_184 - experts) * 2 + experts // 32 * 17
    assert analytic.weight_bytes(cfg) == want == 13_761_264_768
    bf16 = cfg.replace(expert_weight_dtype="")
    assert analytic.weight_bytes(bf16) == 2 * 20_914_757_184
    with pytest.raises(KvjaxError, match="expert_weight_dtype='int3' is not supported"):
        cfg.replace(expert_weight_dtype="int3")


def test_mxfp4_config_traces_dequantized_and_says_so():
    from kvjax.traced.step import trace_step

    cfg = get_model_config("tiny-moe", expert_weight_dtype="mxfp4", d_model=64, moe_d_ff=32)
    trace = trace_step(cfg, "decode", 1, 8)
    assert trace.cfg.expert_weight_dtype == ""
    assert any("mxfp4 experts are sized by the closed form only" in n for n in trace.notes)
    from kvjax.nn import Transformer

    with pytest.raises(KvjaxError, match="expert_weight_dtype='mxfp4' is modelled in the closed"):
        from flax import nnx

        Transformer(cfg, rngs=nnx.Rngs(0))


def test_measured_views_time_mxfp4_experts_dequantized(capsys):
    """`kvjax bench` / `profile` run kvjax's model, which holds MXFP4 experts dequantized: the
    config they time says so (stderr), the closed form of `calc` keeps 4.25 bits."""
    from kvjax.cli.args import dequantized_experts

    cfg = get_model_config("gpt-oss-20b")
    timed = dequantized_experts(cfg)
    assert timed.expert_weight_dtype == "" and timed.replace(expert_weight_dtype="mxfp4") == cfg
    assert "mxfp4 experts are timed in bf16" in capsys.readouterr().err
    plain = get_model_config("tiny-moe")
    assert dequantized_experts(plain) is plain and capsys.readouterr().err == ""
