"""An efficiency model per kernel class, fitted on measurements, with prediction intervals.

For a kernel of F FLOPs and Q HBM bytes on a chip of peak P and bandwidth BW, launched as n
tiles over c cores, the time predicted is

    t = n_0 t0 + s + max((F / P + X / R) f / (e_c * w), Q / (e_b * BW)),   w = n / (ceil(n / c) * c)

with X / R the fused attention's exponentials (one a computed (query, key) pair and query
head) at the chip's special-function rate R (`ChipSpec.special_function_ops_per_s`, sourced;
0 where not), serial with the matmuls as FlashAttention-2 runs them: no fitted parameter (the
exponentials' count per pair is the same at every head dimension, their share of the work
largest at 64). f = (b + 1) / b is a block loop's two-stage pipeline over the b key blocks each
of its programs runs (`plans.pipeline_fill`; 1 elsewhere), also no fitted parameter.

three physical parameters per class: a fixed launch and latency term t0, paid n_0 times (once for
a kernel; once per layer for a whole step, whose layers each launch their kernels and wait on
their tails, and over several chips on their all-reduces: a 7B model's step pays it 32 times, a
70B's 80), the fraction of peak
compute e_c that the class's best kernels reach (times w, the share of the last wave of tiles
that is busy: 133 tiles on 132 SMs take two waves), and the fraction of HBM bandwidth e_b. Both
fractions are at most 1, so a prediction never lies below its bound (up to t0 >= 0). A chip
family (`kvjax.predict.gemm.compute_family`: one compute design) with `FAMILY_ROWS` compute-bound
rows or more in the fit has its own e_c, fitted with t0 and e_b held and pulled towards the
class's (the H20, a GH100 capped to 148 TFLOP/s, runs its GEMMs at 0.96 of that peak, where the
H100's reach 0.8 of theirs); a family the fit never saw takes the class's.

A step over several chips adds its tensor-parallel all-reduces serially (`Features.serial_s`:
`collectives`, sourced constants), as engines run them between its kernels.

Fitted on Huber's loss of the log residual (`huber`: squared within 10%, linear beyond, so a row
an implementation leaves far from its bound moves the fit no more than one 10% off) over a grid
(refined twice), with a weak prior pulling
each efficiency towards 1 (a class whose rows are all memory-bound says nothing of e_c), on the
rows that are the fastest published measurement of their shape (what the best implementation
of the class reaches: FlashAttention-3 or cuDNN, FlashMLA or FlashInfer, cuBLAS or DeepGEMM, a
compiled engine); slower baselines stay in the corpus for the bound check only. Intervals are
split-conformal on leave-one-source-out residuals, nested: a source's 80% interval is the
finite-sample 10th and 90th percentile order statistics of log(measured / predicted) of the other
sources' rows, each predicted by a fit that saw neither them nor that source. Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from kvjax.errors import KvjaxError
from kvjax.predict import heldout

CLASSES = ("attention_prefill", "attention_decode", "matmul", "step")
_T0 = np.concatenate([[0.0], np.logspace(-7, -2.5, 28)])
_E = np.linspace(0.04, 1.0, 25)


def kernel_class(kernel: str) -> str:
    """The corpus's `kernel` column as a model class: the two whole steps share one."""
    return "step" if kernel in ("decode_step", "prefill_step") else kernel


@dataclass(frozen=True)
class Features:
    """What the model sees of one call: the closed form and the chip."""

    flops: float  # what the kernel's tiles compute (padded rows included)
    bytes: float
    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    tiles: float = 0.0  # 0: no wave term (a whole step)
    cores: int = 1
    # the softmax's exponentials at the chip's special-function rate (fused attention), seconds:
    # serial with the matmuls in the compute term (0: none, or no sourced rate)
    special_s: float = 0.0
    family: str = ""  # the GEMM's family (`gemm.gemm_family`)
    launches: float = 1.0  # n_0: the times the fixed term t0 is paid (a step: its layers)
    fill: float = 1.0  # the compute term's stretch for a block loop's pipeline fill, (n + 1) / n
    # time serial with the max: a whole step's tensor-parallel collectives, which engines run
    # between its kernels (`kvjax.predict.collectives`, sourced constants; 0: one chip)
    serial_s: float = 0.0
    # a decode kernel's busiest core over its mean core (`implementations.Schedule.stretch`): the
    # compute and memory times both stretched by it (0: the compute side's waves of `tiles`)
    stretch: float = 0.0


def _arrays(xs: Sequence[Features]):
    F = np.array([x.flops for x in xs], float)
    Q = np.array([x.bytes for x in xs], float)
    P = np.array([x.peak_flops_per_s for x in xs], float)
    BW = np.array([x.bandwidth_bytes_per_s for x in xs], float)
    n = np.array([x.tiles for x in xs], float)
    c = np.array([x.cores for x in xs], float)
    X = np.array([x.special_s for x in xs], float)
    fill = np.array([x.fill for x in xs], float)
    wave = np.where(n > 0, n / (np.ceil(np.maximum(n, 1) / c) * c), 1.0)
    stretch = np.array([x.stretch for x in xs], float)
    memory = np.where(stretch > 0, stretch, 1.0)
    compute = np.where(stretch > 0, stretch, 1.0 / wave)
    # compute and memory times at full efficiency
    return (F / P + X) * fill * compute, Q / BW * memory


def _launches(xs: Sequence[Features]) -> np.ndarray:
    return np.array([x.launches for x in xs], float)


def _serial(xs: Sequence[Features]) -> np.ndarray:
    return np.array([x.serial_s for x in xs], float)


@dataclass(frozen=True)
class Fit:
    """One class's parameters and its interval's log-residual quantiles."""

    t0_s: float
    compute_efficiency: float
    bandwidth_efficiency: float
    lo: float = 0.0  # log(measured / predicted) quantiles: the interval's ends
    hi: float = 0.0
    rows: int = 0
    sources: int = 0
    # (family, e_c) for the families the fit saw enough compute-bound rows of
    family_compute_efficiency: tuple[tuple[str, float], ...] = ()

    def compute_efficiency_of(self, family: str) -> float:
        """e_c for a chip family: its own where the fit gave it one, else the class's."""
        return dict(self.family_compute_efficiency).get(family, self.compute_efficiency)

    def compute_efficiencies(self, xs: Sequence[Features]) -> np.ndarray:
        return np.array([self.compute_efficiency_of(x.family) for x in xs], float)

    def predict(self, xs: Sequence[Features]) -> np.ndarray:
        tc, tm = _arrays(xs)
        ec = self.compute_efficiencies(xs)
        return (
            self.t0_s * _launches(xs)
            + _serial(xs)
            + np.maximum(tc / ec, tm / self.bandwidth_efficiency)
        )

    def interval(self, xs: Sequence[Features]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p = self.predict(xs)
        return p, p * math.exp(self.lo), p * math.exp(self.hi)

    def to_dict(self) -> dict:
        return self.__dict__ | {"family_compute_efficiency": dict(self.family_compute_efficiency)}


PRIOR = 0.01  # per row, on log(e)^2: an efficiency the rows cannot see stays near 1
FAMILY_ROWS = 3  # compute-bound rows of a chip family that give it its own e_c


HUBER = 0.1  # log residuals beyond 10% weigh linearly, not squared (`huber_loss`)


def huber_loss(r: np.ndarray, delta: float = HUBER) -> np.ndarray:
    """Huber's loss of log residuals: r^2 within +-delta, linear beyond. A robust fit: a row an
    implementation leaves far from its bound for reasons outside the model (TensorRT-LLM 0.6.1's
    70B at batch 480 at 0.21 of its bound, vLLM's int8 path at 0.25) pulls t0 and the
    efficiencies no harder than any row 10% off, where least squares let it move them for every
    other row. The reported error is a median, which the squared loss ignores."""
    a = np.abs(r)
    return np.where(a <= delta, r**2, 2 * delta * a - delta**2)


def _loss(tc, tm, y, t0, ec, eb, n0, serial):
    pred = (
        t0[:, None, None, None] * n0[None, None, None, :]
        + serial
        + np.maximum(
            tc[None, None, None, :] / ec[None, :, None, None],
            tm[None, None, None, :] / eb[None, None, :, None],
        )
    )
    prior = PRIOR * len(y) * (np.log(ec)[None, :, None] ** 2 + np.log(eb)[None, None, :] ** 2)
    return huber_loss(np.log(pred) - y).sum(-1) + prior


def fit(xs: Sequence[Features], measured_s: Sequence[float]) -> Fit:
    """Huber's loss (`huber_loss`) of log time over (t0, e_c, e_b), with the prior on the
    efficiencies, on a grid refined twice around its best."""
    if len(xs) < 2:
        raise KvjaxError(f"fitting needs at least 2 measurements, got {len(xs)}")
    tc, tm = _arrays(xs)
    n0, serial = _launches(xs), _serial(xs)
    y = np.log(np.asarray(measured_s, float))
    t0, ec, eb = _T0, _E, _E
    best = None
    for _ in range(3):
        err = _loss(tc, tm, y, t0, ec, eb, n0, serial)
        i, j, k = np.unravel_index(np.argmin(err), err.shape)
        best = (float(t0[i]), float(ec[j]), float(eb[k]))
        t0 = _around(t0, i, log=True)
        ec, eb = _around(ec, j, hi=1.0), _around(eb, k, hi=1.0)
    return Fit(
        *best, rows=len(xs), family_compute_efficiency=_families(xs, tc, tm, n0, serial, y, *best)
    )


def _families(
    xs, tc, tm, n0, serial, y, t0: float, ec: float, eb: float
) -> tuple[tuple[str, float], ...]:
    """Each family's e_c on its compute-bound rows (under the class's fit), t0 and e_b held,
    with the prior pulling it towards the class's e_c; the families with `FAMILY_ROWS` such
    rows or more."""
    grid = np.linspace(_E[0], 1.0, 241)
    fam = np.array([x.family for x in xs])
    bound = tc / ec > tm / eb
    out = []
    for name in sorted(set(fam) - {""}):
        sel = (fam == name) & bound
        if sel.sum() < FAMILY_ROWS:
            continue
        pred = (
            t0 * n0[sel]
            + serial[sel]
            + np.maximum(tc[sel][None, :] / grid[:, None], tm[sel][None, :] / eb)
        )
        err = huber_loss(np.log(pred) - y[sel]).sum(1) + PRIOR * sel.sum() * np.log(grid / ec) ** 2
        out.append((str(name), float(grid[np.argmin(err)])))
    return tuple(out)


def _around(grid: np.ndarray, i: int, log: bool = False, hi: float | None = None) -> np.ndarray:
    lo_v = grid[max(i - 1, 0)]
    hi_v = grid[min(i + 1, len(grid) - 1)]
    if log and lo_v == 0:
        lo_v = hi_v / 100 if hi_v > 0 else 0.0
    if log and lo_v > 0:
        out = np.concatenate([[0.0], np.geomspace(lo_v, max(hi_v, lo_v * 1.0001), 15)])
    else:
        out = np.linspace(lo_v, hi_v, 15)
    return np.clip(out, 1e-3, hi) if hi else out


@dataclass(frozen=True)
class Validation:
    """Leave-one-source-out: each row predicted by a fit that never saw its source (a source
    group: `kvjax.predict.corpus.Row.group`), inside an interval calibrated on residuals that
    never saw it either (nested)."""

    fit: Fit  # on every source, its interval from every source's held-out residuals
    held_out: np.ndarray  # the held-out prediction of each row (nan: no fit without its source)
    covered: np.ndarray  # inside its nested interval
    sources: list[str]
    ratio: np.ndarray = None  # predicted / measured, held out
    # per source: the fit on the other sources, with its nested interval ends (lo, hi)
    held_fits: dict = None

    @property
    def median_abs_error(self) -> float:
        return float(np.nanmedian(np.abs(self.ratio - 1)))

    @property
    def coverage(self) -> float:
        return float(np.mean(self.covered[~np.isnan(self.held_out)]))

    @property
    def median_interval_width(self) -> float:
        """The 80% interval's median width over the held-out rows, as a fraction of the
        prediction: (hi - lo) / predicted."""
        widths = [
            math.exp(f.hi) - math.exp(f.lo)
            for f in self.held_fits.values()
            for _ in range(f.rows_held)
        ]
        return float(np.median(widths)) if widths else float("nan")


@dataclass(frozen=True)
class HeldFit(Fit):
    """A fit without one source, its interval ends nested (from residuals of fits that left
    that source out too); `rows_held`: the source's rows it predicts."""

    rows_held: int = 0

    @classmethod
    def of(cls, model: Fit, lo: float, hi: float, sources: int, rows_held: int) -> HeldFit:
        """`model` (fitted without the source) with its nested interval's ends."""
        base = {f.name: getattr(model, f.name) for f in fields(Fit)}
        return cls(**{**base, "lo": lo, "hi": hi, "sources": sources}, rows_held=rows_held)


def leave_one_source_out(
    xs: Sequence[Features], measured_s: Sequence[float], sources: Sequence[str]
) -> Validation:
    """Fit once per source on the others: each row's held-out prediction, inside its nested
    80% interval (`heldout.leave_one_group_out`). The whole fit (for a source not in these
    rows) takes its interval from every source's held-out residuals."""
    y = np.asarray(measured_s, float)
    src = np.asarray(sources)
    names = sorted(set(sources))
    if len(names) < 2:
        raise KvjaxError(f"leave-one-source-out needs 2 sources or more, got {names}")

    def fitted_without(*left: str) -> Fit | None:
        keep = ~np.isin(src, left)
        if keep.sum() < 2:
            return None
        return fit([x for x, k in zip(xs, keep, strict=True) if k], y[keep])

    def predict(model: Fit, rows: np.ndarray) -> np.ndarray:
        return model.predict([x for x, r in zip(xs, rows, strict=True) if r])

    nested = heldout.leave_one_group_out(sources, y, fitted_without, predict)
    held_fits = {
        g: HeldFit.of(nested.alone[g], lo, hi, len(names) - 1, int((src == g).sum()))
        for g, (lo, hi) in nested.ends.items()
    }
    lo, hi = heldout.conformal_ends(nested.resid[~np.isnan(nested.resid)])
    full = fit(xs, y)
    full = replace(full, lo=float(lo), hi=float(hi), rows=len(y), sources=len(names))
    covered = nested.covered(sources)
    ratio = nested.predicted / y
    return Validation(full, nested.predicted, covered, names, ratio=ratio, held_fits=held_fits)
