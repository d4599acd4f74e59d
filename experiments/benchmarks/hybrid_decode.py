"""Benchmark: the decode step of a small hybrid model (layers whose state does not grow beside
attention layers) over the context S, against the same model with attention in every layer, on
the machine at hand.

    python3 -m experiments.benchmarks.hybrid_decode [--preset lfm2-1.2b] [--batch 1] [--out FILE]

A hybrid preset cut to a small f32 model (`SMALL`: d_model 512, 8 / 4 heads of 128, the preset's
layer kinds over its first layers; the state layers' own sizes scaled down), and the same model
with every layer attention. Each point is a real context: a cache of S - 1 rows filled by
`prefill` with S - 1 - `room` random tokens, then the served decode step (`CompiledSteps.decode`:
attend, then the donated append) run over the remaining rows; the attention reads the cache's
S - 1 rows whatever the position (the rows not yet written are masked), so every step is the
step at S. Points are timed interleaved, round-robin, the read ceiling measured before each round
(DESIGN.md: this kind of machine reads memory in two modes), and placed under the closed form's
bound (`kvjax.analytic.step_cost`) at this run's best read ceiling. The hybrid's time grows with S
only through its attention layers' caches; its state layers' states stay flat.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvjax import analytic
from kvjax.analytic import Workload, roofline
from kvjax.analytic.hybrid import state_bytes
from kvjax.errors import KvjaxError
from kvjax.measured.ceilings import ReadCeiling, in_run_ceilings, load_or_measure_ceilings
from kvjax.measured.kernels import check_fits
from kvjax.measured.timing import device_name
from kvjax.model.config import get_model_config
from kvjax.runs.records import write_json_atomic
from kvjax.traced.step import cache_len

# Small enough that the attention layers' caches weigh against the weights over S = 512 .. 4096
# at B = 1 (the attention-only lfm2 cut: 90 MiB of weights, 16 MiB of cache a layer at 4096).
COMMON = dict(
    d_model=512, num_heads=8, num_kv_heads=4, head_dim=128, d_ff=1536, vocab_size=8192,
    weight_dtype="f32", kv_dtype="f32",
)  # fmt: skip
# Each preset's first layers (its kinds as it tiles them) and its state layers scaled to d_model
# 512; Qwen3-Next dense (its MoE is not what this benchmark is about), RoPE on a quarter.
SMALL = {
    "lfm2-1.2b": dict(num_layers=6),  # C C A C C A; conv_kernel 3
    "qwen3-next-80b-a3b": dict(
        num_layers=8, rotary_dim=32, num_experts=0, experts_per_token=0, moe_d_ff=0,
        num_shared_experts=0, shared_expert_gate=False, state_heads=8, state_groups=4,
        state_key_dim=64, state_value_dim=64,
    ),  # D D D A D D D A
    "falcon-h1-7b": dict(
        num_layers=4, state_heads=8, state_groups=1, state_key_dim=64, state_value_dim=64,
    ),  # H H H H: Mamba-2 beside every attention
}  # fmt: skip
STATE_FIELDS = dict(
    state_heads=0, state_groups=0, state_key_dim=0, state_value_dim=0, conv_kernel=0,
    conv_bias=False, state_norm=False,
)  # fmt: skip


def small(preset: str):
    """(the small hybrid, the same model with attention in every layer)."""
    if preset not in SMALL:
        raise KvjaxError(f"preset={preset!r} has no small cut here; allowed: {', '.join(SMALL)}")
    hybrid = get_model_config(preset).replace(name=f"small-f32-{preset}", **COMMON, **SMALL[preset])
    full = hybrid.replace(name=f"small-f32-{preset}-attention", layer_kinds="A", **STATE_FIELDS)
    return hybrid, full


class _Point:
    """One (model, S): a cache of S - 1 rows filled by prefill, and `room` rows left to decode."""

    def __init__(self, model, steps, batch: int, context: int, room: int, seed: int):
        cfg = model.cfg
        self.cfg, self.wl = cfg, Workload("decode", batch, context)
        rows = cache_len("decode", context)
        rng = np.random.default_rng(seed)  # numpy-made ids: no program to compile per shape
        prompt_BT = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, rows - room)), jnp.int32)
        self.tokens_B = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch,)), jnp.int32)
        self.steps, self.room = steps, room
        cache = model.init_cache(batch, rows)
        lengths_B = jnp.full((batch,), rows - room, jnp.int32)
        _, self.cache = steps.prefill(steps.state, prompt_BT.astype(jnp.int32), cache, lengths_B)
        jax.block_until_ready(self.cache)
        self.times_s: list[float] = []
        self.round_median_s: list[float] = []

    def run(self, n: int) -> list[float]:
        if n > self.room:
            raise KvjaxError(f"{n} more steps would run past the cache ({self.room} rows left)")
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            _, self.cache = self.steps.decode(self.tokens_B, self.cache)
            jax.block_until_ready(self.cache)
            out.append(time.perf_counter() - t0)
        self.room -= n
        return out


def _compiled(cfg):
    """The model (random weights) and its jitted steps, as `kvjax.nn.generate` runs them."""
    from kvjax.nn import CompiledSteps, Transformer

    model = Transformer(cfg, rngs=nnx.Rngs(0))
    return model, CompiledSteps(model)


def run(preset="lfm2-1.2b", contexts=(512, 1024, 2048, 4096), batch=1, rounds=3, budget_s=1.0,
        room=128):  # fmt: skip
    hybrid, full = small(preset)
    if min(contexts) < room + 2:
        raise KvjaxError(f"every context must be >= room + 2 = {room + 2}: the prompt and room")
    needed = sum(
        analytic.weight_bytes(c)
        + sum(analytic.kv_cache_bytes(c, s, batch) + state_bytes(c, batch) for s in contexts)
        for c in (hybrid, full)
    )
    check_fits(f"the two models and their {2 * len(contexts)} caches", needed)
    compiled = {cfg.name: _compiled(cfg) for cfg in (hybrid, full)}
    points = [
        _Point(*compiled[cfg.name], batch, s, room, seed=i)
        for i, (s, cfg) in enumerate((s, cfg) for s in contexts for cfg in (hybrid, full))
    ]
    per_step = []
    for p in points:  # compile, warm up, and size each turn
        p.run(2)
        per_step.append(p.run(1)[0])
    bandwidth = []
    read_ceiling = ReadCeiling()
    for _ in range(rounds):
        bandwidth.append(read_ceiling())
        for p, one_s in zip(points, per_step, strict=True):
            n = max(3, int(budget_s / rounds / max(one_s, 1e-6)))
            this_round = p.run(min(n, (room - 3) // rounds))
            p.times_s += this_round
            p.round_median_s.append(statistics.median(this_round))
    ceilings = in_run_ceilings(load_or_measure_ceilings(), bandwidth)
    bw, peak = ceilings.bandwidth_bytes_per_s, ceilings.peak("f32")
    out = []
    for p in points:
        step = analytic.step_cost(p.cfg, p.wl)
        bound = roofline.point("decode step", step.flops, step.bytes, peak, bw)
        q25, q75 = np.quantile(p.times_s, [0.25, 0.75])
        median_s = statistics.median(p.times_s)
        out.append({
            "model": "hybrid" if p.cfg is hybrid else "attention only",
            "layer_kinds": "".join(p.cfg.layer_kind(i) for i in range(p.cfg.num_layers)),
            "batch": batch, "context": p.wl.context,
            "kv_cache_bytes": analytic.kv_cache_bytes(p.cfg, p.wl.context, batch),
            "state_bytes": state_bytes(p.cfg, batch),
            "closed_step_bytes": step.bytes, "closed_step_flops": step.flops,
            "bound_s": bound.bound_s, "median_s": median_s, "iqr_s": float(q75 - q25),
            "runs": len(p.times_s), "round_median_s": p.round_median_s,
            "fraction_of_bound": bound.bound_s / median_s,
        })  # fmt: skip
    return {
        "benchmark": "hybrid_decode",
        "date": datetime.date.today().isoformat(),
        "device": device_name(),
        "jax": jax.__version__,
        "preset": preset,
        "model": hybrid.to_dict(),
        "attention_only": full.to_dict(),
        "ceilings": ceilings.to_dict(),
        "points": out,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="lfm2-1.2b", choices=sorted(SMALL))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--budget-s", type=float, default=1.0, help="timing per point, all rounds")
    parser.add_argument(
        "--out", type=Path, help="default experiments/results/hybrid_decode_<preset>.json"
    )
    args = parser.parse_args(argv)
    out = args.out or Path(f"experiments/results/hybrid_decode_{args.preset}.json")
    result = run(args.preset, tuple(args.contexts), args.batch, budget_s=args.budget_s)
    write_json_atomic(out, result)
    bw = result["ceilings"]["bandwidth_bytes_per_s"]
    print(
        f"{result['device']}, read ceiling {bw / 1e9:.1f} GB/s, {args.preset} cut small, "
        f"B={args.batch}"
    )
    for p in result["points"]:
        print(
            f"  S={p['context']:>6} {p['model']:>14} ({p['layer_kinds']}): "
            f"{p['median_s'] * 1e3:7.2f} ms (IQR {p['iqr_s'] * 1e3:.2f}), bound "
            f"{p['bound_s'] * 1e3:6.2f} ms, KV {p['kv_cache_bytes'] / 2**20:6.1f} MiB + states "
            f"{p['state_bytes'] / 2**20:5.2f} MiB, {100 * p['fraction_of_bound']:.0f}% of bound"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
