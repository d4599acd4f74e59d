"""Accelerator targets compiled for on this host, with no device present ("deviceless AOT").

JAX compiles for a chip it does not have from a *topology*: for a GPU, XLA's
`GpuTargetConfigProto` (the device description that autotuning-free compilation reads: compute
capability, SM count, shared memory, L2, clocks, memory size); for a TPU, libtpu's own description
of a slice (`v5e:2x2`). `jax.jit(f).lower(args).compile()` with arguments placed on those
compile-only devices gives the executable that chip would run: its optimized HLO, its memory
analysis, and (TPU only) its cost analysis.

Needs the accelerator plugins pinned to jax (`pip install -e '.[targets]'`: jax-cuda12-plugin for
GPUs, libtpu for TPUs); nothing else (no CUDA driver, no TPU). On a host without a GPU driver the
CUDA plugin registers only when JAX_PLATFORMS=cpu (`kvjax.devices.default_platforms` sets it
before jax starts, when nothing else did).

The GPU descriptions are written here from facts, one row per chip: the numbers are those of
XLA's `xla/backends/gpu/target_config/specs/*.txtpb` (openxla/xla, Apache-2.0), which record
what the CUDA driver reports for each chip, cross-checked with NVIDIA's datasheets. Without a
device XLA cannot autotune: Triton tile sizes and split-K factors are its defaults, and the
choice between Triton and cuBLAS is its heuristic's (`--xla_gpu_enable_triton_gemm=false` gives
cuBLAS for every product).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from kvjax.errors import KvjaxError, unknown_name_error


@dataclass(frozen=True)
class GpuTarget:
    """One NVIDIA GPU, as XLA's device description states it."""

    name: str
    chip: str  # the kvjax.hardware preset of the same chip
    device_name: str  # what the CUDA driver calls it (== the compiled devices' device_kind)
    compute_capability: tuple[int, int]
    accelerated: bool  # sm_90a / sm_100a: the architecture-specific feature set (wgmma, TMA)
    core_count: int  # streaming multiprocessors
    fpus_per_core: int
    clock_ghz: float
    memory_bytes: int  # as the driver reports it (a little under the marketed GB)
    bandwidth_bytes_per_s: float
    l2_bytes: int
    shared_memory_per_core: int
    shared_memory_per_block_optin: int
    dnn_version: tuple[int, int, int] = (9, 10, 0)
    source: str = "XLA target config xla/backends/gpu/target_config/specs (openxla/xla)"
    platform: str = field(default="cuda", init=False)

    def target_config(self) -> str:
        """The `stream_executor.GpuTargetConfigProto` text XLA:GPU compiles against."""
        major, minor = self.compute_capability
        ext = "ACCELERATED_FEATURES" if self.accelerated else "NONE"
        info = {
            "threads_per_block_limit": 1024,
            "threads_per_warp": 32,
            "shared_memory_per_block": 49152,
            "shared_memory_per_core": self.shared_memory_per_core,
            "threads_per_core_limit": 2048,
            "core_count": self.core_count,
            "fpus_per_core": self.fpus_per_core,
            "block_dim_limit_x": 2147483647,
            "block_dim_limit_y": 65535,
            "block_dim_limit_z": 65535,
            "memory_bandwidth": int(self.bandwidth_bytes_per_s),
            "l2_cache_size": self.l2_bytes,
            "clock_rate_ghz": self.clock_ghz,
            "device_memory_size": self.memory_bytes,
            "shared_memory_per_block_optin": self.shared_memory_per_block_optin,
        }
        lines = ["gpu_device_info {"]
        lines += [f"  {key}: {value}" for key, value in info.items()]
        lines += [
            f"  cuda_compute_capability {{ major: {major} minor: {minor} "
            f"feature_extension: {ext} }}",
            "  registers_per_core_limit: 65536",
            "  registers_per_block_limit: 65536",
            "  thread_dim_limit_x: 1024",
            "  thread_dim_limit_y: 1024",
            "  thread_dim_limit_z: 64",
            f'  name: "{self.device_name}"',
            "}",
            'platform_name: "CUDA"',
            "dnn_version_info {{ major: {} minor: {} patch: {} }}".format(*self.dnn_version),
            f'device_description_str: "{self.device_name}"',
        ]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class TpuTarget:
    """One TPU generation; a slice of it is `generation:shape` (`v5e:2x2`)."""

    name: str
    chip: str
    generation: str  # libtpu's topology prefix
    chip_config_name: str  # "default" (one TensorCore a chip) or "megacore" (two, one device)
    dims: int  # 2 for v5e/v6e (2D torus), 3 for v4/v5p
    source: str = "libtpu topology descriptions (jax.experimental.topologies)"
    platform: str = field(default="tpu", init=False)


GPU_TARGETS = {
    t.name: t
    for t in (
        GpuTarget("h100", "h100-sxm", "NVIDIA H100 80GB HBM3", (9, 0), True, 132, 128, 1.98,
                  84942979072, 3.35232e12, 52428800, 233472, 232448),
        GpuTarget("h200", "h200", "NVIDIA H200 141GB HBM3e", (9, 0), True, 132, 128, 1.98,
                  151397597184, 4.8e12, 52428800, 233472, 232448),
        GpuTarget("b200", "b200", "NVIDIA B200", (10, 0), True, 148, 128, 1.965,
                  191514411008, 7.67232e12, 132644864, 233472, 232448),
        GpuTarget("a100", "a100-80gb", "NVIDIA A100-SXM4-80GB", (8, 0), False, 108, 64, 1.41,
                  85100068864, 2.03904e12, 41943040, 167936, 166912, (8, 9, 4)),
    )
}  # fmt: skip
TPU_TARGETS = {
    t.name: t
    for t in (
        TpuTarget("tpu-v5e", "tpu-v5e", "v5e", "default", 2),
        TpuTarget("tpu-v6e", "tpu-v6e", "v6e", "default", 2),
        TpuTarget("tpu-v5p", "tpu-v5p", "v5p", "megacore", 3),
        TpuTarget("tpu-v4", "tpu-v4", "v4", "megacore", 3),
    )
}
TARGETS: dict[str, GpuTarget | TpuTarget] = {**GPU_TARGETS, **TPU_TARGETS}


@dataclass(frozen=True)
class Target:
    """A parsed `--target`: the chip and, for a TPU, the slice's shape (chips per axis)."""

    spec: GpuTarget | TpuTarget
    shape: tuple[int, ...]

    @property
    def name(self) -> str:
        if self.spec.platform == "cuda":
            return self.spec.name
        return f"{self.spec.name}:{'x'.join(map(str, self.shape))}"

    @property
    def num_devices(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def platform(self) -> str:
        return self.spec.platform


def parse_target(text: str) -> Target:
    """`h100`, `tpu-v5e`, `tpu-v5e:2x2`, `tpu-v5p:2x2x1`: a named error for anything else."""
    name, _, shape_text = str(text).strip().lower().partition(":")
    if name not in TARGETS:
        raise unknown_name_error("target", name, TARGETS)
    spec = TARGETS[name]
    if spec.platform == "cuda":
        if shape_text and shape_text not in ("1", "1x1", "1x1x1"):
            raise KvjaxError(
                f"target={text!r}: a GPU target compiles for one device; drop ':{shape_text}'"
            )
        return Target(spec, (1,))
    if not shape_text:
        return Target(spec, (1,) * spec.dims)
    try:
        shape = tuple(int(d) for d in shape_text.split("x"))
    except ValueError:
        shape = ()
    if len(shape) != spec.dims or any(d < 1 for d in shape):
        example = "x".join(["2"] * 2 + ["1"] * (spec.dims - 2))
        raise KvjaxError(
            f"target={text!r}: a {spec.generation} slice is {spec.dims} positive integers "
            f"joined by 'x' (e.g. {spec.name}:{example})"
        )
    return Target(spec, shape)


# ---------------------------------------------------------------------------------------------
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
    keys = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes", "generated_code_size_in_bytes")  # fmt: skip
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


__all__ = ["GPU_TARGETS", "TARGETS", "TPU_TARGETS", "Target", "TargetCompile",
           "compile_for_target", "parse_target", "target_devices"]  # fmt: skip
