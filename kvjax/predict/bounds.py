"""kvjax's closed form for a corpus row's exact shape, and its bound on the row's chip.

- `attention_prefill`: the bound counts the exact causal (or full) pairs and Q, K, V and O
  once (`compulsory.compulsory_cost`); the implementation model the fused kernel
  (`kvjax.analytic.flash`), tiled and cached as the chip sizes it; causal or not. In fp8
  (FlashAttention-3's and cuDNN's fp8 forward) Q, K and V are read in one byte and O written in
  bf16.
- `attention_decode`: the bound the exact pairs and Q, the cache and O once; the model
  flash-decoding over a GQA cache (its splits' partials, its 64-row MMA tiles), or MLA's
  absorbed latent (one KV head of latent + rope key features, the latent also the values:
  FlashMLA); seq_q queries a sequence.
- `matmul`: one GEMM C[m, n] = A[m, k] B[k, n], 2mnk FLOPs, A and B read once and C written
  once (fp8 and int8 GEMMs write bf16); `batch` groups (MoE's grouped GEMMs) each with its own B.
- `decode_step` / `prefill_step`: the bound the step's FLOPs with the attention's exact pairs,
  the weights, the cache's attended keys read once and the new rows written once
  (`step_floor`); the model the whole step of a preset (fused attention, as compiled engines
  run it, every kernel's activations through HBM), weights in the row's dtype (int8/int4:
  weight-only, computed in bf16; fp8: weights and activations, every matmul at the chip's fp8
  peak, as TensorRT-LLM's and torchao's float8 rows run them: `matmul_dtype`), the cache in
  `kv_dtype` (bf16 when the column is absent or empty).
A row over `num_chips` chips is bounded by their aggregate roof (the step's FLOPs and bytes
spread evenly), overlapped with its tensor-parallel all-reduces' bytes at the link's line rate
(the max, no latency): lower than any real split, so still a bound. The prediction runs the
all-reduces after compute, as engines reach them (`collectives`: sourced bus bandwidth and
latency), serial with the rest (`Closed.serial_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvjax.analytic import compulsory, flash
from kvjax.analytic.costs import Workload
from kvjax.analytic.primitives import _matmul
from kvjax.analytic.step import step_cost
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec, get_chip
from kvjax.model.config import DTYPE_BYTES, ModelConfig, get_model_config
from kvjax.predict import implementations
from kvjax.predict.corpus import Row
from kvjax.predict.gemm import fp4_bits, gemm_family, gemm_tiles
from kvjax.predict.plans import decode_schedule, kvjax_schedule, pipeline_fill


@dataclass(frozen=True)
class Closed:
    """A row's closed form on its chip: the bound's FLOPs and bytes (what any implementation
    does), the implementation model's (one plan's tiles, re-reads and partials: `flops`,
    `bytes`, what `kvjax.predict.model` is fitted on), the roofs, the work units (tiles)."""

    flops: float
    bytes: float
    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    tiles: float  # programs the kernel launches (0: not a single kernel)
    cores: int
    tile_flops: float = 0.0  # FLOPs the tiles compute, padded rows included (0: = flops)
    bound_flops: float = 0.0  # exact FLOPs (0: = flops, a GEMM's or a step's count)
    bound_bytes: float = 0.0  # compulsory HBM bytes (0: = bytes)
    special_s: float = 0.0  # the plan's exponentials at the chip's special-function rate
    # a GEMM's chip's compute family (`compute_family`): the matmul class fits an e_c
    # per family, the one class whose rows span capped and uncapped designs in several groups
    family: str = ""
    launches: float = 1.0  # the times the model's fixed term is paid: a whole step's layers
    fill: float = 1.0  # the block loop's software pipeline: (n + 1) / n (`pipeline_fill`)
    # a step's tensor-parallel collectives as engines reach them (`collectives`), serial
    serial_s: float = 0.0
    # the same collectives' bytes at the link's line rate, no latency: the bound overlaps them
    link_s: float = 0.0
    # a decode kernel's busiest core's walk over the mean core's (`Schedule.stretch`), on both
    # sides of the model (0: the compute side's waves of `tiles` only)
    stretch: float = 0.0
    schedule: str = ""  # whose plan: an implementation's rule, or kvjax's

    @property
    def floor_flops(self) -> float:
        return self.bound_flops or self.flops

    @property
    def floor_bytes(self) -> float:
        return self.bound_bytes or self.bytes

    @property
    def bound_s(self) -> float:
        """max(exact FLOPs / peak, compulsory bytes / bandwidth, a step's collectives at the
        link's line rate): no implementation beats it."""
        return max(
            self.floor_flops / self.peak_flops_per_s,
            self.floor_bytes / self.bandwidth_bytes_per_s,
            self.link_s,
        )

    @property
    def bound_side(self) -> str:
        compute = self.floor_flops / self.peak_flops_per_s
        memory = self.floor_bytes / self.bandwidth_bytes_per_s
        if self.link_s > max(compute, memory):
            return "link"
        return "compute" if compute >= memory else "memory"

    @property
    def intensity(self) -> float:
        """The bound's intensity (exact FLOPs over compulsory bytes): where the roofline places
        the kernel."""
        return self.floor_flops / self.floor_bytes


def _peak(chip: ChipSpec, dtype: str, row: Row) -> float:
    try:
        return chip.peak(dtype)
    except KvjaxError as exc:
        raise KvjaxError(f"{row.where}: column 'dtype': {exc}") from None


def _attention_config(row: Row, dtype: str) -> ModelConfig:
    N = row.num_heads
    if row.latent_dim:  # MLA: DeepSeek-V3's layer with the row's heads and latent widths
        return get_model_config(
            "deepseek-v3",
            num_layers=1,
            num_heads=N,
            num_kv_heads=N,
            kv_lora_rank=row.latent_dim,
            qk_rope_head_dim=row.rope_dim or 64,
            attention_kernel="flash",
            kv_dtype=dtype,
            first_dense_layers=0,
            mla_decode="absorbed",
        )
    K = row.num_kv_heads or N
    if N % K:
        raise KvjaxError(
            f"{row.where}: column 'num_kv_heads': num_heads={N} is not "
            f"divisible by num_kv_heads={K}"
        )
    if not row.head_dim:
        raise KvjaxError(f"{row.where}: column 'head_dim': is empty; a GQA/MHA row needs it")
    w = dtype if DTYPE_BYTES.get(dtype, 1) >= 2 else "bf16"
    return ModelConfig(
        name="corpus-row",
        num_layers=1,
        d_model=N * row.head_dim,
        num_heads=N,
        num_kv_heads=K,
        head_dim=row.head_dim,
        d_ff=4 * N * row.head_dim,
        vocab_size=256,
        weight_dtype=w,
        kv_dtype=dtype,
        attention_kernel="flash",
        # a windowed row's one layer is a sliding one: its W key positions, itself included
        sliding_window=row.values.get("window") or 0,
        layer_pattern="L" if row.values.get("window") else "G",
    )


def closed_form(row: Row) -> Closed:
    """A corpus row's closed form on its chip (the module docstring, by kind)."""
    if row.kernel in ("attention_prefill", "attention_decode"):
        return _attention_closed(row)
    if row.kernel == "matmul":
        return _matmul_closed(row)
    return _step_closed(row)


def _roofs(row: Row) -> tuple[ChipSpec, int, float]:
    """The row's chip, its chips and their aggregate bandwidth."""
    chip = get_chip(row.chip)
    chips = row.num_chips or 1
    return chip, chips, chip.bandwidth_bytes_per_s * chips


def _attention_workload(row: Row) -> tuple[Workload, int]:
    """A fused attention row's workload (a prefill, a decode, or an extend of T queries on a
    longer cache) and its T."""
    if row.kernel == "attention_prefill":
        T = row.seq_q
        wl = Workload("prefill", row.batch, row.seq_kv or T)
        if wl.context != T:
            wl = Workload("extend", row.batch, wl.context, new_tokens=T)
        return wl, T
    T = row.seq_q or 1
    if T == 1:
        return Workload("decode", row.batch, row.seq_kv), T
    return Workload("extend", row.batch, row.seq_kv, new_tokens=T), T


def _attention_closed(row: Row) -> Closed:
    """A fused attention row: the bound (`compulsory`), the plan's tiles (`flash`), its
    programs, padded rows and pipeline fill, and its exponentials."""
    chip, chips, bw = _roofs(row)
    kind, dtype = row.kernel, row.dtype
    cfg = _attention_config(row, dtype)
    peak = _peak(chip, "fp8" if dtype == "fp8" else cfg.compute_dtype, row) * chips
    wl, T = _attention_workload(row)
    sched = decode_schedule(row, cfg, T, chip) if kind == "attention_decode" else None
    slower = 1.0  # the bound's peak over the peak the implementation's inner products run at
    if sched is not None and sched.implementation != implementations.KVJAX:
        tiles = flash.plan_for_chip(cfg, wl, chip, splits=sched.splits)
        if sched.compute_dtype:  # fp8 KV dequantized to 16 bits: the prediction's, not the bound's
            slower = peak / (_peak(chip, sched.compute_dtype, row) * chips)
    else:
        tiles = flash.plan_for_chip(cfg, wl, chip)
    causal = True if row.causal is None else row.causal
    sliding = bool(cfg.sliding_window)
    cost = flash.flash_attention_cost(cfg, wl, tiles, sliding=sliding, causal=causal)
    floor = compulsory.compulsory_cost(cfg, wl, sliding=sliding, causal=causal)
    flops = sum(k.flops for k in cost.kernels())
    nbytes = sum(k.bytes for k in cost.kernels())
    floor_bytes = floor.bytes
    if kind == "attention_prefill" and DTYPE_BYTES[dtype] < 2:
        # Q, K, V in fp8, O in bf16: the counts above read them in bf16
        a = DTYPE_BYTES[cfg.compute_dtype]
        o = row.batch * T * cfg.num_heads * cfg.head_dim * a
        nbytes = (nbytes - o) * DTYPE_BYTES[dtype] / a + o
        floor_bytes = (floor_bytes - o) * DTYPE_BYTES[dtype] / a + o
    shape = flash.attention_shape(cfg, "prefill" if kind == "attention_prefill" else "decode")
    fill = 1.0
    if kind == "attention_prefill":
        programs = row.batch * shape.query_heads * math.ceil(T / tiles.block_q)
        padded = flops
        fill = pipeline_fill(cost, row.batch, T)
    else:
        if sched is None or sched.implementation == implementations.KVJAX:
            sched = kvjax_schedule(cfg, wl, tiles, T, sliding)
        programs = sched.programs
        # the query rows a tile computes over those it needs (a KV head's G x T rows in one
        # MMA tile of 64 rows in kvjax's plan: 16 heads x 1..4 queries cost what 64 rows cost)
        padded = flops * sched.padding * slower
    exps = sum(k.transcendentals for k in cost.kernels())
    return Closed(
        flops,
        nbytes,
        peak,
        bw,
        programs,
        chip.num_cores or 1,
        padded,
        floor.flops,
        floor_bytes,
        special_seconds(exps, chip, chips),
        fill=fill,
        stretch=sched.stretch(chip.num_cores or 1) if sched is not None else 0.0,
        schedule=sched.implementation if sched is not None else "",
    )


def _matmul_closed(row: Row) -> Closed:
    """A GEMM row: 2mnk, each operand once, its work units (`gemm_tiles`), its family
    (`gemm_family`). An FP4 GEMM's bound reads its operands at 4 bits; the model reads their
    block scales too (`fp4_bits`: NVFP4's e4m3 a block of 16, MXFP4's e8m0 a block of 32)."""
    chip, chips, bw = _roofs(row)
    dtype = row.dtype
    groups = row.batch or 1
    a = DTYPE_BYTES[dtype] if dtype in DTYPE_BYTES else 0.5
    out = 2 if a < 2 else a
    one = _matmul("matmul", row.m, row.k, row.n, a, a, out=out)
    model = one
    if dtype == "fp4":
        scaled = a * fp4_bits(row.values.get("implementation")) / 4
        model = _matmul("matmul", row.m, row.k, row.n, scaled, scaled, out=out)
    peak = _peak(chip, "bf16" if dtype == "int4" else dtype, row) * chips
    tiles = gemm_tiles(row.m, row.n, row.k, groups, chip.num_cores or 1)
    return Closed(
        groups * one.flops,
        groups * model.bytes,
        peak,
        bw,
        tiles,
        chip.num_cores or 1,
        bound_bytes=groups * one.bytes,
        family=gemm_family(chip, dtype),
    )


def _step_closed(row: Row) -> Closed:
    """A whole step of a preset: the step's closed form, its floor (`step_floor` and the weights
    in their dtype), and over several chips its all-reduces, as engines reach them and at the
    link's line rate."""
    chip, chips, bw = _roofs(row)
    dtype = row.dtype
    cfg = step_config(row)
    phase = "decode" if row.kernel == "decode_step" else "prefill"
    wl = Workload(phase, row.batch, row.context)
    cost = step_cost(cfg, wl, chip)
    nbytes = cost.bytes - (cost.weight_bytes / 2 if dtype == "int4" else 0)  # half of int8's
    peak = _peak(chip, cfg.peak_dtype, row) * chips
    floor_flops, floor_bytes = step_floor(cfg, wl, chip)
    weights = cost.weight_bytes / 2 if dtype == "int4" else cost.weight_bytes
    floor_bytes += weights
    serial = line = 0.0
    if chips > 1:  # tensor parallel: the all-reduces, as engines run them and at the line rate
        from kvjax.predict.collectives import tensor_parallel_link

        serial = tensor_parallel_link(cfg, chip, chips, achieved=True)(wl.tokens, wl.batch)
        line = tensor_parallel_link(cfg, chip, chips, achieved=False)(wl.tokens, wl.batch)
    return Closed(
        cost.flops,
        nbytes,
        peak,
        bw,
        0,
        chip.num_cores or 1,
        bound_flops=floor_flops,
        bound_bytes=floor_bytes,
        launches=cfg.num_layers,
        serial_s=serial,
        link_s=line,
    )


def step_config(row: Row) -> ModelConfig:
    """A step row's preset in the row's dtypes: int4 weights as int8's config (their bytes
    halved by the caller), int8 and int4 weight-only in bf16, fp8 weights and activations with
    every matmul at fp8 (`matmul_dtype`: W8A8, the engines' FP8), fused attention."""
    return get_model_config(
        row.model,
        weight_dtype={"int4": "int8"}.get(row.dtype, row.dtype),
        kv_dtype=row.kv_dtype or "bf16",
        attention_kernel="flash",
        matmul_dtype="fp8" if row.dtype == "fp8" else "",
    )


def special_seconds(transcendentals: float, chip: ChipSpec, chips: int = 1) -> float:
    """`transcendentals` (a fused attention's exponentials) at the chip's special-function rate,
    over `chips` chips; 0 where the chip has no sourced rate (the model then leaves them out)."""
    rate = chip.special_function_ops_per_s
    return transcendentals / (rate * chips) if rate else 0.0


def step_floor(cfg: ModelConfig, wl: Workload, chip: ChipSpec) -> tuple[float, float]:
    """A step's bound for any implementation, weights aside (the caller adds them in the dtype
    they are stored): the FLOPs of every kernel but attention's core, whose exact pairs replace
    whatever form the config computes it in (XLA's scores, softmax and a.v, a fused kernel's
    tiles, a split's combine), and the bytes no engine avoids: the cache's keys some query
    attends read once (`compulsory.compulsory_cost`) and the new rows written once. An MLA
    model's step is counted in both of its forms (the latent absorbed or up-projected) and the
    least FLOPs and the least bytes are kept: an implementation may run either. The activations
    between kernels are left out: what reaches HBM between them is the engine's fusion, the
    implementation's choice."""
    from kvjax.model.checks import MLA_FORMS

    if cfg.is_mla:
        floors = [_step_floor(cfg.replace(mla_decode=form), wl, chip) for form in MLA_FORMS]
        return min(f for f, _ in floors), min(b for _, b in floors)
    return _step_floor(cfg, wl, chip)


def _step_floor(cfg: ModelConfig, wl: Workload, chip: ChipSpec) -> tuple[float, float]:
    from collections import Counter

    from kvjax import kernels
    from kvjax.analytic.step import step_kernels

    ks = step_kernels(cfg, wl, chip)
    core = {kernels.ATTENTION, kernels.ATTN_COMBINE, *kernels.ATTENTION_PARTS}
    flops = sum(k.flops for name, k in ks.items() if name not in core)
    nbytes = ks[kernels.KV_WRITE].kv_bytes if kernels.KV_WRITE in ks else 0.0
    kinds = Counter((cfg.layer_is_sliding(i), cfg.layer_kind(i)) for i in range(cfg.num_layers))
    for (sliding, letter), count in kinds.items():
        if letter in "AH":  # a layer with attention (H: beside Mamba-2's heads)
            c = compulsory.compulsory_cost(cfg, wl, sliding=sliding)
            flops += count * c.flops
            nbytes += count * c.kv_bytes
    return flops, nbytes
