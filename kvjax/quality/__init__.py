"""Quality over num_kv_heads: `train` (optax training with resumable checkpoints), `data` (byte
language modelling on the standard library, associative recall) and `convert` (MHA to GQA/MQA)."""
