"""Benchmark: three ways to run an MoE layer's experts on the machine at hand, the evidence for
kvjax's choice (`kvjax.nn.moe`: gather each token's k experts).

    python3 -m experiments.benchmarks.moe_experts [--out FILE]

The gate/up and down products of one MoE layer (d_model 1024, experts of 512, f32, k = 2) at
decode, B = 1 and 8 tokens, E = 8, 32, 64 experts, with the routing fixed to distinct experts per
token (token m takes experts 2m, 2m + 1):

- gather: each token's k experts' matrices gathered, then its products (kvjax's model);
- ragged_dot: the (token, expert) rows sorted by expert, `jax.lax.ragged_dot` over all E;
- dense: every token through every expert, weighted by a zero-padded gate.

For each: the median time, XLA's FLOPs and bytes of the lowered function, and the bytes the
touched experts hold (the least any form must read). A form whose time follows E rather than
B*k reads experts no token picked.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import jax
import jax.numpy as jnp

from kvjax.measured.timing import device_name, random_array, random_inputs, time_fn
from kvjax.runs.records import write_json_atomic

D, F, K = 1024, 512, 2


def forms(E: int, M: int):
    """(name -> fn(x, w_gu, w_down, idx, gates)) for one layer's experts."""

    def gather(x, w_gu, w_down, idx, gates):
        h = jnp.einsum("MD,MkED->MkE", x, w_gu[idx])
        h = jax.nn.silu(h[..., :F]) * h[..., F:]
        y = jnp.einsum("MkF,MkDF->MkD", h, w_down[idx])
        return jnp.einsum("MkD,Mk->MD", y, gates)

    def ragged(x, w_gu, w_down, idx, gates):
        flat = idx.reshape(-1)
        order = jnp.argsort(flat)
        rows = jnp.repeat(x, K, axis=0)[order]
        sizes = jnp.bincount(flat, length=E).astype(jnp.int32)
        h = jax.lax.ragged_dot(rows, jnp.swapaxes(w_gu, 1, 2), sizes)
        h = jax.nn.silu(h[:, :F]) * h[:, F:]
        y = jax.lax.ragged_dot(h, jnp.swapaxes(w_down, 1, 2), sizes)
        y = jnp.zeros_like(y).at[order].set(y).reshape(M, K, D)
        return jnp.einsum("MkD,Mk->MD", y, gates)

    def dense(x, w_gu, w_down, idx, gates):
        full = jnp.zeros((M, E), x.dtype).at[jnp.arange(M)[:, None], idx].set(gates)
        h = jnp.einsum("MD,XED->MXE", x, w_gu)
        h = jax.nn.silu(h[..., :F]) * h[..., F:]
        y = jnp.einsum("MXF,XDF->MXD", h, w_down)
        return jnp.einsum("MXD,MX->MD", y, full)

    return {"gather": gather, "ragged_dot": ragged, "dense": dense}


def run(experts=(8, 32, 64), tokens=(1, 8), budget_s=1.0):
    points = []
    for E in experts:
        seeds = random_inputs(E, 3)  # numpy-made: no threefry program to compile per shape
        w_gu = random_array(seeds[0], (E, 2 * F, D)) / 32
        w_down = random_array(seeds[1], (E, D, F)) / 32
        for M in tokens:
            if M * K > E:
                continue
            x = random_array(seeds[2], (M, D))
            idx = (jnp.arange(M)[:, None] * K + jnp.arange(K)[None, :]) % E
            gates = jnp.full((M, K), 1.0 / K, jnp.float32)
            args = (x, w_gu, w_down, idx, gates)
            want = None
            for name, fn in forms(E, M).items():
                jitted = jax.jit(fn)
                out = jitted(*args)
                want = out if want is None else want
                cost = jitted.lower(*args).cost_analysis()
                stats = time_fn(jitted, [args], budget_s=budget_s)
                points.append({
                    "form": name, "experts": E, "tokens": M, "k": K,
                    "median_s": stats.median_s, "iqr_s": stats.iqr_s,
                    "xla_flops": cost.get("flops"), "xla_bytes": cost.get("bytes accessed"),
                    "touched_expert_bytes": M * K * 3 * D * F * 4,
                    "all_expert_bytes": E * 3 * D * F * 4,
                    "max_abs_diff_vs_gather": float(jnp.abs(out - want).max()),
                })  # fmt: skip
    return {
        "benchmark": "moe_experts",
        "date": datetime.date.today().isoformat(),
        "device": device_name(),
        "jax": jax.__version__,
        "shape": {"d_model": D, "moe_d_ff": F, "experts_per_token": K, "dtype": "f32"},
        "points": points,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("experiments/results/moe_experts.json"))
    parser.add_argument("--budget", type=float, default=1.0)
    args = parser.parse_args(argv)
    result = run(budget_s=args.budget)
    write_json_atomic(args.out, result)
    print(f"{result['device']}, jax {result['jax']}")
    for p in result["points"]:
        print(
            f"  E={p['experts']:3d} M={p['tokens']} {p['form']:10s} {p['median_s'] * 1e3:8.3f} ms"
            f"  XLA {p['xla_flops'] / 1e6:8.1f} MFLOP {p['xla_bytes'] / 1e6:8.1f} MB"
            f"  touched experts {p['touched_expert_bytes'] / 1e6:6.1f} MB"
            f"  (all {p['all_expert_bytes'] / 1e6:6.1f} MB)"
            f"  |diff| {p['max_abs_diff_vs_gather']:.1e}"
        )


if __name__ == "__main__":
    main()
