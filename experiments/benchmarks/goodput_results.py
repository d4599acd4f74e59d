"""Export a `configs/serving_goodput.yaml` run (`experiments/serving_goodput.py`) to
`experiments/results/serving_goodput.csv` (or the CSV given second: a
`configs/serving_goodput_predicted.yaml` run to `serving_goodput_predicted.csv`) and print the
README's goodput table from it:
`python3 -m experiments.benchmarks.goodput_results runs/serving_goodput/<run> [CSV]`."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from kvjax.files import write_text_atomic
from kvjax.runs.records import load_records

OUT = Path(__file__).resolve().parents[1] / "results" / "serving_goodput.csv"
PREDICTED = OUT.with_name("serving_goodput_predicted.csv")  # configs/serving_goodput_predicted
ORDER = {"MHA": 0, "GQA": 1, "MQA": 2, "MLA": 3}


def _interval(row, kind: str) -> str:
    delta = row[f"quality_{kind}_delta"]
    if pd.isna(delta):
        return "none committed" if kind == "variant" else "-"
    if delta == 0 and kind == "variant":
        return "baseline"
    return f"{delta:+.3f} [{row[f'quality_{kind}_low']:+.3f}, {row[f'quality_{kind}_high']:+.3f}]"


def _name(variant) -> str:
    """'GQA', or an MLA curve with its latent ('MLA A=1984'): the table's and the line's label."""
    words = str(variant).split()
    return " ".join(words[:2]) if words[0] == "MLA" and len(words) > 1 else words[0]


def markdown(df: pd.DataFrame) -> str:
    """The knees, one row per variant and KV dtype (bf16 first)."""
    knees = df[df.knee.astype(bool)].copy()
    knees["order"] = [(kv != "bf16", ORDER.get(str(v).split()[0], 9), str(v))
                      for v, kv in zip(knees.variant, knees.kv_dtype, strict=True)]  # fmt: skip
    lines = [
        "| variant | KV | KV pool (tokens) | knee (requests/s) | TTFT P99 | ITL P99 | J / output "
        "token | $ / M output tokens | quality: h_kv | quality: fp8 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for _, r in knees.sort_values("order").iterrows():
        lines.append(
            f"| {_name(r.variant)} | {r.kv_dtype} | {int(r.kv_pool_tokens):,} | "
            f"{r.rate_requests_per_s:.2f} | {r.ttft_p99_s:.2f} s | {r.itl_p99_s * 1e3:.1f} ms | "
            f"{r.energy_j_per_output_token:.2f} | {r.cost_per_million_output_tokens:.2f} | "
            f"{_interval(r, 'variant')} | {_interval(r, 'kv_dtype')} |"
        )
    return "\n".join(lines)


def knees(df: pd.DataFrame, source: str | None = None) -> str:
    """The knees in a line: 'MHA 0.81, GQA 3.67, ... (bf16); ... (fp8)', of one step time's
    records (their `source`) where given."""
    k = df[df.knee.astype(bool) & ((df.source == source) if source else True)]
    parts = []
    for kv in ("bf16", "fp8"):
        rows = k[k.kv_dtype == kv].copy()
        rows["order"] = [(ORDER.get(str(v).split()[0], 9), str(v)) for v in rows.variant]
        parts.append(", ".join(f"{_name(r.variant)} {r.rate_requests_per_s:.2f}"
                               for _, r in rows.sort_values("order").iterrows())
                     + f" ({kv})")  # fmt: skip
    return "; ".join(parts)


def main(argv: list[str]) -> int:
    df = load_records(argv[0])
    df = df[df.experiment == "serving_goodput"].drop(columns=["experiment"])
    keep = [c for c in df.columns if c not in ("run_name", "run_id", "point")]
    sources = sorted(set(df.source))
    out = Path(argv[1]) if len(argv) > 1 else OUT
    if out == OUT and sources != ["closed form (simulated)"]:
        print(
            f"{argv[0]} holds {sources}: give its CSV (serving_goodput.csv is the closed "
            f"form's table; {PREDICTED.name} the predicted config's)",
            file=sys.stderr,
        )
        return 2
    write_text_atomic(out, df[keep].to_csv(index=False))
    df = pd.read_csv(out)
    if len(sources) == 1:
        print(markdown(df))
    for source in sources:
        print(f"knees, {source}: {knees(df, source)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
