"""The placements `kvjax calc` has, as the simulator runs them: pipeline stages with
micro-batches in flight (`--pp`) and data-parallel attention groups with their experts spread
over them (`--dp-attention D --ep D`), around a tensor-parallel step (`PlacedStepTime`).

- Pipeline, pp stages (`kvjax.analytic.pipeline`): in-flight batching keeps pp micro-batches in
  the pipeline, one a stage, so the simulator runs pp copies of the engine (each its own
  scheduler over 1/pp of the pipeline's cache), and a micro-batch's step takes the whole
  model's step (its stages one after another, each on its own devices) plus pp - 1 hops of its
  M x D activations (a device's 1/tp share) over the link. The copies run side by side: the
  steady state of balanced micro-batches, with no stage waiting on another copy's micro-batch
  (an unbalanced pipeline idles more: optimistic by that bubble). The cache: one device of the
  largest stage holds its layers' keys and values for every token in flight, beside its
  weights (the embedding and the LM head counted on every stage: conservative by the smaller).
- Data-parallel attention over D groups with expert parallelism over the same D devices (tp = 1,
  as `kvjax.analytic.parallel.Placement`): each group its own engine copy over its own cache and
  requests; its device holds E / D experts and, routing balanced, computes its own tokens' k
  routed rows among them, which is the step of the model with E / D experts (the touched
  experts agree to first order in k / E); each MoE layer adds a dispatch and a combine
  all-to-all of its M_l k rows, (D - 1) / D of them over the link. The groups step
  independently: an engine synchronizes them at every MoE layer (a group with fewer tokens
  waits), which this leaves out (optimistic by the imbalance).
"""

from __future__ import annotations

from kvjax.dtypes import DTYPE_BYTES
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec
from kvjax.model.config import ModelConfig


def _link(chip: ChipSpec, achieved: bool) -> tuple[float, float]:
    """(bytes/s, latency a message) of the chip's link: the line rate and none for a bound;
    NCCL's sourced bus bandwidth and latency for a prediction (`kvjax.predict.collectives`)."""
    from kvjax.predict.collectives import all_reduce

    line = chip.interconnect_bytes_per_s
    if not line:
        raise KvjaxError(f"chip {chip.name!r} has no interconnect bandwidth for a placement")
    if not achieved:
        return line, 0.0
    c = all_reduce(chip.name, line)
    return c.bus_bytes_per_s or line, c.latency_s


class _Around:
    """A step-time model around `inner` that adds `extra_s(tokens)` to every step."""

    def __init__(self, inner):
        self.inner = inner

    def extra_s(self, tokens: int) -> float:
        raise NotImplementedError

    def __call__(self, batch) -> float:
        return self.inner(batch) + self.extra_s(sum(s.tokens for s in batch))

    def decode_steps(self, contexts, steps: int):
        return self.inner.decode_steps(contexts, steps) + self.extra_s(len(contexts))


class Scaled:
    """Every step of `inner` taking `factor` times as long (a prediction's interval ends)."""

    def __init__(self, inner, factor: float):
        self.inner, self.factor = inner, factor

    def __call__(self, batch) -> float:
        return self.factor * self.inner(batch)

    def decode_steps(self, contexts, steps: int):
        return self.factor * self.inner.decode_steps(contexts, steps)


class PipelinedStepTime(_Around):
    """A micro-batch's step through pp stages: the whole model's step (`inner`, one tp-way
    device's shapes, all layers) and pp - 1 hops of its activations, M x D / tp a device."""

    def __init__(
        self, inner, cfg: ModelConfig, chip: ChipSpec, pp: int, tp: int = 1, achieved: bool = False
    ):
        super().__init__(inner)
        self.hops, (self.link, self.latency) = pp - 1, _link(chip, achieved)
        self.row = cfg.d_model * DTYPE_BYTES[cfg.compute_dtype] / tp

    def extra_s(self, tokens: int) -> float:
        return self.hops * (tokens * self.row / self.link + self.latency)


class ExpertParallelStepTime(_Around):
    """One attention group's step under expert parallelism over ep devices: its device's step
    (`inner`, the model with E / ep experts) and each MoE layer's dispatch and combine
    all-to-alls of its M_l k rows of D, (ep - 1) / ep of them sent."""

    def __init__(self, inner, cfg: ModelConfig, chip: ChipSpec, ep: int, achieved: bool = False):
        from kvjax.analytic.parallel import all_to_all_bytes

        super().__init__(inner)
        self.link, self.latency = _link(chip, achieved)
        self.count = 2 * cfg.num_moe_layers
        # a token's share of one all-to-all (ragged), the part that leaves the device
        self.row = (ep - 1) / ep * all_to_all_bytes(cfg, ep, 1)

    def extra_s(self, tokens: int) -> float:
        return self.count * (tokens * self.row / self.link + self.latency)


def expert_device_config(cfg: ModelConfig, ep: int) -> ModelConfig:
    """One device of ep under expert parallelism: the model with its E / ep experts (refused by
    name where ep does not divide the experts or leaves fewer than k a device)."""
    from kvjax.analytic.parallel import Placement, check_placement

    check_placement(cfg, Placement(tp=1, ep=ep, dp_attention=ep))
    if cfg.num_experts // ep < cfg.experts_per_token:
        raise KvjaxError(
            f"ep={ep} leaves {cfg.num_experts // ep} experts a device, fewer than "
            f"experts_per_token={cfg.experts_per_token}"
        )
    return cfg.replace(num_experts=cfg.num_experts // ep)


def stage_config(cfg: ModelConfig, pp: int) -> ModelConfig:
    """The largest pipeline stage as a model of its layers (what one of its devices holds)."""
    from kvjax.analytic.pipeline import stage_layers

    return cfg.replace(num_layers=max(stage_layers(cfg, pp)))


def device_configs(cfg: ModelConfig, tp: int = 1, pp: int = 1, ep: int = 1):
    """(one device's model for its step, the model whose weights and cache one device holds):
    tp-way shards, E / ep experts a device, the largest of pp stages."""
    from kvjax.analytic.parallel import device_config

    dev = device_config(cfg, tp) if tp > 1 else cfg
    if ep > 1:
        dev = expert_device_config(dev, ep)
    return dev, stage_config(dev, pp) if pp > 1 else dev


def placed_step(
    step,
    cfg: ModelConfig,
    chip: ChipSpec,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    achieved: bool = False,
):
    """A device's step (`step`, on `device_configs`' first model) with the placement's
    collectives: tp's all-reduces, pp's stage hops, ep's all-to-alls."""
    from kvjax.serving.step_time import PlacedStepTime

    if tp > 1:
        step = PlacedStepTime(step, cfg, chip, tp, achieved=achieved)
    if pp > 1:
        step = PipelinedStepTime(step, cfg, chip, pp, tp, achieved)
    if ep > 1:
        step = ExpertParallelStepTime(step, cfg, chip, ep, achieved)
    return step
