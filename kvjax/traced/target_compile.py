"""Compiling for an accelerator this host does not have ("deviceless AOT").

JAX compiles for a chip it does not have from a *topology* (`kvjax.traced.targets` describes the
chips): `jax.jit(f).lower(args).compile()` with arguments placed on its compile-only devices gives
the executable that chip would run: its optimized HLO, its memory analysis, and (TPU only) its
cost analysis.

Needs the accelerator plugins pinned to jax (`pip install -e '.[targets]'`: jax-cuda12-plugin for
GPUs, libtpu for TPUs); nothing else (no CUDA driver, no TPU). On a host without a GPU driver the
CUDA plugin registers only when JAX_PLATFORMS=cpu (`kvjax.devices.default_platforms` sets it
before jax starts, when nothing else did). Without a device XLA cannot autotune: Triton tile
sizes and split-K factors are its defaults, and the choice between Triton and cuBLAS is its
heuristic's (`--xla_gpu_enable_triton_gemm=false` gives cuBLAS for every product).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from kvjax.errors import KvjaxError
from kvjax.traced.targets import GpuTarget, Target

_PLUGINS = {
    "cuda": ("jax_plugins.xla_cuda12", "jax-cuda12-plugin"),
    "tpu": ("libtpu", "libtpu"),
}


def _require_plugin(platform: str) -> None:
    from importlib import metadata

    import jax

    _, package = _PLUGINS[platform]
    try:
        metadata.version(package)
    except metadata.PackageNotFoundError:
        raise KvjaxError(
            f"compiling for a {platform.upper()} target needs the {package} package matching "
            f"jax {jax.__version__}: pip install -e '.[targets]'"
        ) from None
    if platform == "cuda":
        _start_cuda_plugin()


def _start_cuda_plugin() -> None:
    """Start the CUDA plugin that `kvjax.devices.defer_cuda_plugin` kept from starting with
    jax (its libraries log about the missing driver: kept out of sight unless it fails)."""
    import importlib
    import sys
    import tempfile

    from kvjax.devices import CUDA_KERNELS, CUDA_PLUGIN

    if not getattr(sys.modules.get(CUDA_PLUGIN), "kvjax_deferred", False):
        return
    for name in (CUDA_PLUGIN, CUDA_KERNELS):
        if getattr(sys.modules.get(name), "kvjax_deferred", False):
            del sys.modules[name]
    with tempfile.TemporaryFile() as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            importlib.import_module(CUDA_PLUGIN).initialize()
        except Exception as exc:
            os.dup2(saved, 2)
            log.seek(0)
            said = log.read().decode(errors="replace").strip().splitlines()[-3:]
            raise KvjaxError(f"the CUDA plugin did not start: {exc} {' | '.join(said)}") from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _quiet_libtpu_env() -> None:
    """libtpu reads the slice it runs on from the environment (or a TPU VM's metadata); on a
    host that is not a TPU VM it logs errors for each missing value, harmlessly. Only unset
    values are filled, and only when JAX_PLATFORMS says this process is not on a TPU."""
    if "tpu" in os.environ.get("JAX_PLATFORMS", "tpu"):
        return
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_WORKER_ID", "0")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # tests and a CLI child at once


_TOPOLOGIES: dict[str, Any] = {}


def target_devices(target: Target) -> list:
    """The compile-only devices of a target (cached per target: libtpu and the CUDA plugin
    describe a topology once)."""
    if target.name in _TOPOLOGIES:
        return _TOPOLOGIES[target.name]
    _require_plugin(target.platform)
    from jax.experimental import topologies

    spec = target.spec
    try:
        if isinstance(spec, GpuTarget):
            topo = topologies.get_topology_desc(
                platform="cuda", target_config=spec.target_config(), topology="1x1x1"
            )
        else:
            _quiet_libtpu_env()
            bounds = tuple(target.shape) + (1,) * (3 - len(target.shape))
            topo = topologies.get_topology_desc(
                topology_name=f"{spec.generation}:{'x'.join(map(str, target.shape))}",
                platform="tpu",
                chip_config_name=spec.chip_config_name,
                chips_per_host_bounds=bounds,
                num_slices=1,
            )
    except NotImplementedError as exc:
        raise KvjaxError(
            f"target {target.name}: the CUDA plugin did not register (it does only when "
            "JAX_PLATFORMS=cpu on a host without a GPU driver, set before jax starts): "
            f"{exc}"
        ) from None
    except Exception as exc:  # libtpu / the plugin refuse a topology: say which, in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise KvjaxError(f"target {target.name}: no topology: {first[:300]}") from None
    _TOPOLOGIES[target.name] = list(topo.devices)
    return _TOPOLOGIES[target.name]


def device_kind(target: Target) -> str:
    return target_devices(target)[0].device_kind


@dataclass
class TargetCompile:
    """The executable a target would run, compiled here."""

    target: Target
    device_kind: str
    text: str  # the optimized HLO module (per device for a sharded program)
    memory: dict[str, int]  # memory_analysis(): argument, output, alias, temp bytes per device
    cost: dict[str, float] | None  # XLA's cost_analysis() (None on GPU: compile-only)
    compile_seconds: float


def memory_stats(compiled) -> dict[str, int]:
    stats = compiled.memory_analysis()
    keys = (
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "alias_size_in_bytes",
        "temp_size_in_bytes",
        "generated_code_size_in_bytes",
    )
    return {k.replace("_size_in_bytes", "_bytes"): int(getattr(stats, k, 0) or 0) for k in keys}


def compile_for_target(
    fn, args: tuple, target: Target, donate_argnums=(), shardings=None, needs: str = ""
):
    """Compile `fn(*args)` (abstract args) for `target`: a `TargetCompile`.

    `shardings(devices)` returns the args' shardings (a pytree like args) for a partitioned
    program; by default every argument sits on the first device (GPU) or is replicated over the
    slice's mesh (TPU: an argument must name the TPU devices, or the compile targets this host).
    A step the chip cannot hold is refused with the compiler's own numbers (TPU), or by the
    memory analysis against the chip's memory (GPU: XLA compiles it and says nothing)."""
    import jax
    from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
    from jax.sharding import PartitionSpec as P

    devices = target_devices(target)
    if shardings is not None:
        placed = shardings(devices)
    elif target.platform == "cuda":
        placed = jax.tree.map(lambda _: SingleDeviceSharding(devices[0]), args)
    else:
        import numpy as np

        mesh = Mesh(np.array(devices).reshape(-1), ("all",))
        placed = jax.tree.map(lambda _: NamedSharding(mesh, P()), args)
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), args, placed
    )
    t0 = time.perf_counter()
    try:
        compiled = jax.jit(fn, donate_argnums=donate_argnums).lower(*abstract).compile()
    except Exception as exc:
        message = str(exc)
        if "RESOURCE_EXHAUSTED" in message or "exceeds" in message.lower():
            first = " ".join(message.split())[:600]
            what = f" ({needs})" if needs else ""
            raise KvjaxError(f"does not fit one {device_kind(target)}{what}: {first}") from None
        raise
    seconds = time.perf_counter() - t0
    cost = None
    if target.platform != "cuda":
        try:
            cost = dict(compiled.cost_analysis() or {})
        except Exception:  # a compile-only executable may have none
            cost = None
    return TargetCompile(
        target, device_kind(target), compiled.as_text(), memory_stats(compiled), cost, seconds
    )


def loaded_plugins() -> dict[str, str]:
    """Versions of the accelerator plugins installed beside jax (for environment records)."""
    from importlib import metadata

    out = {}
    for package in ("jax-cuda12-plugin", "jax-cuda12-pjrt", "libtpu"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return out


__all__ = ["TargetCompile", "compile_for_target", "target_devices"]
