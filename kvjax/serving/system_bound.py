"""What no deployment beats: a serving system's throughput and latency bounds for a workload of
fixed prompt and output lengths, on D chips serving as one replica (any split of them: tensor,
pipeline, expert parallel), whatever the scheduler does.

Each request prefills I tokens and decodes O - 1 more (the first output token is the prefill's).
Per request, the chips must at least

- compute its FLOPs: the prefill of I tokens and a decode at every context I + 1 .. I + O - 1, each
  with attention's exact pairs whatever form the model's config computes it in
  (`kvjax.predict.bounds.step_floor`) and the logits of one row a step (an engine samples from the
  last position only), at D x the peak of the matmul dtype;
- move its bytes: every decode reads the cache its context holds (R(S): keys, values, a hybrid's
  states) and every token's cache is written once; and the weights a decode step reads at least
  (W_step: the active experts of one token, the LM head, no embedding table) once a step. A step's
  requests are resident together: their caches sum to at most the memory the resident weights W
  leave, D M - W. So the requests' decodes take at least sum_S R(S) / (D M - W) steps, and the
  weights cost W_step a step, at D x the bandwidth.

The two are overlapped (the larger of them, not their sum): time per request >= max(FLOPs / (D P),
(sum R(S) (1 + W_step / (D M - W)) + R(I + O - 1)) / (D BW)), and output tokens/s <= O / that, in a
steady state of many requests (an offline run). Everything an engine does beyond this (a batch
limit, chunk sizes, pipeline bubbles, the link's collectives, activations, replicated KV heads)
only adds time, so it belongs to the prediction.

Two things engines do change the physics, and the bound takes them at their most favourable:

- Speculative decoding (MTP, EAGLE, n-gram): a verification step reads the cache and the weights
  once for up to k + 1 tokens (`spec_tokens` = k drafted). Every draft is taken as accepted (a
  stated mean acceptance does not bound how a run's steps fall), and a token t made by a step
  at context c has t <= c + k, so the decodes read at least sum_S R(S - k) / (k + 1). `spec_tokens`
  = inf: speculation used, its k unstated (then no read is charged to the decodes but the last
  token's cache).
- Prefix caching (`cached_fraction` f of the input tokens served from a cache): a cached token is
  charged no prefill FLOPs. A prefill's FLOPs are concave in the tokens computed on a given prompt
  (a suffix of T attends to all that precedes it), so over requests they are least when the hits
  fall on whole prompts: (1 - f) x the prompts' prefill FLOPs. Its cache is still read or written
  once (the prompt's keys are attended either way).

Latency: the first token takes at least the prefill of I tokens alone on the D chips (its FLOPs,
W_step and its cache written; with a prefix cache, one token at context I, a prompt served whole
from the cache); a later token at least a decode of one request at its context (FLOPs, and
W_step + R(S) over k + 1 tokens). No queueing is counted, so the bounds hold at every percentile.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

from kvjax import kernels
from kvjax.analytic import Workload, step_kernels
from kvjax.analytic.hybrid import state_bytes
from kvjax.analytic.params import weight_bytes
from kvjax.analytic.sizes import kv_cache_bytes
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig
from kvjax.predict.bounds import step_floor

LOGITS = (kernels.LM_HEAD, kernels.LOGIT_SCALE, kernels.LOGIT_SOFTCAP)
THROUGHPUT = {"output_tokens_per_s", "input_tokens_per_s", "requests_per_s"}
LATENCY = {f"{m}_{s}_s" for m in ("ttft", "tpot") for s in ("p50", "p99", "mean")}


def series_sum(f: Callable[[int], float], lo: int, hi: int, kinks: tuple[int, ...] = ()) -> float:
    """sum f(S) for S = lo .. hi, f affine between the `kinks` (a window's length): each piece
    summed as an arithmetic series; a piece whose middle is off its line (a kink not given) is
    summed term by term, so the sum is exact either way."""
    if hi < lo:
        return 0.0
    points = sorted({lo, hi, *(k for k in kinks if lo < k < hi)})
    total = 0.0
    for i, a in enumerate(points):
        last = i == len(points) - 1
        b = hi if last else points[i + 1] - 1  # S = a .. b in this piece
        if b < a:
            continue
        fa, fb = f(a), f(b)
        mid = (a + b) // 2
        line = fa + (fb - fa) * (mid - a) / (b - a) if b > a else fa
        if abs(f(mid) - line) > 1e-9 * max(abs(line), 1.0):
            total += sum(f(s) for s in range(a, b + 1))
        else:
            total += (b - a + 1) * (fa + fb) / 2
    return total


@dataclass(frozen=True)
class SystemBound:
    """Per request on one replica of `devices` chips: seconds of compute and of memory traffic
    (the larger is the bound), the steps its decodes need at least, and the latency bounds."""

    devices: int
    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    flops: float  # a request's, exact
    bytes: float  # its cache reads and writes, and its share of the steps' weight reads
    free_bytes: float  # D M - W: what the resident weights leave for the requests' caches
    compute_s: float
    memory_s: float
    output_tokens_per_s: float  # one replica, steady state
    input_tokens_per_s: float
    requests_per_s: float
    ttft_s: float
    tpot_s: float  # the first decode's (the least context)
    side: str

    def to_dict(self) -> dict:
        return asdict(self)


def _floor(cfg: ModelConfig, wl: Workload, chip: ChipSpec) -> tuple[float, float]:
    """`step_floor` with the logits of one row per request (an engine's sampled position)."""
    flops, nbytes = step_floor(cfg, wl, chip)
    if wl.phase == "prefill" and wl.context > 1:
        ks = step_kernels(cfg, wl, chip)
        logits = sum(ks[n].flops for n in LOGITS if n in ks)
        flops -= logits * (1 - 1 / wl.context)
    return flops, nbytes


def step_weight_bytes(cfg: ModelConfig) -> float:
    """The weights one decode of one token reads at least: its kernels' (the active experts, the
    LM head, one embedding row), in their dtypes."""
    ks = step_kernels(cfg, Workload("decode", 1, 64))
    return float(sum(k.weight_bytes for k in ks.values()))


@dataclass(frozen=True)
class _Request:
    """One request's terms on the replica: the roofs, the room the weights leave, and the FLOPs
    and bytes of its steps at each context."""

    cfg: ModelConfig
    chip: ChipSpec
    peak: float
    bw: float
    free: float
    w_step: float
    states: float

    def held(self, s: float) -> float:
        """R(S): what a decode at context S reads, and holds."""
        return float(kv_cache_bytes(self.cfg, int(s), 1)) + self.states

    def decode_flops(self, s: int) -> float:
        return _floor(self.cfg, Workload("decode", 1, s), self.chip)[0]

    def prefill_flops(self, length: float) -> float:
        """The prefill's FLOPs at a whole length, or between two (convex in the length, so the
        line between whole lengths stays at or below the mean of theirs)."""
        lo = math.floor(length)
        f_lo = _floor(self.cfg, Workload("prefill", 1, lo), self.chip)[0]
        if length == lo:
            return f_lo
        f_hi = _floor(self.cfg, Workload("prefill", 1, lo + 1), self.chip)[0]
        return f_lo + (length - lo) * (f_hi - f_lo)

    def kinks(self, shift: float = 0) -> tuple[float, ...]:
        """Where R(S - shift) bends: a window's length (and its sinks'), shifted."""
        c = self.cfg
        return tuple(k + shift for k in (c.sliding_window, c.sliding_window + c.sink_tokens) if k)


def _request(cfg, chip, devices, weight_scale) -> _Request:
    if chip.memory_bytes is None:
        raise KvjaxError(f"chip {chip.name!r} has no memory size: the bound needs one")
    resident = float(weight_bytes(cfg)) * weight_scale
    free = chip.memory_bytes * devices - resident
    if free <= 0:
        raise KvjaxError(
            f"{cfg.name}: weights of {resident:,.0f} B do not fit {devices} x {chip.name} "
            f"({chip.memory_bytes * devices:,.0f} B): more devices, or lighter weights"
        )
    return _Request(
        cfg,
        chip,
        chip.peak(cfg.peak_dtype) * devices,
        chip.bandwidth_bytes_per_s * devices,
        free,
        step_weight_bytes(cfg) * weight_scale,
        float(state_bytes(cfg, 1)),
    )


def _check(input_len, output_len, phase, spec_tokens, cached_fraction, prefill_len) -> None:
    if phase not in ("serve", "prefill", "decode"):
        raise KvjaxError(f"phase={phase!r} is not supported; allowed: serve, prefill, decode")
    if input_len < 1 or output_len < 1:
        raise KvjaxError(f"input_len={input_len} and output_len={output_len} must be >= 1")
    if not spec_tokens >= 0:
        raise KvjaxError(f"spec_tokens={spec_tokens!r} must be >= 0 (inf: used, k unstated)")
    if not 0 <= cached_fraction < 1:
        raise KvjaxError(f"cached_fraction={cached_fraction!r} must lie in [0, 1)")
    if prefill_len is not None and prefill_len < input_len:
        raise KvjaxError(
            f"prefill_len={prefill_len} (the mean prompt) is below input_len={input_len} "
            "(the shortest)"
        )


def system_bound(
    cfg: ModelConfig,
    chip: ChipSpec,
    devices: int,
    input_len: int,
    output_len: float,
    spec_tokens: float = 0,
    weight_scale: float = 1.0,
    phase: str = "serve",
    prefill_len: float | None = None,
    cached_fraction: float = 0.0,
) -> SystemBound:
    """The bounds of the module docstring for I = `input_len`, O = `output_len` (a mean: the
    bound of a convex cost at the mean lengths is a bound of their average, interpolated between
    whole lengths) on `devices` chips; refused, naming the bytes, where the weights alone do not
    fit them. `weight_scale`: the weights' bytes x this (FP4 weights sized from an fp8 model's).
    `phase` "prefill": a system that only prefills (per request its prompt: its FLOPs, its cache
    written); "decode": one that only decodes at the prompt's context I (per token).
    `prefill_len`: the prompts' mean length where `input_len` is their shortest: a prefill's FLOPs
    are convex in its length (linear, plus attention's pairs), so the prefill at the mean length
    computes at most the mean of theirs (Jensen) and the prefill FLOPs are taken there; the
    decodes, the bytes and the latencies stay at the shortest prompt (their cost couples the
    prompt and the output, whose joint distribution is not published). `spec_tokens` and
    `cached_fraction`: speculation and a prefix cache, as the module docstring takes them."""
    _check(input_len, output_len, phase, spec_tokens, cached_fraction, prefill_len)
    if output_len != int(output_len):  # a mean: interpolate the per-request times
        return _between_lengths(
            cfg,
            chip,
            devices,
            input_len,
            output_len,
            spec_tokens,
            weight_scale,
            phase,
            prefill_len,
            cached_fraction,
        )
    r = _request(cfg, chip, devices, weight_scale)
    I, O, k = input_len, int(output_len), spec_tokens  # noqa: E741
    computed = 1 - cached_fraction  # the prompts' share whose prefill is computed
    prefill_flops = r.prefill_flops(I)
    mean_prefill_flops = r.prefill_flops(prefill_len or I) * computed
    if phase == "prefill":  # prompts alone, batched: the weights amortised away
        flops, nbytes, tokens = mean_prefill_flops, r.held(I), 1
    elif phase == "decode":  # one token at context I + 1, its step's weights shared
        flops, tokens = r.decode_flops(I + 1), 1
        nbytes = r.held(max(I + 1 - k, 1)) * (1 + r.w_step / r.free) / (1 + k)
    else:
        flops = mean_prefill_flops + series_sum(r.decode_flops, I + 1, I + O - 1, r.kinks())
        reads = _decode_reads(r, I, O, k)
        nbytes = reads * (1 + r.w_step / r.free) + r.held(I + O - 1)  # the last is not fed back
        tokens = O
    compute_s, memory_s = flops / r.peak, nbytes / r.bw
    t = max(compute_s, memory_s)
    first = r.decode_flops(I) if cached_fraction else prefill_flops  # a prompt cached whole
    ttft = max(first / r.peak, (r.w_step + r.held(I)) / r.bw)
    tpot = max(r.decode_flops(I + 1) / r.peak, (r.w_step + r.held(I + 1)) / r.bw / (1 + k))
    return SystemBound(
        devices,
        r.peak,
        r.bw,
        flops,
        nbytes,
        r.free,
        compute_s,
        memory_s,
        output_tokens_per_s=tokens / t,
        input_tokens_per_s=(prefill_len or I) / t,
        requests_per_s=1 / t,
        ttft_s=ttft,
        tpot_s=tpot,
        side="compute" if compute_s >= memory_s else "memory",
    )


def _decode_reads(r: _Request, I: int, O: int, k: float) -> float:  # noqa: E741
    """What a request's decodes read at least: sum_S R(S - k) / (k + 1) over S = I + 1 ..
    I + O - 1 (R at I + 1 at least); with k unstated (inf), nothing."""
    if math.isinf(k):
        return 0.0

    def shifted(s: int) -> float:
        return r.held(max(s - k, I + 1))

    return series_sum(shifted, I + 1, I + O - 1, (I + 1 + k, *r.kinks(k))) / (1 + k)


def _between_lengths(cfg, chip, devices, I, O, k, scale, phase, prefill_len, cached):  # noqa: E741
    """A mean output length between whole ones: the per-request times interpolated."""
    lo, hi = (
        system_bound(cfg, chip, devices, I, n, k, scale, phase, prefill_len, cached)
        for n in (math.floor(O), math.ceil(O))
    )
    w = O - math.floor(O)
    comp = (1 - w) * lo.compute_s + w * hi.compute_s
    mem = (1 - w) * lo.memory_s + w * hi.memory_s
    t = max(comp, mem)
    return dataclasses.replace(
        lo,
        flops=(1 - w) * lo.flops + w * hi.flops,
        bytes=(1 - w) * lo.bytes + w * hi.bytes,
        compute_s=comp,
        memory_s=mem,
        output_tokens_per_s=O / t,
        input_tokens_per_s=(prefill_len or I) / t,
        requests_per_s=1 / t,
        side="compute" if comp >= mem else "memory",
    )


def metric_bound(b: SystemBound, metric: str) -> float:
    """The bound of one metric for one replica: the most for a throughput, the least for a
    latency (every percentile)."""
    if metric == "output_tokens_per_s":
        return b.output_tokens_per_s
    if metric == "input_tokens_per_s":
        return b.input_tokens_per_s
    if metric == "requests_per_s":
        return b.requests_per_s
    if metric.startswith("ttft_"):
        return b.ttft_s
    if metric.startswith("tpot_"):
        return b.tpot_s
    raise KvjaxError(
        f"metric={metric!r} is not supported; allowed: {', '.join(sorted(THROUGHPUT | LATENCY))}"
    )
