"""Devices of a sharded program, without jax: how a batch splits over data-parallel replicas,
and simulated CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count, read once when jax
starts, so it is set before the first `import jax` or in a child process's environment).
"""

from __future__ import annotations

import os
import sys

from kvjax.errors import KvjaxError

FLAG = "--xla_force_host_platform_device_count"


def with_host_devices(xla_flags: str, n: int) -> str:
    """`xla_flags` asking for `n` CPU devices, unless it already names a count."""
    return xla_flags if FLAG in xla_flags else f"{xla_flags} {FLAG}={n}".strip()


def request_host_devices(n: int, env=None) -> None:
    """Ask XLA:CPU for `n` devices in `env` (default: this process, only before jax starts;
    otherwise `kvjax.nn.sharding.make_mesh` says how many it sees and what to set)."""
    if env is None:
        if "jax" in sys.modules:
            return
        env = os.environ
    if n > 1:
        env["XLA_FLAGS"] = with_host_devices(env.get("XLA_FLAGS", ""), n)


def _accelerator_present() -> bool:
    """A GPU driver or TPU device node on this host (Linux), read without starting jax."""
    nodes = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd", "/dev/accel0")
    if any(os.path.exists(p) for p in nodes):
        return True
    vfio = "/dev/vfio"  # TPU VMs of v5e and later expose their chips through VFIO
    return os.path.isdir(vfio) and any(n.isdigit() for n in os.listdir(vfio))


def default_platforms(env=None) -> None:
    """On a host with no accelerator, JAX_PLATFORMS=cpu unless something already chose.

    With the accelerator plugins installed (the `targets` extra, for deviceless compiles), jax
    would probe CUDA at start and fail on a host without a driver: the CUDA plugin then does not
    register, and its topology (kvjax.traced.target_compile) is unavailable. Only the environment is
    touched, and only before jax starts (afterwards it is read already)."""
    env = os.environ if env is None else env
    if "jax" in sys.modules:
        return
    if "JAX_PLATFORMS" not in env and not _accelerator_present():
        env["JAX_PLATFORMS"] = "cpu"
    platforms = env.get("JAX_PLATFORMS", "")
    if env is os.environ and platforms and not {"cuda", "gpu"} & set(platforms.split(",")):
        defer_cuda_plugin()  # CUDA is not among the platforms asked for: not loaded at start


CUDA_PLUGIN = "jax_plugins.xla_cuda12"  # what jax's plugin discovery starts
CUDA_KERNELS = "jax_cuda12_plugin"  # its libraries, which jaxlib loads when it is imported


def defer_cuda_plugin() -> None:
    """Keep jax from loading the CUDA plugin when it starts: on a host with no GPU driver its
    libraries log about the missing driver on every run, into every command's stderr.
    `kvjax.traced.target_compile` starts it when a GPU target is compiled for. Only before jax
    starts, on a host with no accelerator, and only when the plugin is installed."""
    import importlib.util
    import types

    if CUDA_PLUGIN in sys.modules or "jax" in sys.modules:
        return
    if importlib.util.find_spec(CUDA_KERNELS) is None:
        return
    for name in (CUDA_PLUGIN, CUDA_KERNELS):
        deferred = types.ModuleType(name, "kvjax: the CUDA plugin, started on demand")
        deferred.initialize = lambda: None  # jax's plugin discovery calls this
        deferred.kvjax_deferred = True
        sys.modules[name] = deferred


def batch_per_replica(batch: int, dp: int, names: tuple[str, str] = ("batch", "dp")) -> int:
    """B / dp sequences per data-parallel replica: the one check that dp divides the batch, its
    message naming the two fields as the caller spells them (`--batch`, `workload.dp`)."""
    if isinstance(dp, bool) or not isinstance(dp, int) or dp <= 0:
        raise KvjaxError(f"{names[1]}={dp!r} must be a positive integer")
    if batch % dp:
        raise KvjaxError(f"{names[0]}={batch} is not divisible by {names[1]}={dp} (the data axis)")
    return batch // dp
