"""What a variant costs in quality, from the committed quality results: the paired differences of
`experiments/results/quality_differences.csv` (the small 8-head decoder on stdlib bytes, val loss
in nats per byte, mean and 95% interval over seeds), mapped onto any model's attention variant:

- MHA: the baseline (0).
- GQA / MQA: the quality model's h_kv of the same query heads per KV head (`h_kv=2 - MHA` for a
  model with 4 query heads a KV head); MQA is h_kv=1.
- MLA: the committed MLA width whose cache is the nearest share (on a log scale) of its MHA's
  (`mla_share`: the quality model's MLA-24 holds 1/8 of its MHA's cache, DeepSeek-V2's recipe on
  llama-3-8b 0.070 of llama-3-8b's): `MLA-24 - MHA` there.
- The cache's dtype: a quantized cache (int8, fp8, int4, int2) adds that cache's difference from
  the same model's f32 cache (`fp8 cache - f32, h_kv=1`); a 2- or 4-byte cache (bf16, f16, f32)
  adds nothing (the quality model's own f32 cache; bf16 is not measured apart).

A cost that cannot be evaluated (a group size the quality model has no h_kv for, an MLA width or
a quantized MLA cache with no result, a hybrid) says why, by name (`QualityCost.missing`; the
parts that were found stay in `parts`)."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig

QUALITY_CSV = (
    Path(__file__).resolve().parents[2] / "experiments" / "results" / "quality_differences.csv"
)
QUALITY_HEADS = 8  # the quality model's query heads (configs/hkv_quality.yaml)


@dataclass(frozen=True)
class QualityCost:
    """A variant's committed cost: the sum of its parts' mean differences (val loss, nats/byte)
    with each part's 95% interval; `missing` names what has no committed result."""

    # (kind: "variant" or "cache", comparison, mean, low, high)
    parts: tuple[tuple[str, str, float, float, float], ...]
    missing: str | None = None

    @property
    def delta(self) -> float | None:
        return None if self.missing else sum(p[2] for p in self.parts)

    @property
    def low(self) -> float | None:  # the parts' low ends added: no narrower than either's
        return None if self.missing else sum(p[3] for p in self.parts)

    @property
    def high(self) -> float | None:
        return None if self.missing else sum(p[4] for p in self.parts)

    @property
    def label(self) -> str:
        return self.missing or (" + ".join(p[1] for p in self.parts) or "MHA (the baseline)")

    def part(self, kind: str) -> tuple[str, str, float, float, float] | None:
        return next((p for p in self.parts if p[0] == kind), None)

    def as_dict(self) -> dict:
        return {
            "comparison": self.label,
            "delta": self.delta,
            "low": self.low,
            "high": self.high,
            "missing": self.missing,
        }


@lru_cache(maxsize=4)
def committed(path: Path = QUALITY_CSV) -> dict[tuple[str, str, str], tuple[float, float, float]]:
    """(family, comparison, condition) -> (mean, low, high) of every val-loss comparison."""
    if not path.exists():
        raise KvjaxError(
            f"no committed quality results at {path} (python3 -m "
            "experiments.benchmarks.quality_results writes them)"
        )
    with open(path) as f:
        return {
            (r["family"], r["comparison"], r["condition"]): (
                float(r["mean"]),
                float(r["low"]),
                float(r["high"]),
            )
            for r in csv.DictReader(f)
            if r["metric"] == "val_loss"
        }


@lru_cache(maxsize=4)
def committed_mla(path: Path = QUALITY_CSV) -> dict[int, float]:
    """Latent width A -> its cache's share of the MHA model's (their KV bytes per token in the
    committed stdlib records, hkv_quality.csv beside `path`), for every committed `MLA-A - MHA`."""
    compared = {
        c.split(" - ")[0]
        for f, c, cond in committed(path)
        if f == "stdlib" and cond == "" and c.startswith("MLA-") and c.endswith(" - MHA")
    }
    records = path.parent / "hkv_quality.csv"
    if not compared or not records.exists():
        return {}
    with open(records) as f:
        per_token = {
            r["variant"]: float(r["kv_bytes_per_token"])
            for r in csv.DictReader(f)
            if r["task"] == "stdlib" and r["eval_kv_dtype"] == "f32"
        }
    return {int(v[4:]): per_token[v] / per_token["MHA"] for v in compared if v in per_token}


def mla_share(cfg: ModelConfig) -> float:
    """An MLA model's cache over the MHA cache of its heads: (A + P) / (N (U + W)), U the
    key width without the RoPE part (DeepSeek-V2's recipe on llama-3-8b: 576 / 8192)."""
    U = cfg.head_dim - cfg.qk_rope_head_dim
    return (cfg.kv_lora_rank + cfg.qk_rope_head_dim) / (cfg.num_heads * (U + cfg.v_head_dim))


def quality_cost(cfg: ModelConfig, path: Path = QUALITY_CSV) -> QualityCost:
    """cfg's attention variant and cache dtype against MHA with its own cache (module doc)."""
    rows = committed(path)
    if cfg.is_hybrid:
        return QualityCost(
            (), f"{cfg.name}: a hybrid (state layers) has no committed quality result"
        )
    parts: list[tuple[str, str, float, float, float]] = []
    if cfg.is_mla:
        widths, share = committed_mla(path), mla_share(cfg)
        if not widths:
            return QualityCost(
                (), "MLA: no committed MLA quality result (configs/mla_quality.yaml)"
            )
        A = min(widths, key=lambda a: abs(math.log(widths[a] / share)))
        key = ("stdlib", f"MLA-{A} - MHA", "")
        parts.append(
            (
                "variant",
                f"MLA-{A} - MHA (cache {widths[A]:.3g} of MHA's; this one {share:.3g})",
                *rows[key],
            )
        )
        h_kv = None
    else:
        group = cfg.num_heads // cfg.num_kv_heads
        if cfg.num_kv_heads != 1 and QUALITY_HEADS % group:
            why = (
                f"{cfg.attention_variant}: no committed h_kv with {group} query heads per KV "
                f"head (the quality model has {QUALITY_HEADS})"
            )
            return QualityCost((), why)
        h_kv = 1 if cfg.num_kv_heads == 1 else QUALITY_HEADS // group
        if h_kv != QUALITY_HEADS:
            key = ("stdlib", f"h_kv={h_kv} - MHA", "")
            if key not in rows:
                return QualityCost((), f"{cfg.attention_variant}: no committed {key[1]!r}")
            parts.append(("variant", key[1], *rows[key]))
    if cfg.kv_bytes_per_element < 2 or cfg.kv_packed:  # a quantized cache: its own difference
        key = ("stdlib", f"{cfg.kv_dtype} cache - f32", f"h_kv={h_kv}")
        if h_kv is None or key not in rows:
            what = "an MLA latent cache" if h_kv is None else f"h_kv={h_kv}"
            why = f"kv_dtype={cfg.kv_dtype!r}: no committed quality result for {what} in that dtype"
            return QualityCost(tuple(parts), why)  # the variant's part stays readable
        parts.append(("cache", f"{key[1]}, {key[2]}", *rows[key]))
    return QualityCost(tuple(parts))
