"""The interactive explorer: the seed's batch / context / num_kv_heads widget as one self-contained
HTML file that opens from disk with no server and no network.

The presets are exported from `kvjax.model.config` and `kvjax.hardware` as JSON into the page; the
formulas run in the page's JavaScript (a second implementation of `kvjax.analytic`'s decode step,
kernel by kernel), and tests/test_plotting_explorer.py checks, in a real headless browser, that
the page shows what `kvjax calc --json` says.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from kvjax.errors import KvjaxError, unknown_name_error
from kvjax.files import write_text_atomic
from kvjax.hardware import CHIPS
from kvjax.model.config import DTYPE_BYTES, PACKED_KV_BYTES, PRESETS, ModelConfig


def _model_entry(cfg: ModelConfig) -> dict[str, Any]:
    d = cfg.to_dict()
    d["compute_dtype"] = cfg.compute_dtype
    d["kv_head_choices"] = cfg.kv_head_choices()
    return d


def explorer_data() -> dict[str, Any]:
    """Everything the page needs, from the Python presets (nothing retyped), the hybrids' state
    layers included."""
    models = {
        name: _model_entry(cfg) for name, cfg in PRESETS.items() if not name.startswith("tiny")
    }
    chips = {
        name: {
            "peak_flops_per_s": chip.peak_flops_per_s,
            "bandwidth_bytes_per_s": chip.bandwidth_bytes_per_s,
            "memory_bytes": chip.memory_bytes,
            "onchip_bytes_per_core": chip.onchip_bytes_per_core,
            "l2_bytes": chip.l2_bytes,
            "interconnect_bytes_per_s": chip.interconnect_bytes_per_s,
            "num_cores": chip.num_cores,
            "source": chip.source,
        }
        for name, chip in CHIPS.items()
    }
    # the packed int4 / int2 caches are KV dtypes only (the page offers every key as a KV dtype)
    return {"models": models, "chips": chips, "dtype_bytes": {**DTYPE_BYTES, **PACKED_KV_BYTES}}


def render_explorer(model: str | ModelConfig = "seed-70b", chip: str = "h100-sxm") -> str:
    """The page, opening on `model`: a preset's name, or any `ModelConfig` (a config.json's),
    which joins the presets in the page."""
    data = explorer_data()
    if isinstance(model, ModelConfig):
        cfg, model = model, model.name
        if PRESETS.get(model) != cfg:
            model = model if model not in data["models"] else f"{model} (custom)"
            data["models"][model] = _model_entry(cfg)
    if model not in data["models"]:
        raise unknown_name_error("model", model, data["models"])
    if chip not in data["chips"]:
        raise unknown_name_error("chip", chip, data["chips"])
    payload = json.dumps({**data, "default_model": model, "default_chip": chip})
    template = resources.files("kvjax").joinpath("assets/explorer.html").read_text()
    # no '<' left in the data: a name from a config file cannot close the script or open a tag
    return template.replace("/*DATA*/null", payload.replace("<", "\\u003c"))


def write_explorer(
    path: str | Path, model: str | ModelConfig = "seed-70b", chip: str = "h100-sxm"
) -> Path:
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise KvjaxError(f"--out={str(path)!r} must name an .html file")
    return write_text_atomic(path, render_explorer(model, chip))
