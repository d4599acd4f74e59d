"""Benchmark: the 17 Hugging Face families of issue 29, one row each.

    python3 -m experiments.benchmarks.family_table [--out experiments/results/family_table.csv]

Per family: the preset of its flagship, its parameters (closed form; tests/test_families.py checks
them against the Hugging Face model on the meta device), its KV cache per token at S = 32768 and
B = 1 (the whole cache / S: sliding and chunked layers hold their window, so it is below the
global layers' bytes per token), and the logits parity of kvjax's model with a tiny random
transformers checkpoint of the family (the configs of tests/test_families.py, f32): the largest
absolute difference over the uncached forward and prefill of 3 tokens + cached decode of the
rest. Needs torch and transformers (the `test` extra).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from kvjax import analytic, get_model_config

RESULTS = Path(__file__).resolve().parents[1] / "results"
TESTS = Path(__file__).resolve().parents[2] / "tests"

# family -> (preset, the features it brought)
FAMILIES = {
    "seed_oss": ("seed-oss-36b", "q/k/v biases, o_proj bias key"),
    "granite": ("granite-3-8b", "embedding / residual / logits multipliers, softmax scale"),
    "smollm3": ("smollm3-3b", "NoPE every 4th layer"),
    "phi3": ("phi-3-mini", "fused qkv and gate_up, sliding window 2047"),
    "starcoder2": ("starcoder2-3b", "LayerNorm with bias, plain GELU MLP, biases, window"),
    "stablelm": ("stablelm-3b", "LayerNorm with bias, partial rotary 25%, qkv bias"),
    "olmo2": ("olmo-2-7b", "post-norms only, q/k norms over all heads"),
    "qwen2_moe": ("qwen1.5-moe-a2.7b", "shared expert with a sigmoid gate, qkv bias"),
    "olmoe": ("olmoe-1b-7b", "64 experts of 1024, q/k norms over all heads"),
    "glm4": ("glm-4-9b", "sandwich norms, partial interleaved rotary, q/k biases"),
    "ernie4_5": ("ernie-4.5-0.3b", "interleaved rotary, biases, tied"),
    "exaone4": ("exaone-4.0-32b", "post-norms, q/k norms, 3 sliding : 1 global, NoPE globals"),
    "cohere2": ("command-r7b", "parallel block on one LayerNorm, logit scale, NoPE globals"),
    "internlm3": ("internlm3-8b", "run as Llama: qkv_bias / bias keys, 2 KV heads"),
    "apertus": ("apertus-8b", "xIELU on a plain MLP, q/k norms, llama3 RoPE"),
    "gpt_oss": ("gpt-oss-120b", "sink logits, alternating window 128, biased router and "
                "experts, clamped SwiGLU, YaRN, MXFP4 experts"),
    "llama4_text": ("llama-4-scout", "chunked attention 8192, NoPE + temperature tuning, L2 "
                    "q/k norms, top-1 sigmoid MoE on the input, shared expert"),
}  # fmt: skip


def kv_bytes_per_token(name: str, context: int = 32768) -> float:
    cfg = get_model_config(name)
    return analytic.kv_cache_bytes(cfg, context) / context


def parity_error(family: str) -> float:
    """The largest |kvjax - transformers| logit over the forward and prefill + decode."""
    import jax.numpy as jnp

    sys.path.insert(0, str(TESTS))
    import torch
    from test_families import PARITY, save_tiny

    from kvjax.nn import load_hf_llama

    extra = PARITY[family][0]
    with tempfile.TemporaryDirectory() as folder:
        ref = save_tiny(folder, family, **(extra if isinstance(extra, dict) else {}))
        model = load_hf_llama(folder, weight_dtype="f32", kv_dtype="f32")
    toks = np.random.default_rng(0).integers(0, 97, size=(2, 11))
    with torch.no_grad():
        want = ref(torch.tensor(toks)).logits.numpy()
    errors = [np.abs(np.asarray(model(jnp.asarray(toks))) - want).max()]
    cache = model.init_cache(2, 13)
    logits, cache = model.prefill(jnp.asarray(toks[:, :3]), cache)
    got = [np.asarray(logits)]
    for t in range(3, 11):
        step, cache = model.decode(jnp.asarray(toks[:, t]), cache)
        got.append(np.asarray(step)[:, None])
    errors.append(np.abs(np.concatenate(got, axis=1) - want).max())
    return float(max(errors))


def table() -> pd.DataFrame:
    rows = []
    for family, (preset, features) in FAMILIES.items():
        rows.append({
            "model_type": family, "preset": preset, "features": features,
            "params": analytic.num_params(get_model_config(preset)),
            "kv_bytes_per_token_32k": kv_bytes_per_token(preset),
            "parity_max_abs_error": parity_error(family),
        })  # fmt: skip
        print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "family_table.csv")
    args = parser.parse_args(argv)
    df = table()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
