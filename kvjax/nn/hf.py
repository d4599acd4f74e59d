"""Load a local Hugging Face checkpoint (config.json + *.safetensors) of any family in `SUPPORTED`
(Llama, Mistral, Qwen, Gemma, DeepSeek-V2/V3, Mixtral, gpt-oss, Llama 4 text, ...); the hybrids
load through `kvjax.nn.hf_hybrid_load`.

Nothing is downloaded. Hugging Face stores linear weights as [out, in], as kvjax does, so the
tensors are taken as they are (gate and up are concatenated into gate_up). DeepSeek (MLA):
`kv_b_proj` is split per head into `k_up` and `v_up`, and where the checkpoint rotates RoPE pairs
interleaved (V2 always; V3 with `rope_interleave`), the RoPE rows of the query and key projections
are permuted to [even; odd], which turns interleaved RoPE into kvjax's rotate-half RoPE exactly
(scores are dot products, so both sides permuted alike leave them unchanged).
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig
from kvjax.model.hf import _HF_MODEL_TYPES, from_hf_config, read_hf_json
from kvjax.model.hf_fields import rope_scalings
from kvjax.model.hf_hybrid import HYBRID_TYPES
from kvjax.nn.hf_hybrid_load import from_hf_hybrid
from kvjax.nn.hf_parts import (
    EXPERT_NAMES,
    check_all_used,
    deinterleave,
    load_attention,
    load_mlp,
    load_moe,
    tensor_io,
)
from kvjax.nn.mlp import XIELU_BETA, XIELU_EPS
from kvjax.nn.mxfp4 import load_gpt_oss_experts
from kvjax.nn.transformer import Transformer

# The text models whose checkpoints load here, in `kvjax.model.hf`'s order: not a multimodal
# config's (gemma3, llama4), and the hybrids through `kvjax.nn.hf_hybrid_load`.
SUPPORTED = tuple(t for t in _HF_MODEL_TYPES if t not in ("gemma3", "llama4", *HYBRID_TYPES))


def _read_safetensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise KvjaxError(f"no *.safetensors files in {str(folder)!r}")
    tensors = {}
    for f in files:
        with safe_open(str(f), framework="flax") as fh:
            for name in fh.keys():
                tensors[name] = np.asarray(fh.get_tensor(name).astype(jnp.float32))
    return tensors


def load_hf_llama(path: str | Path, **overrides) -> Transformer:
    """A `Transformer` with the checkpoint's weights (in its config's weight dtype, or overridden,
    e.g. `weight_dtype="f32"`)."""
    folder = Path(path)
    if not folder.is_dir():
        raise KvjaxError(f"checkpoint {str(folder)!r} is not a directory")
    cfg = from_hf_config(folder, **overrides)
    data = read_hf_json(folder)
    model_type = data.get("model_type", "llama")
    if model_type not in SUPPORTED + HYBRID_TYPES:
        raise KvjaxError(
            f"checkpoint model_type={model_type!r} is not supported; "
            f"allowed: {', '.join(SUPPORTED + HYBRID_TYPES)}"
        )
    for scaling in rope_scalings(data):
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ("default", "linear", "llama3", "yarn", None):
            raise KvjaxError(
                f"checkpoint rope scaling type {kind!r} is not implemented in kvjax's model (its "
                f"logits would differ); `kvjax calc`/`trace` of the config are unaffected"
            )
    interleaved = model_type in ("deepseek_v2", "glm4", "ernie4_5", "cohere2", "llama4_text") or (
        model_type == "deepseek_v3" and data.get("rope_interleave", True)
    )
    if cfg.expert_weight_dtype:  # gpt-oss's MXFP4 experts, dequantized on load (kvjax.nn.mxfp4)
        cfg = cfg.replace(expert_weight_dtype="")
    tensors = _read_safetensors(folder)
    if model_type in HYBRID_TYPES:  # their state mixers' tensors (kvjax.nn.hf_hybrid_load)
        return from_hf_hybrid(cfg, tensors, model_type, data)
    moe_prefix = {"mixtral": "block_sparse_moe.", "llama4_text": "feed_forward."}.get(
        model_type, "mlp."
    )
    norms = ("attention_layernorm", "feedforward_layernorm") if model_type == "apertus" else None
    return from_hf_tensors(
        cfg,
        tensors,
        rope_interleaved=interleaved,
        moe_prefix=moe_prefix,
        glm=model_type == "glm4",
        norm_names=norms,
    )


def _load_mla(cfg: ModelConfig, a, get, put, p: str, interleaved: bool) -> None:
    D, N, H, A, P = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    U, W, Q = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.q_lora_rank

    def rope_rows(w, heads, head_dim):
        return deinterleave(w, heads, head_dim, P) if interleaved else w

    if Q:
        put(a.q_a_proj, get(p + "self_attn.q_a_proj.weight", (Q, D)))
        put(a.q_a_norm, get(p + "self_attn.q_a_layernorm.weight", (Q,)))
        put(a.q_b_proj, rope_rows(get(p + "self_attn.q_b_proj.weight", (N * H, Q)), N, H))
    else:
        put(a.q_proj, rope_rows(get(p + "self_attn.q_proj.weight", (N * H, D)), N, H))
    kv_a = get(p + "self_attn.kv_a_proj_with_mqa.weight", (A + P, D))
    put(a.kv_a_proj, rope_rows(kv_a, 1, A + P))
    put(a.kv_a_norm, get(p + "self_attn.kv_a_layernorm.weight", (A,)))
    kv_b = get(p + "self_attn.kv_b_proj.weight", (N * (U + W), A)).reshape(N, U + W, A)
    put(a.k_up, kv_b[:, :U])
    put(a.v_up, kv_b[:, U:])
    put(a.o_proj, get(p + "self_attn.o_proj.weight", (D, N * W)))


def _check_xielu_constants(tensors, get, p: str) -> None:
    """xIELU's beta and eps are buffers in a checkpoint (if saved) that Hugging Face's ApertusMLP
    never sets otherwise; kvjax holds them as constants, so a checkpoint's must equal them (to
    its dtype's rounding: bf16's -1e-6 is -9.98e-7)."""
    for name, want in (("beta", XIELU_BETA), ("eps", XIELU_EPS)):
        if p + name in tensors:
            value = float(get(p + name, ()))
            if not np.isclose(value, want, rtol=1e-2, atol=0.0):
                raise KvjaxError(
                    f"tensor {p + name!r} = {value:g}: kvjax's xIELU has {name} {want:g} "
                    "fixed (Hugging Face's default, which Apertus uses)"
                )


def from_hf_tensors(
    cfg: ModelConfig,
    tensors: dict[str, np.ndarray],
    rope_interleaved: bool = False,
    moe_prefix: str = "mlp.",
    glm: bool = False,
    norm_names: tuple[str, str] | None = None,
) -> Transformer:
    """`norm_names`: the two pre-norms' tensor names (Apertus's attention_layernorm and
    feedforward_layernorm; Llama's input_layernorm and post_attention_layernorm otherwise)."""
    D, F = cfg.d_model, cfg.d_ff
    get, put, used = tensor_io(cfg, tensors)

    model = Transformer(cfg, rngs=nnx.Rngs(0))
    put(model.embed, get("model.embed_tokens.weight", (cfg.vocab_size, D)))
    fused = "model.layers.0.self_attn.qkv_proj.weight" in tensors  # Phi-3's fused tensors
    fused_mlp = "model.layers.0.mlp.gate_up_proj.weight" in tensors  # Phi-3's and GLM's
    plain = () if "model.layers.0.mlp.c_fc.weight" in tensors else ("up_proj", "down_proj")
    attn_norm, mlp_norm = norm_names or ("input_layernorm", "post_attention_layernorm")
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        a = layer.attn
        if cfg.is_mla:
            _load_mla(cfg, a, get, put, p, rope_interleaved)
        else:
            load_attention(cfg, a, get, put, p, fused, rope_interleaved)
        if cfg.layer_is_moe(i) and cfg.expert_bias:  # gpt-oss's stacked experts
            load_gpt_oss_experts(cfg, layer.mlp, tensors, get, put, p + "mlp.")
        elif cfg.layer_is_moe(i):
            load_moe(cfg, layer.mlp, get, put, p + moe_prefix, EXPERT_NAMES[moe_prefix])
        else:
            dense = "feed_forward." if moe_prefix == "feed_forward." else "mlp."  # Llama 4's
            load_mlp(layer.mlp, get, put, p + dense, F, D, fused_mlp, plain)
            if cfg.mlp_activation == "xielu":
                _check_xielu_constants(tensors, get, p + "mlp.act_fn.")

        def norm(module, name):  # a norm's scale, and a LayerNorm's bias
            put(module.scale, get(name + ".weight", (D,)))
            if cfg.norm_bias:
                put(module.bias, get(name + ".bias", (D,)))

        if cfg.pre_norms:
            norm(layer.attn_norm, p + attn_norm)
        if glm:  # GLM-4's four: post_self_attn after attention, post_attention before the MLP
            norm(layer.post_attn_norm, p + "post_self_attn_layernorm")
            norm(layer.mlp_norm, p + "post_attention_layernorm")
            norm(layer.post_mlp_norm, p + "post_mlp_layernorm")
        elif cfg.sandwich_norms:  # Gemma 2/3: post_attention_layernorm norms the attention output
            norm(layer.post_attn_norm, p + "post_attention_layernorm")
            if cfg.pre_norms:  # OLMo 2 has none before its MLP
                norm(layer.mlp_norm, p + "pre_feedforward_layernorm")
            norm(layer.post_mlp_norm, p + "post_feedforward_layernorm")
        elif not cfg.parallel_block:  # Cohere's one norm is input_layernorm
            norm(layer.mlp_norm, p + mlp_norm)
    put(model.final_norm.scale, get("model.norm.weight", (D,)))
    if cfg.norm_bias:
        put(model.final_norm.bias, get("model.norm.bias", (D,)))
    if not cfg.tied_embeddings:
        put(model.lm_head, get("lm_head.weight", (cfg.vocab_size, D)))
    check_all_used(tensors, used)
    return model
