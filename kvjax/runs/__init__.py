"""Experiments from configs: `config` (typed YAML configs, overrides, sweeps), `launcher`
(`kvjax run`: points into a resumable run folder) and `records` (run folders and their records)."""
