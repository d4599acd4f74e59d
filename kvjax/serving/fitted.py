"""A step-time model fitted to an engine's measured steps (`kvjax.measured.engine`), for the
simulator's clock: the same callable `model(batch) -> seconds` as `ClosedFormStepTime`, with
coefficients from non-negative least squares (scipy's `nnls`) instead of a chip's roofline.
Pure Python + numpy/scipy.

The features are what the engine runs for a batch (each entry T new tokens reaching context S):
- `step`: 1 (the scheduler's Python time, the dispatch and the wait for the sampled tokens);
- `decode`: 1 if any entry has T = 1 (one decode over all the engine's slots, whose attention
  reads every slot's `max_len` positions, masked: its cost depends on neither their number nor
  their contexts);
- `decodes`: the number of T = 1 entries (their tokens gathered and scattered by the host);
- `chunks_T<b>`: per bucket b, the number of entries with T > 1 padded to b (`buckets_for`):
  one extend each on its slot, one compiled program per bucket, whose attention reads the slot's
  `max_len` positions (masked), so its cost is in the bucket, not in T or S. Measured on this
  CPU (tiny-gqa widened to 4 layers of 256), a chunk's cost is far from linear in the bucket
  (2.4 ms at 4, 4.7 at 16, 7.1 at 128, 11.3 at 256): one coefficient a bucket, not a slope.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvjax.errors import KvjaxError

BASE = ("step", "decode", "decodes")
MIN_STEPS_PER_FEATURE = 2


def buckets_for(token_budget: int) -> tuple[int, ...]:
    """The padded lengths of the engine's prompt chunks: powers of two from 2 below the budget,
    and the budget itself."""
    out, b = [], 2
    while b < token_budget:
        out.append(b)
        b *= 2
    return (*out, token_budget) if token_budget >= 2 else ()


def bucket_of(tokens: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if b >= tokens:
            return b
    raise KvjaxError(f"a chunk of {tokens} tokens exceeds the largest bucket ({max(buckets)})")


def _pairs(batch) -> list[tuple[int, int]]:
    """(tokens, context) per entry, from `Scheduled` entries or from pairs already."""
    return [
        (s.tokens, s.context) if hasattr(s, "tokens") else (int(s[0]), int(s[1])) for s in batch
    ]


def feature_names(buckets: Sequence[int]) -> tuple[str, ...]:
    return (*BASE, *(f"chunks_T{b}" for b in buckets))


def features(batch, buckets: Sequence[int]) -> np.ndarray:
    """The row of `feature_names(buckets)` for one batch."""
    pairs = _pairs(batch)
    decodes = sum(1 for t, _ in pairs if t == 1)
    row = np.zeros(len(BASE) + len(buckets))
    row[:3] = 1.0, float(decodes > 0), decodes
    for t, _ in pairs:
        if t > 1:
            row[len(BASE) + list(buckets).index(bucket_of(t, buckets))] += 1
    return row


@dataclass(frozen=True)
class SpeedTrace:
    """A machine's speed over time, piecewise constant: from `starts_s[i]` on (seconds from the
    run's start), steps take `speeds[i]` times the fit's time; before the first start, the first
    speed. `simulate(..., speed=trace)` runs a simulation on the machine the engine had."""

    starts_s: tuple[float, ...]
    speeds: tuple[float, ...]

    def __post_init__(self):
        if not self.starts_s or len(self.starts_s) != len(self.speeds):
            raise KvjaxError("a speed trace needs one speed per start, at least one")
        if list(self.starts_s) != sorted(self.starts_s) or not all(v > 0 for v in self.speeds):
            raise KvjaxError("a speed trace's starts must be sorted and its speeds > 0")

    def __call__(self, t: float) -> float:
        return self.speeds[max(0, bisect.bisect_right(self.starts_s, t) - 1)]


@dataclass(frozen=True)
class FitReport:
    steps: int
    coefficients_s: dict[str, float]  # seconds per unit of each feature
    median_relative_error: float  # |predicted - measured| / measured, per step
    mean_relative_error: float
    total_relative_error: float  # sum(predicted) / sum(measured) - 1: the busy time's error
    # measured / predicted per step, over their mean: the machine's own variation, mean 1
    spread: tuple[float, ...]


class FittedStepTime:
    """seconds = features(batch) . coefficients (all >= 0); with `spread` (the fit's
    measured / predicted ratios), times one of them drawn at random (seeded) for each step: the
    steps of a machine that does not run a step in the same time twice (another process on its
    cores, its memory's modes), so a simulated percentile above the median sees that spread
    as the engine's does. Without it, every step takes the fit's mean time."""

    def __init__(
        self,
        coefficients_s: dict[str, float],
        buckets: Sequence[int],
        spread: Sequence[float] | None = None,
        seed: int = 0,
        names: Sequence[str] | None = None,
    ):
        full = feature_names(buckets)
        names = full if names is None else tuple(names)
        unknown = [f for f in names if f not in full]
        if unknown:
            raise KvjaxError(f"features {unknown} unknown; allowed: {list(full)}")
        missing = [f for f in names if f not in coefficients_s]
        if missing:
            raise KvjaxError(f"coefficients for {missing} missing; expected {list(names)}")
        if any(not coefficients_s[f] >= 0 for f in names):
            raise KvjaxError(f"coefficients must be >= 0, got {coefficients_s}")
        self.names = names
        self.coefficients_s = {f: float(coefficients_s[f]) for f in names}
        self.buckets = tuple(buckets)
        self._cols = [full.index(f) for f in names]
        self._w = np.array([self.coefficients_s[f] for f in names])
        self.spread = None if spread is None else np.asarray(spread, dtype=float)
        if self.spread is not None and not (self.spread.size and np.all(self.spread > 0)):
            raise KvjaxError("spread must hold ratios > 0")
        self._rng = np.random.default_rng(seed)

    def mean_s(self, batch) -> float:
        """The fitted mean time of one step (no spread drawn)."""
        return float(features(batch, self.buckets)[self._cols] @ self._w)

    def speed(self, steps: Sequence[tuple[Sequence, float]]) -> float:
        """The machine's speed over these measured (batch, seconds) steps, as the fit counts it:
        their measured time over their fitted mean time (1: as fitted; 1.3: 30% slower)."""
        fitted = sum(self.mean_s(b) for b, _ in steps)
        if not fitted > 0:
            raise KvjaxError(f"the fit gives these {len(steps)} steps no time: no speed")
        return sum(float(s) for _, s in steps) / fitted

    def speed_trace(self, steps: Sequence, per_window: int = 100) -> SpeedTrace:
        """The machine's speed over an engine's run: its measured steps (`MeasuredStep`s, with
        `start_s`) in consecutive windows of `per_window` steps (the last one merged into the
        window before when shorter than half), each window's `speed`, from its first step's
        start."""
        if per_window < 1 or not steps:
            raise KvjaxError(f"a speed trace needs steps and per_window >= 1 (got {per_window})")
        cuts = list(range(0, len(steps), per_window))
        if len(cuts) > 1 and len(steps) - cuts[-1] < per_window / 2:
            cuts.pop()
        bounds = [*cuts, len(steps)]
        windows = [steps[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        return SpeedTrace(
            tuple(float(w[0].start_s) for w in windows),
            tuple(self.speed([(s.batch, s.wall_s) for s in w]) for w in windows),
        )

    def window_spread(self, runs: Sequence[Sequence], per_window: int) -> tuple[float, ...]:
        """Each step's measured time over the fit's at its window's speed (`speed_trace` of its
        run, `MeasuredStep`s), over their mean: the variation left within windows, what a
        simulation given a speed trace draws (the fit's own spread, within whole runs, holds
        the drift inside a run that the trace already applies)."""
        ratios = []
        for steps in runs:
            trace = self.speed_trace(steps, per_window)
            ratios += [
                s.wall_s / (self.mean_s(s.batch) * trace(s.start_s))
                for s in steps
                if self.mean_s(s.batch) > 0
            ]
        r = np.array(ratios)
        return tuple((r / r.mean()).tolist())

    def scaled(
        self, speed: float, spread: Sequence[float] | None = None, seed: int = 0
    ) -> FittedStepTime:
        """The same model on a machine `speed` times slower (every coefficient times it)."""
        if not speed > 0:
            raise KvjaxError(f"speed={speed!r} must be > 0")
        return FittedStepTime(
            {f: c * speed for f, c in self.coefficients_s.items()},
            self.buckets,
            spread,
            seed,
            self.names,
        )

    def __call__(self, batch) -> float:
        mean_s = self.mean_s(batch)
        if self.spread is None:
            return mean_s
        return mean_s * float(self.spread[self._rng.integers(self.spread.size)])

    @classmethod
    def fit(
        cls,
        steps: Sequence[tuple[Sequence, float]],
        buckets: Sequence[int],
        names: Sequence[str] | None = None,
    ) -> tuple[FittedStepTime, FitReport]:
        """Fitted to (batch, measured seconds) pairs: a batch as `Scheduled` entries or
        (tokens, context) pairs (`kvjax.measured.engine.MeasuredStep`'s `batch`, `wall_s`), on
        `names` (all of `feature_names(buckets)` by default; fewer where an engine's limits merge
        some, `kvjax.serving.calibrate.identifiable`). Refused with too few steps, or steps that
        leave a feature undetermined."""
        from scipy.optimize import nnls

        full = feature_names(buckets)
        names = full if names is None else tuple(names)
        unknown = [n for n in names if n not in full]
        if unknown:
            raise KvjaxError(f"features {unknown} unknown; allowed: {list(full)}")
        need = MIN_STEPS_PER_FEATURE * len(names)
        if len(steps) < need:
            raise KvjaxError(
                f"fitting {len(names)} coefficients ({', '.join(names)}) needs at least "
                f"{need} measured steps; got {len(steps)}"
            )
        X = np.stack([features(b, buckets) for b, _ in steps])[:, [full.index(n) for n in names]]
        y = np.array([float(s) for _, s in steps])
        if not np.all(y > 0):
            raise KvjaxError("measured step times must be > 0 s")
        unseen = [n for n, c in zip(names, X.any(axis=0), strict=True) if not c]
        rank = np.linalg.matrix_rank(X)
        if unseen or rank < len(names):
            raise KvjaxError(
                f"the {len(steps)} steps determine {rank} of the {len(names)} coefficients"
                + (f" (none has {', '.join(unseen)})" if unseen else "")
                + ": give steps with and without decodes and prompt chunks in every bucket"
            )
        # plain least squares in seconds: the fitted busy time matches the measured one (a
        # queue near saturation moves with the total, more than with any one step)
        w, _ = nnls(X, y)
        model = cls(dict(zip(names, w.tolist(), strict=True)), buckets, names=names)
        pred = X @ w
        rel = np.abs(pred - y) / y
        # the spread keeps the mean: drawn ratios of mean 1 leave the expected busy time the
        # fit's (the ratios themselves average above 1: a slow step is 3x, a fast one 0.8x)
        ratio = y[pred > 0] / pred[pred > 0]
        report = FitReport(
            len(steps),
            dict(model.coefficients_s),
            float(np.median(rel)),
            float(rel.mean()),
            float(pred.sum() / y.sum() - 1),
            tuple((ratio / ratio.mean()).tolist()),
        )
        return model, report

    @classmethod
    def fit_runs(
        cls,
        runs: Sequence[Sequence[tuple[Sequence, float]]],
        buckets: Sequence[int],
        max_rounds: int = 200,
        tol: float = 1e-9,
        names: Sequence[str] | None = None,
    ) -> tuple[FittedStepTime, FitReport, list[float]]:
        """Fitted to several runs' steps on a machine whose speed moves between runs (a shared
        VM: the hypervisor takes its cores for tens of seconds at a time): each run's steps
        divided by that run's speed (`speed`, against the previous fit, relative to the first
        run's), refitted, until the speeds move by less than `tol` (refused if they still move
        after `max_rounds`). The shape (each feature's cost relative to the others) then comes
        from every run, and the spread is each step's variation within its run. Returns the
        model at the median run's speed, its report, and each run's speed against it."""
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
            raise KvjaxError(f"max_rounds={max_rounds!r} must be an integer >= 1")
        steps = [(b, s) for run in runs for b, s in run]
        model, report = cls.fit(steps, buckets, names)
        speeds = np.ones(len(runs))
        for _ in range(max_rounds):
            now = np.array([model.speed(run) for run in runs])  # the raw runs against the fit
            moved, speeds = np.max(np.abs(now / now[0] - speeds)), now / now[0]
            steps = [(b, s / v) for run, v in zip(runs, speeds, strict=True) for b, s in run]
            model, report = cls.fit(steps, buckets, names)
            if moved < tol:
                break
        else:  # a silently unconverged fit would put the runs' disagreement in the shape
            raise KvjaxError(
                f"fit_runs: the runs' speeds still moved by {moved:.3g} after max_rounds="
                f"{max_rounds} rounds (tol={tol:g}); the runs differ by more than a speed each "
                "(a different model, device or load): fit them apart, or raise max_rounds"
            )
        # at the median run's speed (1: a typical run; the others' speeds against it)
        typical = float(np.median(speeds))
        model = model.scaled(typical)
        report = dataclasses.replace(report, coefficients_s=dict(model.coefficients_s))
        return model, report, [model.speed(run) for run in runs]
