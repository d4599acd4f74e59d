"""Benchmark: a digest of the numbers kvjax prints, to show a change that should move none moved
none (a refactor, a reformat): `kvjax validate --json` (every kernel and system row and class),
`kvjax calc --json` for every preset in decode and prefill (with `--predict` on three), `kvjax
simulate --json` on six deployments (tensor and pipeline parallel, data-parallel attention with
experts, disaggregated, speculative, replicas behind a router), `kvjax trace --json` of a tiny
model, and the system predictions of six committed rows cut to 40 requests.

    python3 -m experiments.benchmarks.numbers_digest [--out FILE] [--quick]

Prints one SHA-256 a part and one over them all; `--out` writes every part's JSON beside (to
diff where a digest differs). `--quick` leaves out the system predictions (about a minute)."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
from pathlib import Path

from kvjax.cli.main import main as kvjax
from kvjax.model.config import PRESETS

SIMULATIONS = [
    "--model llama-3-8b --chip h100-sxm --rate 20 --requests 60 --prompt-len 512 "
    "--output-len 64 --step-time kernels",
    "--model llama-2-70b --chip h100-sxm --tp 4 --rate 4 --requests 40 --prompt-len 1024 "
    "--output-len 64",
    "--model llama-3.1-405b --chip h200 --tp 4 --pp 2 --rate 2 --requests 30 --prompt-len 2048 "
    "--output-len 32 --step-time kernels",
    "--model deepseek-v3 --weight-dtype fp8 --kv-dtype fp8 --chip h200 --dp-attention 8 --ep 8 "
    "--rate 8 --requests 40 --prompt-len 1000 --output-len 32",
    "--model llama-3-8b --chip h100-sxm --rate 10 --requests 40 --prompt-len 256 "
    "--output-len 64 --disaggregate",
    "--model llama-3-8b --chip h100-sxm --rate 10 --requests 40 --prompt-len 256 "
    "--output-len 64 --spec-tokens 3 --acceptance 0.7 --replicas 2 --route least-loaded",
]
PREDICTED_ROWS = 6


def _json(args: list[str]) -> str:
    """A kvjax command's --json output, canonical (sorted keys), timings dropped."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = kvjax([*args, "--json"])
    if code != 0:
        raise SystemExit(f"kvjax {' '.join(args)} exited {code}")
    return json.dumps(_drop_timings(json.loads(out.getvalue())), sort_keys=True)


def _drop_timings(x):
    """Seconds a command took (`seconds`, `wall_s`, `*_seconds`) vary run to run; everything
    else must not."""
    if isinstance(x, dict):
        return {
            k: _drop_timings(v)
            for k, v in x.items()
            if k not in ("seconds", "wall_s") and not k.endswith("_seconds")
        }
    if isinstance(x, list):
        return [_drop_timings(v) for v in x]
    return x


def parts(quick: bool = False) -> dict[str, str]:
    out = {"validate": _json(["validate"])}
    calcs = []
    for name in sorted(PRESETS):
        for phase in ("decode", "prefill"):
            calcs.append(_json(["calc", "--model", name, "--phase", phase, "--context", "2048"]))
    for name in ("llama-3-8b", "deepseek-v3", "mixtral-8x7b"):
        calcs.append(_json(["calc", "--model", name, "--predict", "--batch", "16"]))
    out["calc"] = "\n".join(calcs)
    out["simulate"] = "\n".join(_json(["simulate", *s.split()]) for s in SIMULATIONS)
    out["trace"] = _json(["trace", "--model", "tiny-gqa"])
    if not quick:
        out["system_predictions"] = _predictions()
    return out


def _predictions() -> str:
    import pandas as pd

    from kvjax.serving.system_predict import predict_row
    from kvjax.serving.systems import PREDICTIONS_CSV, read_systems

    committed = pd.read_csv(PREDICTIONS_CSV).sort_values("seconds")
    keys = list(zip(committed.source, committed.metric, strict=True))[:PREDICTED_ROWS]
    rows = {(r["source"], r["metric"]): r for r in read_systems()}
    got = [_drop_timings(predict_row({**rows[k], "requests": 40})) for k in keys]
    return json.dumps(got, sort_keys=True, default=str)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="a folder for each part's JSON")
    p.add_argument("--quick", action="store_true", help="without the system predictions")
    a = p.parse_args()
    got = parts(a.quick)
    whole = hashlib.sha256()
    for name, text in got.items():
        digest = hashlib.sha256(text.encode()).hexdigest()
        whole.update(digest.encode())
        print(f"{name}: {digest}")
        if a.out:
            Path(a.out).mkdir(parents=True, exist_ok=True)
            (Path(a.out) / f"{name}.json").write_text(text)
    print(f"all: {whole.hexdigest()}")


if __name__ == "__main__":
    main()
