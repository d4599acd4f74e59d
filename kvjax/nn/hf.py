"""Load a local Hugging Face Llama / Mistral / Qwen2 checkpoint (config.json + *.safetensors).

Nothing is downloaded. Hugging Face stores linear weights as [out, in], as kvjax does, so the
tensors are taken as they are (gate and up are concatenated into gate_up).
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvjax.config import ModelConfig
from kvjax.errors import KvjaxError
from kvjax.hf_config import from_hf_config, read_hf_json
from kvjax.nn.layers import weight_dtype
from kvjax.nn.transformer import Transformer

SUPPORTED = ("llama", "mistral", "qwen2")


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
    model_type = read_hf_json(folder).get("model_type", "llama")
    if model_type not in SUPPORTED:
        raise KvjaxError(
            f"checkpoint model_type={model_type!r} is not supported; "
            f"allowed: {', '.join(SUPPORTED)}"
        )
    tensors = _read_safetensors(folder)
    return from_hf_tensors(cfg, tensors)


def from_hf_tensors(cfg: ModelConfig, tensors: dict[str, np.ndarray]) -> Transformer:
    D, N, K, H, F = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_ff
    dtype = weight_dtype(cfg)
    used: set[str] = set()

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in tensors:
            raise KvjaxError(f"checkpoint is missing tensor {name!r}")
        x = tensors[name]
        if x.shape != shape:
            raise KvjaxError(f"tensor {name!r} has shape {x.shape}; the config implies {shape}")
        used.add(name)
        return x

    def put(variable: nnx.Param, value: np.ndarray) -> None:
        variable[...] = jnp.asarray(value, dtype)

    model = Transformer(cfg, rngs=nnx.Rngs(0))
    put(model.embed, get("model.embed_tokens.weight", (cfg.vocab_size, D)))
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        a = layer.attn
        put(a.q_proj, get(p + "self_attn.q_proj.weight", (N * H, D)))
        put(a.k_proj, get(p + "self_attn.k_proj.weight", (K * H, D)))
        put(a.v_proj, get(p + "self_attn.v_proj.weight", (K * H, D)))
        put(a.o_proj, get(p + "self_attn.o_proj.weight", (D, N * H)))
        if cfg.qkv_bias:
            put(a.q_bias, get(p + "self_attn.q_proj.bias", (N * H,)))
            put(a.k_bias, get(p + "self_attn.k_proj.bias", (K * H,)))
            put(a.v_bias, get(p + "self_attn.v_proj.bias", (K * H,)))
        gate = get(p + "mlp.gate_proj.weight", (F, D))
        up = get(p + "mlp.up_proj.weight", (F, D))
        put(layer.mlp.gate_up, np.concatenate([gate, up], axis=0))
        put(layer.mlp.down, get(p + "mlp.down_proj.weight", (D, F)))
        put(layer.attn_norm.scale, get(p + "input_layernorm.weight", (D,)))
        put(layer.mlp_norm.scale, get(p + "post_attention_layernorm.weight", (D,)))
    put(model.final_norm.scale, get("model.norm.weight", (D,)))
    if not cfg.tied_embeddings:
        put(model.lm_head, get("lm_head.weight", (cfg.vocab_size, D)))
    unused = sorted(k for k in tensors if k not in used and "rotary_emb" not in k)
    if unused:
        raise KvjaxError(f"checkpoint has tensors the model does not use: {', '.join(unused[:5])}")
    return model
