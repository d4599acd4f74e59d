"""What each step of the MHA -> MLA conversion costs before any fine-tune: the MHA models of
configs/mla_uptrain.yaml (the same seeds: the same models), evaluated as trained, with RoPE kept on
`mla_rope_dim` dims a head only, with the heads' kept key rows shared (MLA caches one RoPE key),
as MLA at full rank (the latent's norm added; the SVD exact) and at each latent width the config
converts to; beside them the mean-pooled GQA of the same bytes.

    python3 -m experiments.benchmarks.mla_conversion [--seeds 0 1 2] [--out CSV]

Writes experiments/results/mla_conversion.csv (one row per seed and stage) and prints the means
and what each stage adds to the one before it (paired by seed, 95% intervals: `step_costs`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from experiments.hkv_quality import setup
from kvjax.runs.config import expand, load_config
from kvjax.runs.records import write_text_atomic

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "mla_uptrain.yaml"
OUT = ROOT / "experiments" / "results" / "mla_conversion.csv"


def stages(seed: int, config: Path = CONFIG) -> list[dict]:
    from flax import nnx

    from kvjax import analytic
    from kvjax.nn import Transformer
    from kvjax.quality.convert import convert_kv_heads
    from kvjax.quality.convert_mla import convert_to_mla, partial_rope
    from kvjax.quality.train import evaluate, train

    (point,) = expand(load_config(config, [f"sweep.options.seed=[{seed}]"]))
    cfg, _, data, val, tc = setup(point)
    opts = point.options
    P = int(opts.get("mla_rope_dim", 4))
    mha = Transformer(cfg.replace(num_kv_heads=cfg.num_heads), rngs=nnx.Rngs(tc.seed))
    train(mha, data, tc, val_data=val, progress=False)
    full = min(cfg.d_model, cfg.num_heads * (2 * cfg.head_dim - P))
    models = [
        ("MHA", "mha", mha),
        (f"partial RoPE ({P} dims)", "mha2mla", partial_rope(mha, P)),
        ("+ one shared RoPE key", "mha2mla", partial_rope(mha, P, shared_key=True)),
    ]
    for a in [full, *opts.get("mla_ranks", [])]:
        models.append((f"+ latent norm, MLA-{a}", "mha2mla", convert_to_mla(mha, int(a), P)))
    for k in opts.get("kv_heads", []):
        models.append((f"GQA-{k} (mean-pooled)", "mean", convert_kv_heads(mha, int(k), "mean")))
    return [{"seed": seed, "stage": name, "method": method,
             "kv_bytes_per_token": analytic.kv_bytes_per_token(m.cfg),
             "val_loss": evaluate(m, val, tc)["val_loss"]}
            for name, method, m in models]  # fmt: skip


def step_costs(df: pd.DataFrame) -> pd.DataFrame:
    """Each MHA2MLA stage minus the one before it, paired by seed, with its 95% interval."""
    from kvjax.stats import paired_difference

    by = df.pivot(index="seed", columns="stage", values="val_loss")
    stages = [s for s in dict.fromkeys(df.stage) if s == "MHA" or not s.startswith("GQA")]
    rows = []
    for before, after in zip(stages, stages[1:], strict=False):
        ci = paired_difference(by[after], by[before])
        rows.append({"stage": after, "minus": before, "mean": ci.mean, "low": ci.low,
                     "high": ci.high, "n": ci.n})  # fmt: skip
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    df = pd.DataFrame([r for s in args.seeds for r in stages(s)])
    write_text_atomic(args.out, df.to_csv(index=False))
    summary = df.groupby("stage", sort=False).agg(
        kv_bytes_per_token=("kv_bytes_per_token", "first"), val_loss=("val_loss", "mean"),
        seeds=("seed", "nunique"))  # fmt: skip
    print(summary.to_string())
    print(step_costs(df).to_string(index=False))


if __name__ == "__main__":
    main()
