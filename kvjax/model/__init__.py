"""What a model is: `ModelConfig` (`config`) and its checks (`checks`), the hybrids' layer kinds
(`hybrid`), RoPE scaling (`rope`), the Hugging Face `config.json` import (`hf`, `hf_fields`,
`hf_hybrid`) and the presets (`presets`, `presets_families`, `presets_hybrid`). Pure Python: the
closed form (`kvjax.analytic`) and the Flax model (`kvjax.nn`) both read it; it reads neither."""
