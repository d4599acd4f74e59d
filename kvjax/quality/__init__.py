"""Quality over num_kv_heads.

- `train`: optax training with resumable checkpoints;
- `data`: byte language modelling on the standard library, associative recall;
- `convert`: MHA to GQA/MQA;
- `convert_mla`: MHA/GQA to MLA (MHA2MLA's partial RoPE and joint SVD);
- `costs`: the committed quality costs mapped onto any model's variant and cache dtype.
"""
