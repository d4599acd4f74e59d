"""The Flax NNX decoder behind the traced and measured views."""

from kvjax.nn.generate import CompiledSteps, generate
from kvjax.nn.hf import load_hf_llama
from kvjax.nn.kv_cache import KVCache
from kvjax.nn.transformer import Transformer, abstract_model, param_count

__all__ = [
    "CompiledSteps",
    "KVCache",
    "Transformer",
    "abstract_model",
    "generate",
    "load_hf_llama",
    "param_count",
]
