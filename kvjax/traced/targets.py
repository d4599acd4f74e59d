"""The accelerators kvjax compiles for without a device ("deviceless AOT"), described as XLA
needs them: for a GPU, XLA's `GpuTargetConfigProto` (the device description that autotuning-free
compilation reads: compute capability, SM count, shared memory, L2, clocks, memory size); for a
TPU, a generation whose slice libtpu describes itself (`v5e:2x2`). `parse_target` reads a
`--target`; `kvjax.traced.target_compile` compiles for one.

The GPU descriptions are written here from facts, one row per chip: the numbers are those of
XLA's `xla/backends/gpu/target_config/specs/*.txtpb` (openxla/xla, Apache-2.0), which record
what the CUDA driver reports for each chip, cross-checked with NVIDIA's datasheets. The table's
columns are `GpuTarget`'s fields in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
        GpuTarget("h100", "h100-sxm",  "NVIDIA H100 80GB HBM3",   (9, 0),  True,  132, 128, 1.98,
                  84942979072,  3.35232e12, 52428800,  233472, 232448),
        GpuTarget("h200", "h200",      "NVIDIA H200 141GB HBM3e", (9, 0),  True,  132, 128, 1.98,
                  151397597184, 4.8e12,     52428800,  233472, 232448),
        GpuTarget("b200", "b200",      "NVIDIA B200",             (10, 0), True,  148, 128, 1.965,
                  191514411008, 7.67232e12, 132644864, 233472, 232448),
        GpuTarget("a100", "a100-80gb", "NVIDIA A100-SXM4-80GB",   (8, 0),  False, 108, 64,  1.41,
                  85100068864,  2.03904e12, 41943040,  167936, 166912, (8, 9, 4)),
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


__all__ = ["GPU_TARGETS", "TARGETS", "TPU_TARGETS", "Target", "parse_target"]
