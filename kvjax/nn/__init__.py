"""The Flax NNX decoder behind the traced and measured views.

- `transformer`: the decoder (`Transformer`, `abstract_model`), each parameter's kernel;
- `block`: one layer: norms, the token mixer, the MLP or MoE, residuals;
- `layers`: dtypes, parameter init, linear, RMSNorm, embedding, RoPE;
- `attention`: MHA/GQA/MQA's projections, the group axis explicit;
- `attend`: the attention itself: causal, extend, and decode over a cache;
- `mla`: multi-head latent attention, naive and absorbed decode;
- `latent_cache`: MLA's cache of latents and RoPE keys;
- `flash`: the fused attention: its lowering, the prefill, flash-decoding;
- `flash_prefill`: kvjax's FlashAttention-2 prefill kernel in Pallas;
- `flash_mla`: MLA's absorbed decode as one Pallas kernel;
- `kv_cache`: the KV cache, its layouts and quantized forms;
- `fake_quant`: a quantized cache's quality, simulated in the uncached forward;
- `mlp`: the dense MLP (gated or plain);
- `moe`: the mixture of experts: router, top-k, gathered experts;
- `expert_parallel`: the routed experts spread over a mesh axis (all-to-all);
- `deltanet`: Gated DeltaNet (Qwen3-Next's linear attention);
- `delta_rule`: the gated delta rule, stepwise and chunked;
- `mamba2`: Falcon-H1's Mamba-2 mixer;
- `shortconv`: LFM2's short gated convolution;
- `state_cache`: a hybrid's cache: KV beside the state layers' states;
- `sharding`: tensor and data parallelism over a mesh;
- `generate`: greedy and temperature decoding with compiled steps;
- `hf`: a Hugging Face checkpoint loaded into the model;
- `hf_parts`: the checkpoint tensors every family shares;
- `hf_hybrid_load`: the hybrids' checkpoints;
- `mxfp4`: gpt-oss's MXFP4 experts dequantized on load.
"""

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
