"""Quality over num_kv_heads: `train` (optax training with resumable checkpoints), `data` (byte
language modelling on the standard library, associative recall), `convert` (MHA to GQA/MQA) and
`costs` (the committed quality costs mapped onto any model's variant and cache dtype)."""
