"""Experiments from configs.

- `config`: typed YAML configs, overrides, sweeps;
- `options`: each experiment's own options, typed;
- `launcher`: `kvjax run`, points into a resumable run folder;
- `distributed`: JAX's multi-process runtime (one process a host);
- `records`: run folders and their records, written atomically;
- `exports`: the quality runs' exported records read back.
"""
