"""`kvjax plan`: the deployment a workload should run on N chips, searched over placements (tensor
and pipeline parallel copies, expert parallelism over data-parallel attention groups, replicas;
prefill and decode together or apart as xP + yD: `kvjax.serving.plan_options`), KV dtypes and the
engine's batch, each option with its bound beside its prediction.

Each option is a `Deployment` (`kvjax.serving.deployment`) whose steps are predicted from the
published kernels (`KernelStepTime` on every corpus row's fits, the engine steps' fixed time and
its 80% interval: `system_predict.held_fits(None)`). Its bound is the system bound of one replica's
chips (`system_bound`: exact FLOPs and compulsory bytes over the replica's peaks, whatever the
split; prefill and decode apart are a split too), per chip. A disaggregated option is simulated
whole (every instance, the whole load); the others one replica at its share. The search:

1. every placement of the chips that holds the model, by the memory check the engine's pool makes
   (refused with the bytes);
2. pruned by the bound: an option whose TTFT or TPOT bound misses the SLO cannot meet it;
3. options screened in the order of their bounds, and one whose bound is below the best found
   under the SLO is not (no option beats its bound); each screened one served offline first
   (as many requests as its copies take), which brackets its rate from above;
4. under the load: at `--rate` or `--concurrency`, else at the highest Poisson rate whose TTFT and
   TPOT hold at the percentile (`slo_search.slo_prediction`, MLPerf's Server scenario); the
   interval from runs with every step at the interval's ends.

The answer (`kvjax.serving.plan_report`): every option's bound, prediction and interval, the
Pareto frontier of output tokens/s per chip against tokens/s per user, and the best option that
meets the SLO with its `kvjax simulate` command. Step costs are cached by the device's model
across options.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig
from kvjax.serving.deployment import Deployment, EngineSettings
from kvjax.serving.load import generate
from kvjax.serving.plan_options import Option, Traffic, disaggregated, placements
from kvjax.serving.simulate import report
from kvjax.serving.slo_search import slo_percentiles, slo_prediction

SCREEN_MIN = 50  # the least requests a replica serves in a screening run (half of them)
SCREEN_STEPS = 5  # bisections of a screened option's rate under the SLO
REFINE = 3  # the best options under the SLO refined beside the screened frontier
FRONTIER = 4  # the screened frontier's points refined, at most (spread along it)


@dataclass
class Planner:
    """The search of the module docstring for one model on `chips` chips of one kind."""

    model: ModelConfig
    chip: ChipSpec
    chips: int
    traffic: Traffic
    engine: EngineSettings
    kv_dtypes: tuple[str, ...]
    max_batches: tuple[int, ...]
    progress: Callable[[str], None] | None = None
    nodes: int = 1
    link_bytes_per_s: float | None = None  # the KV's link, disaggregated (None: the chip's)
    fits: Any = None  # the kernels' and steps' fits (None: every corpus row's, `held_fits`)
    weight_scale: float = 1.0  # the weights' bytes against the config's dtype (NVFP4 on fp8)
    screen_requests: int | None = None  # a replica's in a screening run (None: half, >= 50)
    refined_best: int = REFINE
    refined_edge: int = FRONTIER
    _steps: dict = field(default_factory=dict)
    _bounds: dict = field(default_factory=dict)

    def options(self) -> list[Option]:
        """Every placement, and (under arrivals: the simulator's disaggregation runs no closed
        loop) every xP + yD, with each KV dtype and batch."""
        split = [(p, None) for p in placements(self.model, self.chips, self.nodes)]
        if self.traffic.concurrency is None:
            split += disaggregated(self.chips, self.nodes)
        return [
            Option(p, kv, mb, instances)
            for p, instances in split
            for kv in self.kv_dtypes
            for mb in self.max_batches
        ]

    @property
    def link(self) -> float:
        """The disaggregated KV's bandwidth a chip, B/s: the link given, else (one node) the
        chip's interconnect."""
        if self.link_bytes_per_s:
            return self.link_bytes_per_s
        if self.nodes > 1 or not self.chip.interconnect_bytes_per_s:
            raise KvjaxError(
                f"the KV's link between prefill and decode instances on {self.nodes} node(s) of "
                f"{self.chip.name} is not known: give --link-gb-per-s"
            )
        return self.chip.interconnect_bytes_per_s

    def _fits(self):
        from kvjax.serving.system_predict import held_fits

        return self.fits or held_fits(None)

    def _step_model(self, dev: ModelConfig, chip: ChipSpec):
        """One KernelStepTime a device model, shared by every option that runs it."""
        from kvjax.serving.step_time import KernelStepTime

        key = (dev, chip.name)
        if key not in self._steps:
            fits = self._fits()
            self._steps[key] = KernelStepTime(
                dev, chip, fits.kernels, fits.overhead, self.weight_scale
            )
        return self._steps[key]

    def deployment(self, o: Option) -> Deployment:
        """One replica of the option (its replicas serve a share of the load each, as
        `system_predict` runs a published row's)."""
        cfg = self.model.replace(kv_dtype=o.kv_dtype, attention_kernel="flash")
        t = self.traffic
        return Deployment(
            cfg,
            self.chip,
            t.prompt_len + t.output_len,
            replace(o.placement, replicas=1),
            replace(self.engine, max_batch=o.max_batch),
            self._step_model,
            achieved=True,
            weight_scale=self.weight_scale,
        )

    def bound(self, o: Option) -> dict[str, float]:
        """The option's system bound: output tokens/s per chip, TTFT and TPOT (any split of the
        replica's chips; at a rate no more than the rate's tokens)."""
        from kvjax.serving.system_bound import system_bound

        t = self.traffic
        key = (o.kv_dtype, o.devices)  # all it depends on: computed once a key, for the search
        if key not in self._bounds:
            cfg = self.model.replace(kv_dtype=o.kv_dtype, attention_kernel="flash")
            self._bounds[key] = system_bound(
                cfg,
                self.chip,
                o.devices,
                t.prompt_len,
                t.output_len,
                weight_scale=self.weight_scale,
            )
        b = self._bounds[key]
        per_chip = b.output_tokens_per_s / o.devices
        if t.rate is not None:
            per_chip = min(per_chip, t.rate * t.output_len / self.chips)
        return {"per_chip": per_chip, "ttft_s": b.ttft_s, "tpot_s": b.tpot_s}

    def _serve(self, d: Deployment, o: Option, requests: int) -> Callable[[float, float], Any]:
        t = self.traffic

        def serve(rate: float, factor: float = 1.0):
            """One replica's `requests` at its share of the rate (Poisson; a round-robin router
            hands a replica every R-th arrival, less bursty: the prediction errs slow) or of
            the clients, each step `factor` times as long."""
            prompts = generate(requests, rate, str(t.prompt_len), str(t.output_len), 0)
            if o.instances:
                return d.run_disaggregated(prompts, self.link, 0.0, o.instances, factor)
            clients = None
            if t.concurrency is not None:
                clients = max(1, t.concurrency // o.placement.replicas)
            return d.run(prompts, factor, concurrency=clients)

        return serve

    def _measure(self, o: Option, result) -> dict[str, float]:
        r = report(result)
        ttft, tpot = slo_percentiles(result, self.traffic.percentile)
        itl = r["itl_s"]["mean"]
        return {
            "per_chip": r["throughput_tokens_per_s"] * o.placement.replicas / self.chips,
            "per_user": 1 / itl if itl else math.inf,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "preemptions": r["preemptions"],
        }

    def _base(self, o: Option) -> tuple[dict[str, Any], Deployment | None]:
        """An option refused (its memory) or pruned by its bound (it misses the SLO), or its
        bound and deployment to run."""
        t = self.traffic
        out: dict[str, Any] = {"option": o.label, **_placement(o), "status": "predicted"}
        d = self.deployment(o)
        try:
            d.pool  # noqa: B018 (the memory check: refused with the bytes)
            bound = self.bound(o)
        except KvjaxError as exc:
            return out | {"status": "refused", "why": str(exc)}, None
        out["bound"] = bound["per_chip"]
        out["bound_ttft_s"], out["bound_tpot_s"] = bound["ttft_s"], bound["tpot_s"]
        if t.has_slo and not t.meets(bound["ttft_s"], bound["tpot_s"]):
            return out | {"status": "pruned", "why": "its bound misses the SLO"}, None
        return out, d

    def _slo_row(self) -> dict[str, float]:
        t = self.traffic
        return {
            "slo_percentile": t.percentile / 100,
            "slo_ttft_s": t.slo_ttft_s if t.slo_ttft_s is not None else math.inf,
            "slo_tpot_s": t.slo_tpot_s if t.slo_tpot_s is not None else math.inf,
        }

    def screen(self, o: Option, d: Deployment) -> dict[str, Any]:
        """A quick look at the option: half the requests, no interval; under an SLO the
        largest rate that holds it in `SCREEN_STEPS` bisections of the 16x bracket below its
        offline rate (within 1.09x)."""
        t = self.traffic
        n = self.screen_requests or max(SCREEN_MIN, t.requests // 2)
        serve = self._serve(d, o, n * o.units)
        offline = serve(1e9)
        out = {"offline": self._measure(o, offline)["per_chip"]}
        share = o.placement.replicas  # the replicas the load is split over
        if t.rate is not None or t.concurrency is not None:
            at = self._measure(o, serve((t.rate or 1e9) / share))
            return out | {
                "screened": at["per_chip"],
                "screened_per_user": at["per_user"],
                "screened_meets": t.meets(at["ttft_s"], at["tpot_s"]),
            }
        top = report(offline)["throughput_tokens_per_s"] / t.output_len
        lo, hi, best = top / 16, top, None
        for _ in range(SCREEN_STEPS):
            mid = math.sqrt(lo * hi)
            at = self._measure(o, serve(mid))
            if t.meets(at["ttft_s"], at["tpot_s"]):
                lo, best = mid, at
            else:
                hi = mid
        if best is None:
            return out | {"screened": 0.0, "screened_per_user": 0.0, "screened_meets": False}
        # the rate's tokens, not the short run's (its ramp and drain weigh on a few requests),
        # at most what the option serves offline (a short run holds an SLO a long one would not)
        return out | {
            "screened": min(lo * share * t.output_len / self.chips, out["offline"]),
            "screened_per_user": best["per_user"],
            "screened_meets": True,
        }

    def refine(self, o: Option, d: Deployment) -> dict[str, Any]:
        """The option's prediction with all its requests and its 80% interval: under an SLO by
        `slo_prediction` (MLPerf's Server: the rate bisected 8 times, its ends 4 more)."""
        t = self.traffic
        fits = self._fits()
        ends = (math.exp(fits.overhead.lo), math.exp(fits.overhead.hi))
        serve = self._serve(d, o, t.requests * o.units)
        share = o.placement.replicas
        if t.rate is None and t.concurrency is None:
            found = slo_prediction(self._slo_row(), serve, ends, t.output_len, share)
            if not found["predicted_value"]:
                return {"predicted": 0.0, "meets_slo": False}
            at = self._measure(o, serve(found["rate_per_s"]))
            at["per_chip"] = found["predicted_value"] / self.chips  # the rate's tokens
            lo, hi = found["predicted_lo"] / self.chips, found["predicted_hi"] / self.chips
            rate = found["rate_per_s"] * share
        else:
            each = (t.rate or 1e9) / share
            at = self._measure(o, serve(each))
            lo, hi = sorted(self._measure(o, serve(each, f))["per_chip"] for f in ends)
            rate = t.rate
        return {
            "rate_per_s": rate,
            "predicted": at["per_chip"],
            "predicted_lo": lo,
            "predicted_hi": hi,
            "per_user": at["per_user"],
            "ttft_s": at["ttft_s"],
            "tpot_s": at["tpot_s"],
            "preemptions": at["preemptions"],
            "meets_slo": t.meets(at["ttft_s"], at["tpot_s"]),
        }

    def search(self) -> list[dict[str, Any]]:
        """Every option screened (most promising first, by its bound), those no screened option
        beats refined: the screened frontier (`refined_edge` points of it, at most) and the
        `refined_best` best under the SLO; an option
        whose offline prediction is below the best screened under the SLO is not screened."""
        ranked = []
        for o in self.options():
            try:
                ranked.append((self.bound(o)["per_chip"], o))
            except KvjaxError:
                ranked.append((-1.0, o))
        ranked.sort(key=lambda x: -x[0])
        rows, runs, best = [], {}, 0.0
        for i, (_, o) in enumerate(ranked):
            if self.progress:
                self.progress(f"{i + 1}/{len(ranked)} {o.label}")
            r, d = self._base(o)
            if d is not None and r["bound"] <= best:
                r |= {"status": "pruned", "why": "its bound is below the best screened"}
            elif d is not None:
                r |= self.screen(o, d)
                if r["screened_meets"]:
                    best = max(best, r["screened"])
                runs[r["option"]] = (o, d)
            rows.append(r)
        live = [r for r in rows if r.get("screened_meets")]
        whole = frontier(live, "screened", "screened_per_user")
        edge = whole
        n = self.refined_edge
        if len(edge) > n:  # its ends and points between, evenly
            edge = [edge[round(i * (len(edge) - 1) / max(1, n - 1))] for i in range(n)] if n else []
        keep = {r["option"] for r in edge}
        ranked = sorted(live, key=lambda r: -r["screened"])
        keep |= {r["option"] for r in ranked[: self.refined_best]}
        on_edge = {r["option"] for r in whole}
        for r in rows:
            if r["option"] in keep:
                r |= self.refine(*runs[r["option"]])
            elif r["status"] == "predicted":
                r |= {"status": "screened", "why": _why_screened(r, on_edge, n)}
        return rows


def _why_screened(r: dict[str, Any], on_edge: set[str], points: int) -> str:
    """Why a screened option was not refined, in words."""
    if not r.get("screened_meets"):
        return "misses the SLO when screened"
    if r["option"] in on_edge:
        return f"on the screened frontier, between the {points} points refined"
    return "beaten on both axes by a screened option"


def _placement(o: Option) -> dict[str, int]:
    p = o.placement
    return {
        "tp": p.tp,
        "pp": p.pp,
        "ep": p.ep,
        "dp_attention": p.dp_attention,
        "replicas": p.replicas,
        "kv_dtype": o.kv_dtype,
        "max_batch": o.max_batch,
        "prefill": o.instances[0] if o.instances else None,
        "decode": o.instances[1] if o.instances else None,
    }


def frontier(
    rows: list[dict[str, Any]], chip_key: str = "predicted", user_key: str = "per_user"
) -> list[dict[str, Any]]:
    """The options no other beats on both output tokens/s per chip and tokens/s per user (the
    Pareto frontier), by tokens/s per user."""
    pts = [r for r in rows if r.get(chip_key) and r.get(user_key)]
    keep = [
        r
        for r in pts
        if not any(
            q[chip_key] >= r[chip_key]
            and q[user_key] >= r[user_key]
            and (q[chip_key] > r[chip_key] or q[user_key] > r[user_key])
            for q in pts
        )
    ]
    return sorted(keep, key=lambda r: r[user_key])
