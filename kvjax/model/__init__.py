"""What a model is, in pure Python: the closed form (`kvjax.analytic`) and the Flax model
(`kvjax.nn`) both read it; it reads neither.

- `config`: `ModelConfig` (frozen, validated, derived sizes) and the preset registry;
- `field_checks`: each field's type and range;
- `checks`: the features together (RoPE, MLA, windows, KV scales, the extend step);
- `moe_checks`: the mixture of experts' fields;
- `hybrid`: the layers whose state does not grow;
- `rope`: RoPE scaling for long contexts (llama3, YaRN, long RoPE);
- `hf`: Hugging Face `config.json` import, step by step;
- `hf_families`: each family's own fields (MLA, experts, windows, biases, norms);
- `hf_fields`: typed reads, RoPE scaling and the further families' fields;
- `hf_hybrid`: the hybrid families' fields;
- `presets`: the published models (Llama, Mistral, Qwen, Gemma, DeepSeek, Mixtral) and tiny ones;
- `presets_families`: the further families;
- `presets_hybrid`: the hybrids;
- `presets_serving`: the models the published serving results use.
"""
