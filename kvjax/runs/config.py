"""Experiment configs: YAML files validated into typed dataclasses (OmegaConf structured configs),
`key=value` overrides, and a `sweep:` block of lists expanded into a grid of points.

Every error is one line naming the file and the key: `configs/x.yaml: model.num_kv_head: unknown
key (allowed: preset, num_kv_heads, ...)`.
"""

from __future__ import annotations

import dataclasses
import itertools
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kvjax.analytic import Workload, parallel
from kvjax.devices import batch_per_replica
from kvjax.dtypes import canonical_dtype
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec, get_chip
from kvjax.model.config import ModelConfig, get_model_config


def _model_section():
    """`model:` of a config: a preset and, derived from `ModelConfig`, every one of its fields as
    an optional override (None: the preset's value). `name` labels a modified preset in records
    and figures."""
    hints = typing.get_type_hints(ModelConfig)
    overrides = [
        (f.name, hints[f.name] | None, field(default=None)) for f in dataclasses.fields(ModelConfig)
    ]
    return dataclasses.make_dataclass(
        "ModelSection", [("preset", str, field(default="seed-70b")), *overrides]
    )


ModelSection = _model_section()


@dataclass
class WorkloadSection:
    phase: str = "decode"
    batch: int = 1
    context: int = 8192
    tp: int = 1  # tensor-parallel devices (experiments that model it: TENSOR_PARALLEL = True)
    dp: int = 1  # data-parallel replicas
    # DeepSeek-style placements (kvjax.analytic.parallel.Placement): tp x dp_attention devices,
    # the routed experts over ep = dp_attention of them
    ep: int = 1
    dp_attention: int = 1


@dataclass
class ChipSection:
    preset: str = "h100-sxm"
    peak_flops_per_s: float | None = None
    bandwidth_bytes_per_s: float | None = None


@dataclass
class ExperimentConfig:
    experiment: str = MISSING
    name: str | None = None  # the run folder's experiment name (default: `experiment`)
    model: ModelSection = field(default_factory=ModelSection)
    workload: WorkloadSection = field(default_factory=WorkloadSection)
    chip: ChipSection = field(default_factory=ChipSection)
    sweep: dict[str, list[Any]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # experiment-specific settings


def _fields(cls) -> str:
    return ", ".join(f.name for f in dataclasses.fields(cls))


def _error(source: str, exc: OmegaConfBaseException) -> KvjaxError:
    key = getattr(exc, "full_key", None) or "?"
    msg = str(exc).splitlines()[0]
    if "not in" in msg or "Key '" in msg and "not" in msg:
        section = key.rsplit(".", 1)[0] if "." in key else ""
        cls = {"model": ModelSection, "workload": WorkloadSection, "chip": ChipSection}.get(
            section, ExperimentConfig
        )
        return KvjaxError(f"{source}: {key}: unknown key (allowed: {_fields(cls)})")
    return KvjaxError(f"{source}: {key}: {msg}")


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The file merged over the schema, then the `key=value` overrides; validated."""
    path = Path(path)
    source = str(path)
    raw = _read_yaml(path, source)
    schema = OmegaConf.structured(ExperimentConfig)
    try:
        cfg = OmegaConf.merge(schema, OmegaConf.create(raw))
    except OmegaConfBaseException as exc:
        raise _error(source, exc) from None
    cfg = _apply_overrides(cfg, overrides, source)
    _check_experiment_and_sweep(cfg, source)
    _canonical_dtypes(cfg, source)
    # every point must build a valid model / workload / chip: checked before anything runs
    for point in expand(cfg):
        try:
            resolve(point)
        except KvjaxError as exc:
            raise KvjaxError(f"{source}: {exc}") from None
    return cfg


_SWEEP_HINT = " (a sweep maps keys to lists: 'model.num_kv_heads: [1, 8]')"


def _read_yaml(path: Path, source: str) -> dict:
    """The file's mapping of sections, each section a mapping; a named error for anything else."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise KvjaxError(f"{source}: is not text (a UTF-8 YAML file expected)") from None
    except OSError as exc:
        raise KvjaxError(f"{source}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise KvjaxError(
            f"{source}: malformed YAML{where}: {getattr(exc, 'problem', exc)}"
        ) from None
    if not isinstance(raw, dict):
        raise KvjaxError(f"{source}: must hold a mapping of keys (experiment:, model:, ...)")
    for section in ("model", "workload", "chip", "sweep", "options"):
        if section in raw and not isinstance(raw[section], dict):
            got = type(raw[section]).__name__
            hint = _SWEEP_HINT if section == "sweep" else ""
            raise KvjaxError(f"{source}: {section}: must be a mapping of keys, got {got}{hint}")
    return raw


def _apply_overrides(cfg: DictConfig, overrides, source: str) -> DictConfig:
    """Each `key=value` (a YAML value) merged in turn, a `sweep.<key>=[...]` replacing that
    sweep; refused: a whole section, and a key that a sweep would replace."""
    for item in overrides:
        if "=" not in item:
            raise KvjaxError(f"override {item!r} must be key=value (e.g. model.num_kv_heads=4)")
        key, value = (part.strip() for part in item.split("=", 1))
        if key in ("sweep", "model", "workload", "chip", "options"):
            raise KvjaxError(
                f"{source}: override {item!r} replaces a whole section; override one key "
                f"(e.g. {key}.<key>=...; a sweep list: sweep.model.num_kv_heads=[1,8])"
            )
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise KvjaxError(
                f"{source}: override {item!r}: malformed value ({getattr(exc, 'problem', exc)})"
            ) from None
        if key.startswith("sweep."):  # sweep keys hold dots themselves: sweep.workload.tp=[1,2]
            if not isinstance(parsed, list):
                raise KvjaxError(f"{source}: override {item!r}: a sweep takes a list, e.g. [1, 2]")
            cfg.sweep[key[len("sweep.") :]] = parsed
            continue
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([item]))
        except OmegaConfBaseException as exc:
            raise _error(f"{source} (override {item!r})", exc) from None
        if key == "model.preset" and not any(o.startswith("model.name=") for o in overrides):
            cfg.model.name = None  # the file's label named its preset, not this one
    for item in overrides:  # a swept key would be replaced by the sweep: never silently
        key = item.split("=", 1)[0].strip()
        if not key.startswith("sweep.") and key in cfg.sweep:
            raise KvjaxError(
                f"{source}: override {item!r} would be replaced by sweep.{key}; override the "
                f"sweep instead: 'sweep.{key}=[{item.split('=', 1)[1]}]'"
            )
    return cfg


def _check_experiment_and_sweep(cfg: DictConfig, source: str) -> None:
    """An experiment named, and every sweep a non-empty list of values its key takes."""
    if OmegaConf.is_missing(cfg, "experiment"):
        raise KvjaxError(f"{source}: experiment: missing (name an experiment in experiments/)")
    for key in cfg.sweep:
        if not OmegaConf.is_list(cfg.sweep[key]) or len(cfg.sweep[key]) == 0:
            raise KvjaxError(f"{source}: sweep.{key}: must be a non-empty list")
        try:
            OmegaConf.update(OmegaConf.structured(ExperimentConfig), key, cfg.sweep[key][0])
        except OmegaConfBaseException as exc:
            raise _error(f"{source} (sweep.{key})", exc) from None


# The model's dtype fields (True: the packed 4/2-bit KV dtypes allowed too).
_DTYPE_FIELDS = {"weight_dtype": False, "kv_dtype": True, "state_dtype": False}


def _canonical_dtypes(cfg: DictConfig, source: str) -> None:
    """The model's dtypes, given or swept, stored by their canonical names ('fp16' -> 'f16'):
    the run's config, its point keys and records read alike however the file spelled them."""
    for name, packed in _DTYPE_FIELDS.items():
        if cfg.model[name] is not None:
            cfg.model[name] = canonical_dtype(cfg.model[name], f"{source}: model.{name}", packed)
        key = f"model.{name}"
        if key in cfg.sweep:
            swept = f"{source}: sweep.{key}"
            cfg.sweep[key] = [canonical_dtype(v, swept, packed) for v in cfg.sweep[key]]


def expand(cfg: DictConfig) -> list[DictConfig]:
    """The grid of points: the product of the sweep lists, each applied over the config."""
    keys = list(cfg.sweep)
    points = []
    for values in itertools.product(*(list(cfg.sweep[k]) for k in keys)) if keys else [()]:
        point = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "sweep"])
        point = OmegaConf.merge(OmegaConf.structured(ExperimentConfig), point)
        for k, v in zip(keys, values, strict=True):
            OmegaConf.update(point, k, v)
        points.append(point)
    return points


def point_key(cfg: DictConfig, point: DictConfig) -> str:
    """A stable name for one point: its sweep values, `model.num_kv_heads=8,workload.batch=1`."""
    if not cfg.sweep:
        return "point"
    return ",".join(f"{k}={OmegaConf.select(point, k)}" for k in sorted(cfg.sweep))


def resolve(point: DictConfig) -> tuple[ModelConfig, Workload, ChipSpec]:
    m = point.model
    changes = {
        f.name: m[f.name]
        for f in dataclasses.fields(ModelSection)
        if f.name not in ("preset", "name") and m[f.name] is not None
    }
    cfg = get_model_config(m.preset, **changes)
    if m.name:
        cfg = cfg.replace(name=m.name)
    wl = Workload(point.workload.phase, point.workload.batch, point.workload.context)
    tp, dp = point.workload.tp, point.workload.dp
    ep, dp_attention = point.workload.ep, point.workload.dp_attention
    if tp != 1 or dp != 1:
        try:
            parallel.device_config(cfg, tp)
        except KvjaxError as exc:
            raise KvjaxError(f"workload.tp: {exc}") from None
        batch_per_replica(wl.batch, dp, ("workload.batch", "workload.dp"))
    if ep != 1 or dp_attention != 1:
        try:
            parallel.check_placement(cfg, parallel.Placement(tp, ep, dp_attention))
        except KvjaxError as exc:
            raise KvjaxError(f"workload.ep / workload.dp_attention: {exc}") from None
    chip = get_chip(point.chip.preset).with_overrides(
        point.chip.peak_flops_per_s, point.chip.bandwidth_bytes_per_s, dtype="bf16"
    )
    return cfg, wl, chip


def to_dict(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
