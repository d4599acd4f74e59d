"""Records read back from the quality runs' exports (`experiments/results/`, written by
`python3 -m experiments.benchmarks.quality_results`): `<experiment>.csv` (one row per record,
without the curves) joined with `<experiment>_history.json` (the curves, row for row), so the
quality figures can be drawn without the run folders, which take 20-45 minutes each to redo."""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvjax.errors import KvjaxError

EXPORTED = ("hkv_quality", "gqa_uptrain")
# the keys `export` writes beside each curve: a curve belongs to the CSV row of the same keys
KEYS = ("task", "method", "variant", "num_kv_heads", "num_pairs", "seed", "eval_kv_dtype", "steps")
# The shapes of the quality models (configs/hkv_quality.yaml, hkv_recall.yaml, gqa_uptrain*.yaml;
# tests/test_plotting_quality.py checks them against those configs): the committed exports
# predate the records' own `num_layers` and `d_model`, which the figures' titles name.
QUALITY_MODELS = {
    "quality-small": {"num_layers": 4, "d_model": 128},
    "recall-small": {"num_layers": 2, "d_model": 128},
}


def _same(a, b) -> bool:
    missing = [x is None or (isinstance(x, float) and math.isnan(x)) for x in (a, b)]
    if any(missing):
        return all(missing)
    return bool(a == b)


def variant_name(num_kv_heads, num_heads, kv_lora_rank=0) -> str:
    """MHA, GQA-k, MQA or MLA-A (experiments/hkv_quality.py's `variant` of a record)."""
    if kv_lora_rank and kv_lora_rank == kv_lora_rank:  # not 0, not nan
        return f"MLA-{int(kv_lora_rank)}"
    k, n = int(num_kv_heads), int(num_heads)
    return "MHA" if k == n else "MQA" if k == 1 else f"GQA-{k}"


def with_variants(df) -> None:
    """Fill `variant` and `kv_lora_rank` (0) in records written before they were (GQA only)."""
    import pandas as pd

    df["kv_lora_rank"] = df["kv_lora_rank"].fillna(0) if "kv_lora_rank" in df else 0
    named = pd.Series(
        [
            variant_name(k, n, a)
            for k, n, a in zip(df.num_kv_heads, df.num_heads, df.kv_lora_rank, strict=True)
        ],
        index=df.index,
    )
    df["variant"] = df["variant"].fillna(named) if "variant" in df else named


def load_exports(folder: str | Path):
    """Every exported quality record in `folder` as a DataFrame shaped like `load_records`'s:
    the CSV's columns, `history` from the JSON (None where a record has no curve), and the
    model's `num_layers` and `d_model` where the export lacks them."""
    import pandas as pd

    folder = Path(folder)
    frames = []
    for experiment in EXPORTED:
        csv = folder / f"{experiment}.csv"
        if not csv.exists():
            continue
        df = pd.read_csv(csv)
        curves = folder / f"{experiment}_history.json"
        if curves.exists():
            rows = json.loads(curves.read_text())
            if len(rows) != len(df):
                raise KvjaxError(f"{curves} has {len(rows)} rows, {csv} {len(df)}: re-export both")
            for i, (row, (_, r)) in enumerate(zip(rows, df.iterrows(), strict=True)):
                wrong = [k for k in KEYS if k in row and k in df and not _same(row[k], r[k])]
                if wrong:
                    raise KvjaxError(f"{curves} row {i} does not match {csv}'s on {wrong}")
            df["history"] = [
                r["history"] if isinstance(r.get("history"), list) else None for r in rows
            ]
        if experiment == "hkv_quality":
            with_variants(df)
        for column in ("num_layers", "d_model"):
            shape = df.model.map(lambda m, c=column: QUALITY_MODELS.get(m, {}).get(c))
            df[column] = df[column].fillna(shape) if column in df else shape
        frames.append(df.assign(experiment=experiment) if "experiment" not in df else df)
    if not frames:
        raise KvjaxError(
            f"{folder} holds no quality exports ({', '.join(e + '.csv' for e in EXPORTED)})"
        )
    return pd.concat(frames, ignore_index=True)
